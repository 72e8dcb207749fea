"""The docs describe the project as it is.

Every text file under src, tests, recipes, bench, docs and examples, and README.md, is scanned for
labels of development history (numbered sessions and rounds, issue numbers, "the previous code")
and for pointers to files that are not in the repository (design notes, research notes, machine-local
paths). Every relative link in the markdown files must point at a file that exists, and every
`docs/results.md §N` reference at a section that exists.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ROOTS = ["src", "tests", "recipes", "bench", "docs", "examples"]
TEXT = {".py", ".md", ".yaml", ".yml", ".toml", ".txt", ".json", ".cfg", ".ini", ".sh", ".cpp", ".h", ".html"}
SKIP_DIRS = {"__pycache__", ".pytest_cache", ".ruff_cache"}
THIS = Path(__file__).resolve()

HISTORY = [
    (r"\b[Ss]essions? ?-?\d", "a numbered work session"),
    (r"\b(this|last|next|previous|earlier|later) session\b", "a work session"),
    (r"\bsession note", "a work session's notes"),
    (r"\b[Rr]ounds? \d", "a numbered round of work"),
    (r"\b(second|third|fourth|fifth|sixth) round of\b", "a round of work"),
    (r"\b[Ii]ssues? #?\d", "an issue number"),
    (r"\bPR #?\d", "a pull-request number"),
    (r"(?<![\w&#/])(?<!\]\()#\d{1,5}\b", "an issue or PR reference"),  # not a link to a heading: [1. ...](#1-...)
    (r"\b(the )?(previous|old|earlier) (code|default|defaults|recipe|asset)\b", "earlier code"),
    (r"\bthe issue's\b", "the project issue"),
    (r"\bhelpers?'s? (jobs?|runs?|builds?)\b", "a helper's work"),
    (r"_s\d+\.png\b", "a session-labelled image"),
]
OUTSIDE = [
    (r"\bDESIGN(\.md)?\b", "a design note outside the repo"),
    (r"\bSTYLE §", "a style note outside the repo"),
    (r"\banchors(-[\w-]+\.md|\.md| §)", "a research note outside the repo"),
    (r"\bresearch/", "a research folder outside the repo"),
    (r"\.\./shared\b", "a folder outside the repo"),
    (r"/work/", "a machine-local path"),
    (r"/tmp/exp\d", "a machine-local scratch file"),
    (r"/home/\w+/", "a machine-local path"),
]
PATTERNS = [(re.compile(p), why) for p, why in HISTORY + OUTSIDE]


def _text_files():
    files = [REPO / "README.md"]
    for root in ROOTS:
        for path in sorted((REPO / root).rglob("*")):
            if path.is_file() and path.suffix in TEXT and not SKIP_DIRS & set(path.parts):
                files.append(path)
    return [f for f in files if f.resolve() != THIS]


def _markdown_files():
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "bench").glob("*.md"))]


def test_no_history_labels_or_pointers_outside_the_repo():
    hits = []
    for path in _text_files():
        for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            for pattern, why in PATTERNS:
                m = pattern.search(line)
                if m:
                    hits.append(f"{path.relative_to(REPO)}:{n}: {why}: {m.group(0)!r} in {line.strip()[:120]!r}")
    assert not hits, "history labels or pointers outside the repo:\n" + "\n".join(hits)


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def test_relative_links_in_markdown_point_at_files_in_the_repo():
    broken = []
    for path in _markdown_files():
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for target in LINK.findall(line):
                if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                    continue  # a URL or an anchor in the same page
                file = (path.parent / target.split("#", 1)[0]).resolve()
                if not file.exists() or REPO not in file.parents:
                    broken.append(f"{path.relative_to(REPO)}:{n}: {target}")
    assert not broken, "relative links to files that do not exist:\n" + "\n".join(broken)


def _results_sections():
    text = (REPO / "docs" / "results.md").read_text(encoding="utf-8")
    return set(re.findall(r"^#{2,3} (\d+[a-z]?)\.", text, flags=re.MULTILINE))


SECTION_REF = re.compile(r"results\.md,? §(\d+[a-z]?)")
BARE_REF = re.compile(r"(?<![\w.])§(\d+[a-z]?)")


def test_results_section_references_exist():
    sections = _results_sections()
    assert {"1", "2", "3", "4", "5"} <= sections
    missing = []
    for path in _text_files():
        # README and docs point into docs/results.md with a bare § as well
        bare = path.suffix == ".md" and path.name != "papers.md"
        for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            refs = SECTION_REF.findall(line) + (BARE_REF.findall(line) if bare else [])
            missing += [f"{path.relative_to(REPO)}:{n}: §{r}" for r in refs if r not in sections]
    assert not missing, "references to sections docs/results.md does not have:\n" + "\n".join(missing)


def _github_anchor(heading: str) -> str:
    """The id GitHub gives a heading: lower case, punctuation dropped, each space a hyphen."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_anchor_links_in_markdown_point_at_headings_of_the_same_page():
    broken = []
    for path in _markdown_files():
        text = path.read_text(encoding="utf-8")
        anchors = {_github_anchor(h) for h in re.findall(r"^#{1,6} (.+)$", text, flags=re.MULTILINE)}
        for n, line in enumerate(text.splitlines(), 1):
            broken += [f"{path.relative_to(REPO)}:{n}: {t}" for t in LINK.findall(line)
                       if t.startswith("#") and t[1:] not in anchors]
    assert not broken, "links to headings that do not exist (a renamed heading?):\n" + "\n".join(broken)
