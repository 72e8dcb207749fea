"""The ``/dev`` a sample sees, made once where this process may make device nodes.

bwrap's ``--dev`` builds a ``/dev`` for every sample: a tmpfs, a bind mount and a remount for
each of six devices, and a ``devpts`` instance, about 0.5 ms of a 14 ms sample here. As root
(CAP_MKNOD) on a file system that honours device nodes, the same six devices (``null``, ``zero``,
``full``, ``random``, ``urandom``, ``tty``, mode 0666 as bwrap's) and the ``fd``/``stdin``/
``stdout``/``stderr`` links into ``/proc`` are made once, in a directory ``NAME`` that every
sample gets in one bind mount. Its owner is root, whom the sample's user namespace does not map:
the sample can open the devices, not add, remove or change an entry. Left out against ``--dev``:
pseudo-terminals (``/dev/pts``, ``/dev/ptmx``), which a graded program reading a pipe has no use
for. Elsewhere the sandbox keeps bwrap's ``--dev``.

Where: under ``/dev`` (a devtmpfs: it honours device nodes), and only while it and every folder
above it are root's and writable by nobody else. bwrap binds by path, resolved after this process
has checked the directory: in a folder others may write to (``/dev/shm``, the temp directory),
someone could put a link of their own under the name in between (once a cleaner had removed the
directory), and the link's target would be the sample's ``/dev``.

The directory is shared by every process of the host and kept when they exit (a crashed one leaves
nothing of its own): it is made under a temporary name and renamed into place, and used only once
checked to be exactly this (root's, mode 0755, each entry as made, nothing else). Each use compares
it with the directory checked (device, inode, size and change time, which an entry removed or added
changes) and checks it again when it differs; one of root's found wrong (a cleaner took entries) is
made again, one that cannot be checked (an error reading it) is left as it is and not used.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
import threading

__all__ = ["DEVICES", "LINKS", "NAME", "PLACES", "device_dir"]

DEVICES = {"null": (1, 3), "zero": (1, 5), "full": (1, 7), "random": (1, 8), "urandom": (1, 9), "tty": (5, 0)}
"""Name -> (major, minor): the character devices of bwrap's ``--dev``."""
LINKS = {"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1",
         "stderr": "/proc/self/fd/2"}
NAME = "rlvr-sandbox-dev"
PLACES = ("/dev",)
"""Where the directory may be made: the first of these that only root can write to (it and every
folder above it) and whose mount honours device nodes."""

_checked: list[tuple[str, tuple[int, ...]] | None] = []  # (path, its identity when checked)
_lock = threading.Lock()


def device_dir() -> str | None:
    """The directory holding the sample's devices (its ``shm`` a mount point), checked or made on
    the first call and whenever it has changed since; None where this process cannot have one."""
    with _lock:
        if _checked and _checked[0] is not None and _identity(_checked[0][0]) == _checked[0][1]:
            return _checked[0][0]
        found = next((d for d in map(_ready_in, PLACES) if d is not None), None)
        _checked[:] = [(found, _identity(found)) if found is not None else None]
        return found


def _identity(path: str) -> tuple[int, ...] | None:
    """What changes when the directory is replaced or an entry comes or goes: its device and inode,
    its size (a tmpfs directory's grows with its entries) and its change time (coarse-grained: two
    changes within a clock tick may share one)."""
    try:
        info = os.lstat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino, info.st_size, info.st_ctime_ns


def _ready_in(place: str) -> str | None:
    """``NAME`` under ``place``, checked, made first where it is missing or wrong; None where it
    cannot be had there."""
    if not hasattr(os, "mknod") or os.geteuid() != 0 or not _root_only(place):
        return None
    path = os.path.join(place, NAME)
    if os.path.lexists(path) and _check(path) is False:
        shutil.rmtree(path, ignore_errors=True)  # fd-based: never follows a link
    if not os.path.lexists(path):
        _make(path)
    return path if _check(path) else None


def _root_only(place: str) -> bool:
    """Whether ``place`` and every folder above it are root's directories (not links) that nobody
    else may write to."""
    if not os.path.isabs(place):
        return False
    parts = place.rstrip("/").split("/")
    for k in range(1, len(parts) + 1):
        try:
            info = os.lstat("/".join(parts[:k]) or "/")
        except OSError:
            return False
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != 0 or info.st_mode & 0o022:
            return False
    return True


def _make(path: str) -> None:
    """Make the directory under a temporary name and rename it to ``path`` (another process doing
    the same at once, or anything already there, wins: only the check decides what is used)."""
    tmp = None
    try:
        tmp = tempfile.mkdtemp(prefix=f".{NAME}-", dir=os.path.dirname(path))
        for name, (major, minor) in DEVICES.items():
            os.mknod(os.path.join(tmp, name), stat.S_IFCHR | 0o666, os.makedev(major, minor))
            os.chmod(os.path.join(tmp, name), 0o666)  # mknod's mode passes the umask
        for name, target in LINKS.items():
            os.symlink(target, os.path.join(tmp, name))
        os.mkdir(os.path.join(tmp, "shm"), 0o755)
        os.chmod(os.path.join(tmp, "shm"), 0o755)
        os.chmod(tmp, 0o755)
        os.rename(tmp, path)
        tmp = None
    except OSError:
        pass
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def _check(path: str) -> bool | None:
    """True where ``path`` is exactly the directory ``_make`` makes and its devices open, False
    where it is something else (only root can have made it, in a root-only place: made again),
    None where that cannot be told (an error reading it, or a mount that refuses devices)."""
    try:
        top = os.lstat(path)
        if not (stat.S_ISDIR(top.st_mode) and top.st_uid == 0 and stat.S_IMODE(top.st_mode) == 0o755):
            return False
        if set(os.listdir(path)) != {*DEVICES, *LINKS, "shm"}:
            return False
        for name, (major, minor) in DEVICES.items():
            node = os.lstat(os.path.join(path, name))
            if not (stat.S_ISCHR(node.st_mode) and node.st_uid == 0 and stat.S_IMODE(node.st_mode) == 0o666
                    and (os.major(node.st_rdev), os.minor(node.st_rdev)) == (major, minor)):
                return False
        for name, target in LINKS.items():
            if not os.path.islink(os.path.join(path, name)) or os.readlink(os.path.join(path, name)) != target:
                return False
        shm = os.lstat(os.path.join(path, "shm"))
        if not (stat.S_ISDIR(shm.st_mode) and shm.st_uid == 0 and stat.S_IMODE(shm.st_mode) == 0o755):
            return False
        if os.listdir(os.path.join(path, "shm")):
            return False
    except FileNotFoundError:
        return False
    except OSError:
        return None
    try:
        os.close(os.open(os.path.join(path, "null"), os.O_WRONLY | os.O_NOFOLLOW))  # EACCES on a nodev mount
    except OSError:
        return None
    return True
