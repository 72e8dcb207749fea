"""An exclusive lock on a folder's writer: `fcntl.flock` on a lock file, which the kernel drops
when its holder dies (a kill -9 included), so a lock left by a killed process never blocks the
next one. The file names the holder for the message a second writer gets."""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
from datetime import UTC, datetime
from pathlib import Path

from rlvr.errors import ConfigError, RunLocked


def boot_id() -> str | None:
    """This boot of the machine (Linux), so a holder's pid is read as the same process only on it."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


_HELD: set[DirLock] = set()  # the locks this process holds, closed in forked children (see below)


class DirLock:
    """An exclusive `fcntl.flock` on the file `path`, held from `acquire` until `release` (or the
    process's end: the kernel drops it, so a kill -9 never leaves a stale lock). The file records
    the holder (pid, host, boot id, start time, command) for the message a second writer gets; it
    is removed on release."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, what: str) -> None:
        """Take the lock or raise `RunLocked` naming the holder; `what` says what is locked (the
        message's subject). A no-op while held."""
        while self._fd is None:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except IsADirectoryError:  # a hand-made folder where rlvr keeps its lock file
                raise ConfigError(f"'{self.path}' is a directory, not rlvr's lock file; remove it (rlvr "
                                  f"makes the lock file itself)") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _holder(fd)
                os.close(fd)
                raise RunLocked(f"{what} is being written by {holder}; wait for it to end, or stop it "
                                f"(a stopped or killed process frees it)") from None
            except BaseException:
                os.close(fd)
                raise
            try:  # a holder that released between our open and flock removed the file: lock the new one
                current = os.stat(self.path).st_ino
            except FileNotFoundError:
                current = None
            if current != os.fstat(fd).st_ino:
                os.close(fd)
                continue
            info = {"pid": os.getpid(), "host": socket.gethostname(), "boot_id": boot_id(),
                    "started": datetime.now(UTC).isoformat(timespec="seconds"), "command": sys.argv}
            try:
                os.ftruncate(fd, 0)
                os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
            except OSError:  # a full disk: the lock holds all the same (a second writer reads no holder)
                pass
            self._fd = fd
            _HELD.add(self)

    def release(self) -> bool:
        """Remove the file and drop the lock; False if it was not held."""
        if self._fd is None:
            return False
        try:
            self.path.unlink(missing_ok=True)  # while still held: the next writer makes a fresh file
        finally:
            os.close(self._fd)
            self._fd = None
            _HELD.discard(self)
        return True

    def _forget(self) -> None:
        os.close(self._fd)  # the child's copy only: the parent keeps its lock
        self._fd = None


def _forget_held_locks() -> None:
    """In a forked child (a multiprocessing worker), close the inherited lock descriptors: a
    flock lives while any copy is open, so a child outliving its killed parent would keep it."""
    for lock in list(_HELD):
        lock._forget()
    _HELD.clear()


os.register_at_fork(after_in_child=_forget_held_locks)


def _holder(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        info = {}
    if not info.get("pid"):
        return "another process"
    argv = info.get("command") or []
    command = " ".join([Path(argv[0]).name, *map(str, argv[1:])]) if argv else ""
    return (f"process {info['pid']} on {info.get('host', '?')} since {info.get('started', '?')}"
            + (f" ({command})" if command else ""))
