"""A dataset named by a string, as TRL's scripts take `dataset_name`: a local file (JSONL, JSON,
Parquet, CSV), a folder `datasets.Dataset.save_to_disk` wrote, a folder of data files, or a
Hugging Face Hub dataset id read through the `datasets` cache (``HF_HUB_OFFLINE=1`` reads only the
cache). `datasets` is imported here only, when a name is given.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from rlvr.errors import ConfigError

__all__ = ["named_dataset"]

BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
HUB_DATASET = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?(@[\w./-]+)?")


def _hub_snapshot(repo: str) -> str:
    """The local snapshot of Hub dataset `repo`, downloaded into the Hugging Face cache unless it is
    there; only the cache is read when `HF_HUB_OFFLINE` is set (as `model.path` ids are read)."""
    import os

    from huggingface_hub import snapshot_download

    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")
    repo_id, _, revision = repo.partition("@")
    return snapshot_download(repo_id, repo_type="dataset", revision=revision or None, local_files_only=offline)


def named_dataset(name: str | Path, argument: str = "train_dataset") -> Any:
    """The `datasets.Dataset` (one file or a saved split) or `DatasetDict` (a folder or a Hub id) `name` names."""
    try:
        import datasets
    except ImportError:
        raise ConfigError(f"{argument}: naming a dataset needs the `datasets` package (pip install datasets); or "
                          f"pass the rows as a list of dicts") from None
    path = Path(name).expanduser()
    try:
        if path.is_file():
            if path.suffix not in BUILDERS:
                raise ConfigError(f"{argument}: '{name}' is a {path.suffix or 'suffix-less'} file; give a "
                                  f"{', '.join(BUILDERS)} file, a datasets folder or a Hub dataset id")
            return datasets.load_dataset(BUILDERS[path.suffix], data_files=str(path), split="train")
        if path.is_dir():
            if (path / "dataset_info.json").is_file() or (path / "dataset_dict.json").is_file():
                return datasets.load_from_disk(str(path))
            return datasets.load_dataset(str(path))
        if not HUB_DATASET.fullmatch(str(name)):
            raise ConfigError(f"{argument}: '{name}' is no file or folder and no Hub dataset id (org/name)")
        return datasets.load_dataset(_hub_snapshot(str(name)))
    except ConfigError:
        raise
    except Exception as err:  # noqa: BLE001 - the library's many errors: one line naming the dataset
        from rlvr.models.causal_lm import hf_command

        reason = (str(err).strip().splitlines() or [type(err).__name__])[0][:160]
        raise ConfigError(f"{argument}: cannot read dataset '{name}' ({type(err).__name__}: {reason}); for a Hub "
                          f"dataset download it once ({hf_command()} download {name} --repo-type dataset) or pass a "
                          f"local file") from None
