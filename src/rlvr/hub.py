"""The Hugging Face Hub's command-line tool as the installed huggingface-hub ships it, for the hints
of errors about models and datasets that are not in the cache; the form of a Hub id."""

from __future__ import annotations

import re

__all__ = ["HUB_ID", "LOGIN", "cached_dataset", "hf_command", "is_hub_dataset"]

HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+(@[\w./-]+)?")
"""A Hub repository id as rlvr takes one where a local path may stand: `org/name`, optionally `@revision`."""

LOGIN = {"hf": "auth login", "huggingface-cli": "login"}  # each CLI's login subcommand


def hf_command() -> str:
    """`hf` (huggingface-hub 0.34 and later), else the older `huggingface-cli`."""
    from huggingface_hub import __version__

    major, minor = (int(part) for part in re.findall(r"\d+", __version__)[:2])
    return "hf" if (major, minor) >= (0, 34) else "huggingface-cli"


DATA_SUFFIXES = (".jsonl", ".json", ".parquet")  # what a data file is named: such a name is a missing file


def is_hub_dataset(name) -> bool:
    """`name` reads as a Hub dataset id (`org/name[@revision]`) and names no local file or folder; a
    missing `data/train.jsonl` is a missing file, not a dataset to download.

    >>> is_hub_dataset("trl-lib/DeepMath-103K"), is_hub_dataset("data/train.jsonl"), is_hub_dataset("x")
    (True, False, False)
    """
    from pathlib import Path

    text = str(name)
    return (HUB_ID.fullmatch(text) is not None and not text.lower().endswith(DATA_SUFFIXES)
            and not Path(text).expanduser().exists())


def cached_dataset(name: str):
    """The cached snapshot folder (a `Path`) of Hub dataset `name` (`org/name[@revision]`), or None when
    `name` is no Hub id or the cache lacks it; never downloads (for records, not for reading rows)."""
    from pathlib import Path

    if not is_hub_dataset(name):
        return None
    from huggingface_hub import snapshot_download

    repo, _, revision = name.partition("@")
    try:
        return Path(snapshot_download(repo, repo_type="dataset", revision=revision or None, local_files_only=True))
    except Exception:  # noqa: BLE001 - not in the cache, whatever the hub's error type: no record
        return None
