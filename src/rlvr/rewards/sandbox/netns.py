"""A network namespace per sandbox slot, made once and entered by the thread that starts a sample.

bwrap's ``--unshare-net`` makes a namespace for every sample and brings its loopback up: about
0.7 ms of a 14 ms sample here, the dearest of its namespaces. A sample's network namespace holds
nothing that outlives its processes: without ``Limits.inet`` its seccomp filter opens only
``AF_UNIX`` sockets, and what those hold (abstract names, queued buffers) goes with the last
process that has them, which the sandbox kills before the slot runs anything else. So one
empty namespace per slot serves each of the slot's samples in turn, as a fresh one would: no
route out, no loopback up, the host's abstract sockets out of reach, and no sample running at
the same time in it (one sample at a time per slot). The namespace belongs to this process's
user namespace, where the sample holds no capability: it cannot bring an interface up or write
a sysctl there. What it still shares with the slot's earlier samples are the kernel's global
counters every process shares (inode and socket numbers).

The thread that starts a sample enters the slot's namespace (``setns``, which moves only the
calling thread), starts the chain (``vfork`` copies the thread's namespaces), and goes back
before anything of the sample runs. Making one needs CAP_SYS_ADMIN (root); elsewhere, and for
samples with ``Limits.inet`` (whose loopback must be up and their own), bwrap makes a fresh one.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import threading

__all__ = ["make", "entered", "close"]

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True) if os.name == "posix" else None


def _call(name: str, *args) -> None:
    fn = getattr(_libc, name, None) if _libc is not None else None
    if fn is None:
        raise OSError(errno.ENOSYS, f"{name} is not available here")
    if fn(*args) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{name}: {os.strerror(err)}")


def make() -> tuple[int | None, str]:
    """(an fd holding a new, empty network namespace, "") or (None, why not). A short-lived
    thread makes it (``unshare`` moves only that thread) and the fd keeps it alive."""
    made: list[int] = []
    failed: list[str] = []

    def inside_new() -> None:
        try:
            _call("unshare", CLONE_NEWNET)
            made.append(os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC))
        except OSError as err:
            failed.append(str(err))

    worker = threading.Thread(target=inside_new, name="rlvr-sandbox-netns")
    worker.start()
    worker.join()
    return (made[0], "") if made else (None, failed[0] if failed else "unshare failed")


@contextlib.contextmanager
def entered(fd: int | None):
    """Within it the calling thread sits in namespace ``fd`` (a no-op for None); it is back in the
    namespace it was in before the block ends, raising if it cannot be."""
    if fd is None:
        yield
        return
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        _call("setns", fd, CLONE_NEWNET)
        try:
            yield
        finally:
            try:
                _call("setns", home, CLONE_NEWNET)
            except OSError as err:
                raise RuntimeError(f"sandbox thread could not leave a slot's network namespace ({err})") from err
    finally:
        os.close(home)


def close(fds: list[int | None]) -> None:
    """Let the slots' namespaces go (each dies with its last reference)."""
    for fd in fds:
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
