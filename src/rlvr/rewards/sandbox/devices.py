"""The ``/dev`` a sample sees, made once per process where this process may make device nodes.

bwrap's ``--dev`` builds a ``/dev`` for every sample: a tmpfs, a bind mount and a remount for
each of six devices, and a ``devpts`` instance, about 0.5 ms of a 14 ms sample here. As root
(CAP_MKNOD) on a file system that honours device nodes, the same six devices are made once, in a
directory of this process's own (``null``, ``zero``, ``full``, ``random``, ``urandom``, ``tty``,
mode 0666 as bwrap's, and the ``fd``/``stdin``/``stdout``/``stderr`` links into ``/proc``), and
each sample gets that directory in one bind mount. Its owner is root, whom the sample's user
namespace does not map: the sample can open the devices, not add, remove or change an entry.
Left out against ``--dev``: pseudo-terminals (``/dev/pts``, ``/dev/ptmx``), which a graded
program reading a pipe has no use for. Elsewhere (no CAP_MKNOD, or a ``nodev`` mount under every
candidate place) the sandbox keeps bwrap's ``--dev``.
"""

from __future__ import annotations

import atexit
import os
import shutil
import stat
import tempfile
import threading

__all__ = ["DEVICES", "LINKS", "PLACES", "device_dir"]

DEVICES = {"null": (1, 3), "zero": (1, 5), "full": (1, 7), "random": (1, 8), "urandom": (1, 9), "tty": (5, 0)}
"""Name -> (major, minor): the character devices of bwrap's ``--dev``."""
LINKS = {"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1",
         "stderr": "/proc/self/fd/2"}
PREFIX = "rlvr-dev-"

_made: list[str | None] = []
_lock = threading.Lock()


PLACES = ("/dev/shm", None)
"""Where the directory is made: the first of these (None: the temp directory) whose mount honours
device nodes."""


def device_dir() -> str | None:
    """A directory holding the sample's devices (its ``shm`` a mount point), made on the first call
    (again if it has gone since: a temp cleaner); None where this process cannot make one."""
    with _lock:
        if not _made or (_made[0] is not None and not os.path.isdir(os.path.join(_made[0], "shm"))):
            path = next((d for d in map(_make_in, PLACES) if d is not None), None)
            if path is not None:
                atexit.register(shutil.rmtree, path, True)
            _made[:] = [path]
        return _made[0]


def _make_in(place: str | None) -> str | None:
    if not hasattr(os, "mknod") or os.geteuid() != 0:
        return None
    if place is not None and not os.path.isdir(place):
        return None
    path = None
    try:
        path = tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=place)
        for name, (major, minor) in DEVICES.items():
            os.mknod(os.path.join(path, name), stat.S_IFCHR | 0o666, os.makedev(major, minor))
            os.chmod(os.path.join(path, name), 0o666)  # mknod's mode passes the umask
        for name, target in LINKS.items():
            os.symlink(target, os.path.join(path, name))
        os.mkdir(os.path.join(path, "shm"), 0o755)
        os.chmod(path, 0o755)
        os.close(os.open(os.path.join(path, "null"), os.O_WRONLY))  # EACCES on a nodev mount
        return path
    except OSError:
        if path is not None:
            shutil.rmtree(path, ignore_errors=True)
        return None

