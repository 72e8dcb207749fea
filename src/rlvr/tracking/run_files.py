"""Reading a run folder back. Users copy, share and edit runs by hand, so every run file is read
as input: damage becomes one `ConfigError` line naming the file and the fix, never a traceback.

- `config.yaml`: a YAML mapping under `rlvr.yaml_io`'s limits; empty or not a mapping is an error.
- `run.json`: a JSON object. Tools that only show it (`runs list`, `report`) warn and go on
  without it; commands that continue the run (`--resume`, `export`) stop on it.
- `metrics.jsonl`, `samples.jsonl`: one JSON object per line, `step` an integer. A torn last
  line (a run killed mid-write) is dropped silently, as the trainer itself does. Any other bad
  line (not JSON, not an object, not UTF-8, a metric that is not a number) is reported with its
  file and line: skipped with a warning by the tools that read (`tolerant`), an error for a
  resume, which rewrites these files and would otherwise drop what it cannot read.
- `checkpoints/`: only `step_NNNNNN` folders are checkpoints; anything else beside them (a
  `step_000002.bak` copy, a notes file) is ignored with a warning.
- `checksums.json`: an object of file name -> sha256 hex, else "unreadable".
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

from rlvr.errors import ConfigError
from rlvr.inputs import RUN_FILE, read_bytes, read_text
from rlvr.yaml_io import MAX_BYTES, load_yaml

__all__ = ["checkpoint_dirs", "read_checksums", "read_config", "read_lines", "read_manifest", "read_object",
           "read_records", "warn"]

MANIFEST_BYTES = 16 << 20  # run.json is kilobytes; a file this large is not one rlvr wrote
CHECKPOINT_NAME = re.compile(r"step_\d{6,}")
_SHA256 = re.compile(r"[0-9a-f]{64}")


def warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


def read_config(run: Path) -> dict:
    """The run's config.yaml as a mapping."""
    path = Path(run) / "config.yaml"
    if not path.exists():
        raise ConfigError(f"'{run}' is not a run directory (no config.yaml)")
    tree = load_yaml(read_bytes(path, "run file", MAX_BYTES, RUN_FILE), f"'{path}'")
    if not isinstance(tree, dict) or not tree:
        shown = "empty" if not tree else f"a {type(tree).__name__}, not a mapping of sections"
        raise ConfigError(f"'{path}' is {shown}; restore it from a copy of the run (rlvr writes the resolved "
                          f"config there)")
    odd = next((k for k, v in tree.items() if not isinstance(k, str) or not isinstance(v, (dict, str, int, float,
                                                                                            bool, type(None)))), None)
    if odd is not None:  # rlvr writes sections as mappings and top-level knobs (seed) as scalars
        raise ConfigError(f"'{path}': {odd!r} is a {type(tree[odd]).__name__}, not a section or a value; restore it "
                          f"from a copy of the run (rlvr writes the resolved config there)")
    return tree


def read_manifest(run: Path, *, tolerant: bool = False) -> dict:
    """run.json as a dict ({} where there is none). Damage: an error, or with `tolerant` a warning
    and `{"status": "unreadable run.json"}`."""
    return read_object(Path(run) / "run.json", tolerant=tolerant)


def read_object(path: Path, *, tolerant: bool = False) -> dict:
    """A JSON object file of a run (run.json) as `read_manifest` reads it."""
    if not path.exists() and not path.is_symlink():
        return {}
    try:
        text = read_text(path, "run file", MANIFEST_BYTES, RUN_FILE)
        problem = None
        try:
            info = json.loads(text)
        except json.JSONDecodeError as err:
            info, problem = None, "empty" if not text.strip() else f"not valid JSON (line {err.lineno})"
        if problem is None and not isinstance(info, dict):
            problem = f"a JSON {type(info).__name__}, not an object"
        if problem:
            raise ConfigError(f"'{path}' is {problem}; restore it from a copy of the run, or delete it (rlvr "
                              f"writes a new one; the run's provenance record is lost)")
    except ConfigError as err:
        if not tolerant:
            raise
        warn(str(err))
        return {"status": f"unreadable {path.name}"}
    return info


