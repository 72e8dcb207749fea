"""A dataset named by a string, as TRL's scripts take `dataset_name`: a local JSONL / JSON / Parquet
file, a folder `datasets.Dataset.save_to_disk` wrote, or a Hugging Face Hub dataset id (`org/name`,
optionally `@revision`) read through the Hub cache (``HF_HUB_OFFLINE=1`` reads only the cache). Rows
are read by `rlvr.tasks.rows`, as a file task's `path` is (`task.math_file.path` takes a Hub id too), so a
recipe reads a Hub dataset as the API does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlvr.errors import ConfigError
from rlvr.hub import DATA_SUFFIXES, is_hub_dataset
from rlvr.tasks.rows import hub_splits, load_rows

__all__ = ["named_dataset"]


def _rows(path: Path, argument: str, split: str = "train") -> list[dict]:
    return [row for row, _ in load_rows(path, split=split, field=argument)]


def named_dataset(name: str | Path, argument: str = "train_dataset") -> Any:
    """The rows `name` names: a list of rows (a file or a saved split), or {split: rows} (a Hub dataset)."""
    path = Path(name).expanduser()
    if path.exists():
        return _rows(path, argument)
    if not is_hub_dataset(name):
        raise ConfigError(f"{argument}: '{name}' is no file or folder and no Hub dataset id (org/name); pass a "
                          f"{', '.join(DATA_SUFFIXES)} file, a datasets folder, a Hub id or the rows")
    return {split: [row for row, _ in pairs] for split, pairs in hub_splits(str(name), argument).items()}
