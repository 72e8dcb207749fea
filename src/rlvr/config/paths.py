"""Config fields that name files or folders, read as a user means them.

- A leading `~` is the home folder, as in a shell (`~/data/train.jsonl`); a recipe is not run
  through a shell, so without this it would become a folder literally named `~`.
- `$VAR` and `${VAR}` are refused: expanding the environment would make a recipe mean different
  things on different machines and hide that in the run's config. An override on the command line
  (`trainer.out_dir=$SCRATCH/runs`) is expanded by the shell before rlvr sees it.
- `trainer.name` is one run folder inside `trainer.out_dir` (subfolders allowed): an absolute
  path, `.` or `..` would write the run outside `out_dir` or into it.
- A relative data or model path in a recipe file is read beside the recipe when it is there
  (`recipe_relative`), so a recipe and its data move together and a packaged recipe runs from any
  folder; one that is not there stays as written (beside the current folder). `trainer.out_dir`
  stays relative to the current folder: runs go where the user runs.
"""

from __future__ import annotations

import os
import re
from pathlib import Path, PurePosixPath

from rlvr.errors import ConfigError

__all__ = ["PATH_LEAVES", "is_path_field", "path_value", "recipe_relative"]

PATH_LEAVES = ("path", "teacher_path", "heldout_path", "out_dir", "fn")
"""Last parts of the dotted keys whose value is a path (`reward.fn` is `file.py:name`)."""
_VARIABLE = re.compile(r"\$(\{[^}]*\}|[A-Za-z_][A-Za-z0-9_]*)")


def is_path_field(full: str) -> bool:
    return full.rsplit(".", 1)[-1] in PATH_LEAVES or full == "trainer.name"


def path_value(full: str, value: str) -> str:
    """`value` of the path field `full`: `~` expanded, variables refused, a run name kept inside."""
    if (found := _VARIABLE.search(value)) is not None:
        raise ConfigError(f"{full}: {value!r} holds the environment variable {found.group(0)}, which rlvr does not "
                          f"expand in a config; write the path itself, or pass it on the command line "
                          f"({full}=\"{found.group(0)}/...\", which the shell expands)")
    if value.startswith("~"):
        value = os.path.expanduser(value)
    if full == "trainer.name" and value:
        parts = PurePosixPath(value.replace("\\", "/")).parts
        if value.startswith(("/", "~")) or not parts or ".." in parts or all(p == "." for p in parts):
            raise ConfigError(f"{full}: {value!r} is not a folder name inside trainer.out_dir (it would write the "
                              f"run outside it, or into it); use a name such as my_run, and trainer.out_dir to "
                              f"choose where runs go")
    return value


RECIPE_RELATIVE = ("path", "teacher_path", "heldout_path")
"""Last parts of the keys whose relative value a recipe file means beside itself."""


def recipe_relative(tree: dict, folder: Path) -> dict:
    """`tree` (a recipe read from `folder`) with each relative path of `RECIPE_RELATIVE` that exists
    beside the recipe written as that file's path, in place."""
    for key, value in tree.items():
        if isinstance(value, dict):
            recipe_relative(value, folder)
        elif key in RECIPE_RELATIVE and isinstance(value, str) and value and not value.startswith(("~", "/", "rlvr:")):
            beside = folder / value
            if beside.exists():
                tree[key] = str(beside)
    return tree
