"""The docs describe the project as it is.

Every text file under src, tests, recipes, bench, docs and examples, and README.md, is scanned for
labels of development history (numbered sessions and rounds, issue numbers, "the previous code")
and for pointers to files that are not in the repository (design notes, research notes, machine-local
paths). Every relative link in the markdown files must point at a file that exists (and at a heading of it,
when it names one), every `docs/results.md §N` reference at a section of docs/results/ and every
`docs/results/AREA.md §N` at a section of that file; the docs stay short.
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
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")), *sorted((REPO / "bench").glob("*.md"))]


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


def _results_sections() -> dict[str, str]:
    """Section number -> the docs/results/ file (stem) that holds it; numbers are unique across files."""
    sections: dict[str, str] = {}
    for path in sorted((REPO / "docs" / "results").glob("*.md")):
        for number in re.findall(r"^#{2,3} (\d+[a-z]?)\.", path.read_text(encoding="utf-8"), flags=re.MULTILINE):
            assert number not in sections, f"§{number} is in both results/{sections[number]}.md and {path.name}"
            sections[number] = path.stem
    return sections


SECTION_REF = re.compile(r"results(?:/([\w-]+))?\.md,? §(\d+[a-z]?)")
BARE_REF = re.compile(r"(?<![\w.])§(\d+[a-z]?)")


def test_results_section_references_exist():
    sections = _results_sections()
    assert {"1", "2", "3", "4", "5"} <= set(sections)
    missing = []
    for path in _text_files():
        # README and docs point into docs/results/ with a bare § as well
        bare = path.suffix == ".md" and path.name != "papers.md"
        for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            bare_refs = BARE_REF.findall(SECTION_REF.sub("", line)) if bare else []
            refs = SECTION_REF.findall(line) + [("", r) for r in bare_refs]
            missing += [f"{path.relative_to(REPO)}:{n}: {area + '.md ' if area else ''}§{r}" for area, r in refs
                        if r not in sections or area and sections[r] != area]
    assert not missing, "references to sections docs/results/ does not have:\n" + "\n".join(missing)


def test_the_results_index_links_every_section():
    index = (REPO / "docs" / "results.md").read_text(encoding="utf-8")
    listed = dict(re.findall(r"\[§(\d+[a-z]?)\]\(results/([\w-]+)\.md#", index))
    assert listed == _results_sections()


def test_docs_are_short():
    limits = {REPO / "README.md": 200, **{p: 300 for p in (REPO / "docs" / "results").glob("*.md")},
              REPO / "docs" / "results.md": 130}  # the index: one line a section
    long = [f"{p.relative_to(REPO)}: {n} lines" for p, limit in limits.items()
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > limit]
    assert not long, "over the length limit:\n" + "\n".join(long)


def _github_anchor(heading: str) -> str:
    """The id GitHub gives a heading: lower case, punctuation dropped, each space a hyphen."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    headings = re.findall(r"^#{1,6} (.+)$", path.read_text(encoding="utf-8"), flags=re.MULTILINE)
    return {_github_anchor(h) for h in headings}


def test_anchor_links_in_markdown_point_at_headings():
    broken = []
    for path in _markdown_files():
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for target in LINK.findall(line):
                file, _, anchor = target.partition("#")
                if not anchor or re.match(r"[a-z][a-z0-9+.-]*:", target):
                    continue  # no heading named, or a URL
                page = (path.parent / file).resolve() if file else path
                if page.suffix == ".md" and page.exists() and anchor not in _anchors(page):
                    broken.append(f"{path.relative_to(REPO)}:{n}: {target}")
    assert not broken, "links to headings that do not exist (a renamed heading?):\n" + "\n".join(broken)
