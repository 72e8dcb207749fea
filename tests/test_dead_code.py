"""No dead code in the package: vulture (pinned in the `dev` extra) finds nothing in src/rlvr that
neither the package, the benchmarks nor the examples use, beyond what `dead_code_whitelist.txt`
lists (names used where vulture cannot see: module hooks, `forward`, registries named by string,
config sections, documented public API). Tests do not count as users: code only they call is dead.

The same findings from the command line (whitelist not applied):
`vulture src/rlvr bench examples --min-confidence 60`.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import vulture  # the dev extra pins it

REPO = Path(__file__).resolve().parent.parent
USERS = ["src/rlvr", "bench", "examples"]  # what counts as using a name
CHECKED = "src/rlvr"  # where an unused name is reported
WHITELIST = Path(__file__).with_name("dead_code_whitelist.txt")
MIN_CONFIDENCE = 60  # vulture's level for unused functions, classes, methods, attributes and variables


def whitelist(text: str) -> set[tuple[str, str]]:
    """(path, name) pairs from lines `path: name, name  # why`; blank and `#` lines skipped."""
    pairs = set()
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"([\w./-]+\.py):\s*([\w\s,]+)", line)
        assert match, f"{WHITELIST.name}:{number}: expected 'path: name, name  # why', got {line!r}"
        pairs |= {(match[1], name.strip()) for name in match[2].split(",") if name.strip()}
    return pairs


def findings(paths: list[Path]) -> list[tuple[str, str, str]]:
    """(path relative to the repo, name, vulture's message with line) for each unused name under CHECKED."""
    scanner = vulture.Vulture()
    scanner.scavenge([str(p) for p in paths])
    out = []
    for item in scanner.get_unused_code(min_confidence=MIN_CONFIDENCE):
        path = Path(item.filename).resolve().relative_to(REPO).as_posix()
        if path.startswith(CHECKED + "/"):
            out.append((path, item.name, f"{path}:{item.first_lineno}: {item.message} ({item.confidence}%)"))
    return out


def test_nothing_in_the_package_is_unused():
    allowed = whitelist(WHITELIST.read_text())
    found = findings([REPO / p for p in USERS])
    dead = [message for path, name, message in found if (path, name) not in allowed]
    assert not dead, ("unused code (delete it, with any test that only exercises it; or, if it is used where "
                      f"vulture cannot see, add 'path: name  # why' to tests/{WHITELIST.name}):\n  "
                      + "\n  ".join(dead))
    stale = sorted(allowed - {(path, name) for path, name, _ in found})
    assert not stale, f"tests/{WHITELIST.name} lists names vulture no longer reports; remove them: {stale}"


def test_a_function_nothing_calls_is_found(tmp_path):
    package = tmp_path / "src" / "rlvr"
    package.mkdir(parents=True)
    (package / "mod.py").write_text("def used():\n    return 1\n\n\ndef unused():\n    return 2\n\n\nused()\n")
    scanner = vulture.Vulture()
    scanner.scavenge([str(package)])
    assert [(i.name, i.typ, i.first_lineno) for i in scanner.get_unused_code(min_confidence=MIN_CONFIDENCE)] == [
        ("unused", "function", 5)]


def test_the_whitelist_format():
    assert whitelist("# a comment\n\nsrc/rlvr/a.py: f, g  # why\nsrc/rlvr/b/c.py: h\n") == {
        ("src/rlvr/a.py", "f"), ("src/rlvr/a.py", "g"), ("src/rlvr/b/c.py", "h")}
    with pytest.raises(AssertionError, match="expected 'path: name"):
        whitelist("src/rlvr/a.py f\n")
