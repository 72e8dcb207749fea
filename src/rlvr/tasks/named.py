"""A dataset named by a string, as TRL's scripts take `dataset_name`: a local JSONL / JSON / Parquet
file, a folder `datasets.Dataset.save_to_disk` wrote, or a Hugging Face Hub dataset id (`org/name`,
optionally `@revision`) read through the Hub cache (``HF_HUB_OFFLINE=1`` reads only the cache). Files
are read by the file tasks' reader (`rlvr.tasks.files.load_rows`); a Hub snapshot's data files are
its splits by name (`train`, `test`, `validation`). A file task's `path` (`task.math_file.path`) takes
the same names (`task_rows`), so a recipe reads a Hub dataset as the API does.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from rlvr.errors import ConfigError
from rlvr.tasks.files import load_rows

__all__ = ["is_hub_dataset", "named_dataset", "task_rows"]

HUB_DATASET = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+(@[\w./-]+)?")
DATA_SUFFIXES = (".jsonl", ".json", ".parquet")
SPLITS = ("train", "test", "validation")


def _rows(path: Path, argument: str, split: str = "train") -> list[dict]:
    return [row for row, _ in load_rows(path, split=split, field=argument)]


def _hub_snapshot(repo: str, argument: str) -> Path:
    """The local snapshot of Hub dataset `repo`, downloaded into the Hugging Face cache unless it is
    there; only the cache is read when `HF_HUB_OFFLINE` is set (as `model.path` ids are read)."""
    from huggingface_hub import snapshot_download

    from rlvr.hub import hf_command

    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")
    repo_id, _, revision = repo.partition("@")
    try:
        return Path(snapshot_download(repo_id, repo_type="dataset", revision=revision or None,
                                      local_files_only=offline))
    except Exception as err:  # noqa: BLE001 - the hub's many errors: one line naming the dataset
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0][:120]
        fix = f"download it once ({hf_command()} download {repo_id} --repo-type dataset) or pass a local file"
        raise ConfigError(f"{argument}: cannot read dataset '{repo}' ({type(err).__name__}: {reason}); {fix}") from None


def _hub_splits(name: str, argument: str) -> dict[str, list[tuple[dict, str]]]:
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


def is_hub_dataset(name: str | Path) -> bool:
    """`name` is a Hub dataset id (`org/name[@revision]`) and no local file or folder."""
    return not Path(name).expanduser().exists() and HUB_DATASET.fullmatch(str(name)) is not None


def task_rows(path: str | Path, *, split: str, field: str) -> list[tuple[dict, str]]:
    """A file task's rows (`load_rows`), its `path` also a Hub dataset id read as `named_dataset` reads it."""
    if not is_hub_dataset(path):
        return load_rows(path, split=split, field=field)
    splits = _hub_splits(str(path), field)
    if split not in splits:
        raise ConfigError(f"{field.rsplit('.', 1)[0]}.split={split!r} not in Hub dataset '{path}'; "
                          f"splits: {', '.join(splits)}")
    return splits[split]


def named_dataset(name: str | Path, argument: str = "train_dataset") -> Any:
    """The rows `name` names: a list of rows (a file or a saved split), or {split: rows} (a Hub dataset)."""
    path = Path(name).expanduser()
    if path.exists():
        return _rows(path, argument)
    if not HUB_DATASET.fullmatch(str(name)):
        raise ConfigError(f"{argument}: '{name}' is no file or folder and no Hub dataset id (org/name); pass a "
                          f"{', '.join(DATA_SUFFIXES)} file, a datasets folder, a Hub id or the rows")
    return {split: [row for row, _ in pairs] for split, pairs in _hub_splits(str(name), argument).items()}