def read_lines(path: Path, *, tolerant: bool, numeric: bool = False) -> list[tuple[str, dict]]:
    """(line text, record) of every good line of a JSONL run file ([] where there is none).
    `numeric`: every value but `step` must be a number or null (metrics.jsonl)."""
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        return []
    if not path.exists() and tolerant:  # a link to nothing: the tools that only read go on without it
        warn(f"run file '{path}' is a link to nothing; skipped (rlvr writes no links: remove it)")
        return []
    data = read_bytes(path, "run file", fix=RUN_FILE)
    lines = data.split(b"\n")
    torn = lines.pop() if lines else b""  # the text after the last newline: a line still being written
    kept = []
    for number, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        problem, line, record = _parse(raw, numeric)
        if problem is None:
            kept.append((line, record))
            continue
        message = f"'{path}' line {number} {problem}"
        if not tolerant:
            raise ConfigError(f"{message}; repair or remove that line, then run again")
        warn(f"{message}; skipped (repair or remove that line)")
    if torn.strip() and _parse(torn, numeric)[0] is None:  # a complete last line without its newline
        kept.append(_parse(torn, numeric)[1:])
    return kept


def read_records(path: Path, *, tolerant: bool = True, numeric: bool = False) -> list[dict]:
    """The records of a JSONL run file, bad lines handled as `read_lines` does."""
    return [record for _, record in read_lines(path, tolerant=tolerant, numeric=numeric)]


def _parse(raw: bytes, numeric: bool) -> tuple[str | None, str, Any]:
    """(problem or None, the line as text, its record)."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        return f"is not UTF-8 text (byte {err.start})", "", None
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return "is not valid JSON", line, None
    if not isinstance(record, dict):
        return f"is a JSON {type(record).__name__}, not an object", line, None
    step = record.get("step", 0)
    if isinstance(step, bool) or not isinstance(step, int):
        return f"has step {str(step)[:40]!r}, not an integer", line, None
    if numeric:
        bad = next((k for k, v in record.items() if k != "step" and not _number(v)), None)
        if bad is not None:
            return f"has {bad!r} = {str(record[bad])[:40]!r}, not a number", line, None
    return None, line, record


def _number(value: Any) -> bool:
    """A metric value: a number (nan and inf included: a diverged run logs them) or null."""
    return value is None or isinstance(value, (int, float))


def checkpoint_dirs(directory: Path) -> list[Path]:
    """The `step_NNNNNN` checkpoint folders in `directory`, oldest first; anything else there is
    ignored with a warning (rlvr's own temp folders, `.tmp_step_*`, silently)."""
    directory = Path(directory)
    if not directory.exists():
        return []
    if not directory.is_dir():
        raise ConfigError(f"'{directory}' is not a folder; move it away (rlvr keeps the run's checkpoints "
                          f"in a folder of that name)")
    found, strays = [], []
    for entry in sorted(directory.iterdir()):
        if CHECKPOINT_NAME.fullmatch(entry.name) and entry.is_dir() and not entry.is_symlink():
            found.append(entry)
        elif not entry.name.startswith(".tmp_step_"):
            strays.append(entry.name)
    if strays:
        warn(f"ignoring {', '.join(strays[:3])}{' ...' if len(strays) > 3 else ''} in '{directory}': not a "
             f"checkpoint rlvr wrote (checkpoints are step_NNNNNN folders); move it out to silence this")
    return sorted(found, key=lambda p: int(p.name.removeprefix("step_")))


def read_checksums(checkpoint: Path, name: str) -> dict[str, str] | None:
    """A checkpoint's `name` (checksums.json) as {file: sha256 hex}; None when it is missing or is
    anything else (the caller names the checkpoint as corrupt)."""
    try:
        data = json.loads(read_text(Path(checkpoint) / name, "checkpoint file", MAX_BYTES))
    except (ConfigError, json.JSONDecodeError):
        return None
    if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str) and _SHA256.fullmatch(v)
                                             for k, v in data.items()):
        return None
    return data
