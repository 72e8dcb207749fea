"""A network namespace per sandbox slot, made once and entered by the thread that starts a sample.

bwrap's ``--unshare-net`` makes a namespace for every sample and brings its loopback up: about
0.7 ms of a 14 ms sample here, the dearest of its namespaces. With the seccomp filter loaded and
without ``Limits.inet``, a sample can open only ``AF_UNIX`` sockets, and a namespace holds for it
only what those sockets hold (abstract names, queued buffers). So one empty namespace per slot
serves each of the slot's samples in turn, as a fresh one would: no route out, no loopback up,
the host's abstract sockets out of reach, no sample running at the same time in it (one sample at
a time per slot). It belongs to this process's user namespace, where the sample holds no
capability: it cannot bring an interface up or write a sysctl there.

A socket normally goes with the last process holding it, but sockets a sample sent over one
another (``SCM_RIGHTS``) in a cycle outlive every process until the kernel's collector runs, which
nothing may trigger for a while: their abstract names would stay bound for the slot's next sample
to see and connect to. So after every sample the slot's socket list is read (``/proc/net/unix``,
kept open from inside the namespace: 30-40 us), and a namespace holding any socket is replaced by
a fresh one (``clean``); closing a socket pair of our own then sets the collector going.

The thread that starts a sample enters the slot's namespace (``setns``, which moves only the
calling thread), starts the chain (``vfork`` copies the thread's namespaces), and goes back
before anything of the sample runs. Never the main thread: a signal handler, which Python runs
there, could raise between the two moves or run inside. Making one needs CAP_SYS_ADMIN (root);
elsewhere, without the filter and for samples with ``Limits.inet`` (whose loopback must be up and
their own), bwrap makes a fresh one.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import socket
import threading
from dataclasses import dataclass

__all__ = ["SlotNet", "make", "clean", "entered"]

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True) if os.name == "posix" else None


def _call(name: str, *args) -> None:
    fn = getattr(_libc, name, None) if _libc is not None else None
    if fn is None:
        raise OSError(errno.ENOSYS, f"{name} is not available here")
    if fn(*args) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{name}: {os.strerror(err)}")


@dataclass
class SlotNet:
    """One slot's namespace: ``fd`` holds it, ``sockets`` is its ``/proc/net/unix`` opened inside
    (-1 each once closed)."""

    fd: int
    sockets: int

    def holds_sockets(self) -> bool:
        """Whether any AF_UNIX socket is left in the namespace (the list's header aside)."""
        return os.pread(self.sockets, 4096, 0).count(b"\n") > 1

    def close(self) -> None:
        """Give both fds back, once (a second call closes nothing another thread has since opened)."""
        fds, self.fd, self.sockets = (self.fd, self.sockets), -1, -1
        for fd in fds:
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)


def make() -> tuple[SlotNet | None, str]:
    """(a new, empty network namespace, "") or (None, why not). A short-lived thread makes it
    (``unshare`` moves only that thread) and the fds keep it alive."""
    made: list[SlotNet] = []
    failed: list[str] = []

    def inside_new() -> None:
        fd = -1
        try:
            _call("unshare", CLONE_NEWNET)
            fd = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
            made.append(SlotNet(fd, os.open("/proc/thread-self/net/unix", os.O_RDONLY | os.O_CLOEXEC)))
        except OSError as err:
            if fd >= 0:
                os.close(fd)
            failed.append(str(err))

    try:
        worker = threading.Thread(target=inside_new, name="rlvr-sandbox-netns")
        worker.start()
        worker.join()
    except RuntimeError as err:  # no thread to be had
        return None, str(err)
    return (made[0], "") if made else (None, failed[0] if failed else "unshare failed")


def clean(net: SlotNet) -> SlotNet | None:
    """The slot's namespace for its next sample: ``net`` if it holds no socket, else a fresh one
    in its place; None where none can be made or ``net`` cannot be read (bwrap then makes one per
    sample). ``net`` is closed unless returned; it goes when the kernel collects what it holds."""
    try:
        left = net.holds_sockets()
    except OSError:  # unchecked: never used again
        left = None
    if left is False:
        return net
    fresh = make()[0] if left else None
    net.close()
    with contextlib.suppress(OSError):  # a socket released sets the collector of in-flight sockets going
        a, b = socket.socketpair()
        a.close()
        b.close()
    return fresh


@contextlib.contextmanager
def entered(net: SlotNet | None):
    """Within it the calling thread, never the main one, sits in ``net`` (a no-op for None); it is
    back in this process's own namespace (the main thread's, which never moves) before the block
    ends, raising if it cannot be: a thread left behind by such a failure goes home the next time
    it leaves."""
    if net is None:
        yield
        return
    if threading.get_native_id() == os.getpid():
        raise RuntimeError("sandbox: the main thread never enters a slot's network namespace")
    home = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        _call("setns", net.fd, CLONE_NEWNET)
        try:
            yield
        finally:
            try:
                _call("setns", home, CLONE_NEWNET)
            except OSError as err:
                raise RuntimeError(f"sandbox thread could not leave a slot's network namespace ({err})") from err
    finally:
        os.close(home)
