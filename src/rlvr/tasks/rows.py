"""Rows of a data source as ``(row, location)`` pairs, the location (``file:line``) for errors: a JSONL /
JSON / Parquet file, a folder `datasets.Dataset.save_to_disk` wrote, or a Hugging Face Hub dataset id
(`org/name`, optionally `@revision`) read through the Hub cache (``HF_HUB_OFFLINE=1`` reads only the
cache), whose snapshot's data files are its splits by name (`train`, `test`, `validation`). The file
tasks (`rlvr.tasks.files`) and datasets named in the API (`rlvr.tasks.named`) read rows here.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from rlvr.errors import ConfigError
from rlvr.hub import DATA_SUFFIXES, hf_command, is_hub_dataset
from rlvr.inputs import check_regular

__all__ = ["hub_splits", "load_rows", "task_rows"]

SPLITS = ("train", "test", "validation")


def load_rows(path: str | Path, *, split: str = "train", field: str = "task.path") -> list[tuple[dict, str]]:
    """Rows of a data file as ``(row, location)`` pairs; location is ``file:line`` for errors.
    ``field``: the config key that named the file, for error messages."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"{field}: {str(p)!r} not found")
    if p.is_dir():
        return _load_hf(p, split, field)
    check_regular(p, field)  # a named pipe would be read once here, then again (forever) by the fingerprint
    suffix = p.suffix.lower()
    if suffix in (".jsonl", ".json"):
        rows = []
        with open(p, "rb") as f:
            for lineno, raw in enumerate(f, 1):
                try:
                    line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")  # a byte-order mark is no row
                except UnicodeDecodeError as err:
                    raise ConfigError(f"{p}:{lineno}: not UTF-8 (byte 0x{raw[err.start]:02x} at column "
                                      f"{err.start + 1}); re-encode the file as UTF-8 (JSON text is UTF-8)") from None
                if not line.strip():
                    continue
                try:
                    row = json.loads(line, object_pairs_hook=_unique_keys, parse_constant=_no_constant)
                except json.JSONDecodeError as err:
                    raise ConfigError(f"{p}:{lineno}: invalid JSON ({err.msg} at column {err.colno})") from None
                except _BadRow as err:
                    raise ConfigError(f"{p}:{lineno}: {err}") from None
                if not isinstance(row, dict):
                    raise ConfigError(f"{p}:{lineno}: expected a JSON object, got {type(row).__name__}")
                rows.append((row, f"{p}:{lineno}"))
        return rows
    if suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise ConfigError(f"{field}: reading {str(p)!r} needs pyarrow; pip install -e '.[data]'") from None
        table = pq.read_table(p)
        return [(row, f"{p}:row {i + 1}") for i, row in enumerate(table.to_pylist())]
    raise ConfigError(f"{field}: {str(p)!r} is not .jsonl, .json, .parquet or a datasets directory")


class _BadRow(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    """A JSON object whose keys are all different (json keeps the last of a repeated key silently)."""
    row: dict = {}
    for key, value in pairs:
        if key in row:
            raise _BadRow(f"key {key!r} given twice in one row; keep one")
        row[key] = value
    return row


def _no_constant(name: str):
    """NaN and Infinity are not JSON (Python's json reads them): an answer of NaN equals nothing."""
    raise _BadRow(f"{name} is not a JSON value; write the number, or drop the row")


def _load_hf(p: Path, split: str, field: str) -> list[tuple[dict, str]]:
    try:
        import datasets
    except ImportError:
        raise ConfigError(f"{field}: {str(p)!r} is a directory; loading it needs `datasets`; "
                          "pip install -e '.[data]'") from None
    try:
        ds = datasets.load_from_disk(str(p))
    except Exception as err:  # noqa: BLE001 - datasets raises many types for a bad directory
        raise ConfigError(f"{field}: {str(p)!r} is not a dataset saved with save_to_disk ({err})") from None
    if isinstance(ds, datasets.DatasetDict):
        if split not in ds:
            raise ConfigError(f"{field.rsplit('.', 1)[0]}.split={split!r} not in {str(p)!r}; splits: {', '.join(ds)}")
        ds = ds[split]
    return [(row, f"{p}[{split}]:row {i + 1}") for i, row in enumerate(ds)]


def _hub_snapshot(repo: str, argument: str) -> Path:
    """The local snapshot of Hub dataset `repo`, downloaded into the Hugging Face cache unless it is
    there; only the cache is read when `HF_HUB_OFFLINE` is set (as `model.path` ids are read)."""
    from huggingface_hub import snapshot_download

    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")
    repo_id, _, revision = repo.partition("@")
    try:
        return Path(snapshot_download(repo_id, repo_type="dataset", revision=revision or None,
                                      local_files_only=offline))
    except Exception as err:  # noqa: BLE001 - the hub's many errors: one line naming the dataset
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0][:120]
        fix = f"download it once ({hf_command()} download {repo_id} --repo-type dataset) or pass a local file"
        raise ConfigError(f"{argument}: cannot read dataset '{repo}' ({type(err).__name__}: {reason}); {fix}") from None


def hub_splits(name: str, argument: str) -> dict[str, list[tuple[dict, str]]]:
    """{split: (row, location) pairs} of Hub dataset `name`: its snapshot's data files, by split name."""
    snapshot = _hub_snapshot(name, argument)
    files = sorted(p for p in snapshot.rglob("*") if p.suffix in DATA_SUFFIXES and p.is_file())
    splits = {split: [pair for f in files if split in f.name for pair in load_rows(f, field=argument)]
              for split in SPLITS}
    splits = {split: rows for split, rows in splits.items() if rows} or {
        "train": [pair for f in files for pair in load_rows(f, field=argument)]}
    if not splits.get("train"):
        raise ConfigError(f"{argument}: Hub dataset '{name}' has no {', '.join(DATA_SUFFIXES)} train files")
    return splits


def task_rows(path: str | Path, *, split: str, field: str) -> list[tuple[dict, str]]:
    """A file task's rows (`load_rows`), its `path` also a Hub dataset id read as `named_dataset` reads it."""
    if not is_hub_dataset(path):
        return load_rows(path, split=split, field=field)
    splits = hub_splits(str(path), field)
    if split not in splits:
        raise ConfigError(f"{field.rsplit('.', 1)[0]}.split={split!r} not in Hub dataset '{path}'; "
                          f"splits: {', '.join(splits)}")
    return splits[split]
