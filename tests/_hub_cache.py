"""A Hugging Face Hub cache built on disk, as `snapshot_download` leaves a dataset there (blobs, a
snapshot of links to them, a ref), so a Hub dataset id reads offline (`HF_HUB_OFFLINE=1`)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

REVISION = "0123456789abcdef0123456789abcdef01234567"


def hub_dataset_cache(cache: Path, repo: str, files: dict[str, str]) -> Path:
    """`cache` holding Hub dataset `repo` (`org/name`) with `files` (path in the repo -> text); returns `cache`."""
    folder = cache / f"datasets--{repo.replace('/', '--')}"
    (folder / "blobs").mkdir(parents=True)
    (folder / "refs").mkdir()
    for name, text in files.items():
        data = text.encode()
        blob = folder / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        link = folder / "snapshots" / REVISION / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (folder / "refs" / "main").write_text(REVISION)
    return cache
