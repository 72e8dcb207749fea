"""Files whose page cache a test controls: written clean under /usr (which every sample sees,
read-only), and evicted on demand."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest


def evict(path: str | os.PathLike) -> None:
    """Drop the page cache of ``path`` (clean, unmapped pages go; nobody holds it cached after)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def clean_files_under_usr(name: str, count: int, size: int) -> Path:
    """A fresh folder under /usr holding `count` files of `size` random bytes, written back to disk
    so their pages are clean (a dirty page cannot be evicted); the test skips where /usr is not
    writable. The caller removes the folder."""
    folder = Path(f"/usr/local/share/{name}-{uuid.uuid4().hex[:12]}")
    try:
        folder.mkdir(parents=True)
    except OSError as err:
        pytest.skip(f"cannot write under /usr here ({err})")
    for i in range(count):
        with open(folder / f"{i}.bin", "wb") as f:
            f.write(os.urandom(size))
            f.flush()
            os.fsync(f.fileno())
    return folder
