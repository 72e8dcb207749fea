"""Host-wide registry of sandbox slot uids, so that no two sandboxes ever share one.

A sandbox running as root kills every process of a slot's uid after each program; two sandboxes
(two training processes on one host) sharing a uid would kill each other's programs and share
RLIMIT_NPROC. Each `rlvr.rewards.sandbox.Sandbox` therefore reserves its range here: the lowest
free one from its ``base_uid`` up, recorded with the owner's pid and the kernel's start time of
that pid in a JSON file guarded by ``flock``. ``release_uids`` gives a range back; a range whose
owner died without doing so (SIGKILL) is reclaimed by the next allocation, and the start time
keeps a reused pid from holding it.
"""

from __future__ import annotations

import fcntl
import json
import os
import stat
import uuid
import weakref
from contextlib import contextmanager

from rlvr.errors import ConfigError
from rlvr.safe_io import atomic_write_json, open_new_or_regular

__all__ = ["UID_REGISTRY", "allocate_uids", "release_uids", "reserve"]

UID_REGISTRY = os.environ.get("RLVR_SANDBOX_UID_DIR", "/tmp/rlvr-sandbox-uids")
"""Host-wide directory of the slot-uid registry (``ranges.json`` and its ``lock``)."""
UID_SEARCH = 1_000_000  # how far above base_uid a free range is looked for


def _process_start(pid: int) -> str | None:
    """The kernel's start time of `pid` (tells a live owner from a reused pid), None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return None


def _alive(entry: dict) -> bool:
    start = _process_start(entry.get("pid", -1))
    return start is not None and start == entry.get("started")


def _check_private(directory: str) -> None:
    """The registry lives in a shared folder (/tmp): refuse one someone else made or can write to,
    where a planted link could turn the registry's writes (as root) onto any file."""
    info = os.lstat(directory)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
        raise ConfigError(f"sandbox: the uid registry '{directory}' is not a folder of this user that only it may "
                          f"write to; remove it, or set RLVR_SANDBOX_UID_DIR to such a folder")


@contextmanager
def _registry(directory: str):
    """The registry's live entries under an exclusive lock; what the body leaves in the list is written back."""
    os.makedirs(directory, mode=0o700, exist_ok=True)
    _check_private(directory)
    path = os.path.join(directory, "ranges.json")
    with open(open_new_or_regular(os.path.join(directory, "lock"), os.O_RDWR | os.O_CREAT, 0o600), "rb") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            try:
                with open(path) as f:
                    entries = json.load(f)
            except (OSError, ValueError):
                entries = []
            entries = [e for e in entries if isinstance(e, dict) and _alive(e)]  # dead owners' ranges return
            yield entries
            atomic_write_json(path, entries)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def allocate_uids(base_uid: int, count: int, directory: str | None = None) -> tuple[int, str]:
    """Reserve `count` consecutive uids, the lowest free range from `base_uid`: (first uid, token)."""
    token = uuid.uuid4().hex
    with _registry(directory or UID_REGISTRY) as entries:
        taken = sorted((e["start"], e["start"] + e["count"]) for e in entries)
        start = base_uid
        for lo, hi in taken:
            if start + count <= lo:
                break
            start = max(start, hi)
        if start + count > base_uid + UID_SEARCH:
            raise RuntimeError(f"sandbox: no {count} free slot uids between {base_uid} and {base_uid + UID_SEARCH}")
        entries.append({"start": start, "count": count, "pid": os.getpid(),
                        "started": _process_start(os.getpid()), "token": token})
    return start, token


def release_uids(token: str, directory: str | None = None) -> None:
    """Give a range from `allocate_uids` back (a no-op when it is already gone)."""
    try:
        with _registry(directory or UID_REGISTRY) as entries:
            entries[:] = [e for e in entries if e.get("token") != token]
    except OSError:  # at interpreter exit, or the directory vanished: a dead owner's range is reclaimed anyway
        pass


def reserve(owner: object, base_uid: int, count: int) -> tuple[range, weakref.finalize]:
    """(the uids, a callable giving them back) for `owner`; given back at the latest when `owner`
    is collected or the process exits (a ``weakref.finalize``, which runs once)."""
    start, token = allocate_uids(base_uid, count)
    return range(start, start + count), weakref.finalize(owner, release_uids, token, UID_REGISTRY)
