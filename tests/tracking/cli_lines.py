"""Running the CLI in-process and checking its one-line refusals, for the hostile-input tests.

Imported as `cli_lines` (pytest puts this folder on sys.path; tests/ has no __init__.py)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from rlvr.cli import main


def cli(argv: list[str], capsys) -> tuple[int, str]:
    """(exit code, stderr) of `rlvr ARGV`; no traceback anywhere."""
    capsys.readouterr()
    code = main(argv)
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, err


def one_line(code: int, err: str, *fragments: str) -> None:
    """Exit 2 with one `error: ...` line on stderr holding every fragment."""
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    for fragment in fragments:
        assert fragment in err, err


def snapshot(folder: Path) -> dict[str, str]:
    """sha256 of every file under `folder` (links listed by their target, not followed)."""
    out = {}
    for p in sorted(folder.rglob("*")):
        if p.is_symlink():
            out[str(p.relative_to(folder))] = "-> " + os.readlink(p)
        elif p.is_file():
            out[str(p.relative_to(folder))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out
