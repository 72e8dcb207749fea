"""The seccomp filter bwrap loads (``--seccomp FD``) right before it execs a sandboxed program.

Built with libseccomp (through ``pyseccomp``, a ctypes binding of the same API as libseccomp's
own Python module) and exported as a BPF program once per process. Default action: allow.
Denied with ``EPERM`` (a program sees an ordinary error, not a kill): everything that makes a
kernel namespace or mount, loads code into the kernel, reads or writes another process, or
reaches kernel subsystems a grader never needs. ``clone3`` gets ``ENOSYS`` because its flags sit
in a struct a filter cannot read; glibc then falls back to ``clone``, whose flags it can.
Syscalls of a foreign architecture (the i386 or x32 entry points on x86_64) are killed, which is
libseccomp's default for an architecture not in the filter.

Sockets: an allow-list of address families. ``socket`` and ``socketpair`` get ``EAFNOSUPPORT``
for every family but ``AF_UNIX`` (pipes of ``multiprocessing``, ``asyncio``'s self-pipe), and
``AF_INET``/``AF_INET6`` only in the program built with ``inet`` (a sample's own network
namespace: loopback only). The network namespace does not cover every family (``AF_VSOCK``
shares the machine's port space), hence a list of what is open, not of what is closed. The
family is compared on its low 32 bits, as the kernel reads it (an ``int``): high bits set in the
register do not slip a family past the filter. Families at or above the kernel's ``AF_MAX`` are
refused by the kernel itself.

File events: ``inotify`` on a file every sample shares (under ``/usr``, a device) would tell a
sample when another opens or reads it, a channel between samples running at once; it is refused,
and so are its older form, ``fcntl(F_NOTIFY)`` on a directory, and ``fanotify`` (with the kernel
subsystems above).

Page cache: every sample reads the same ``/usr``, so which of its pages are cached is state two
samples share. The calls that evict a page of a file the sample cannot write
(``posix_fadvise(POSIX_FADV_DONTNEED)``) or probe one without reading it in (``preadv2`` with
``RWF_NOWAIT``, which answers ``EAGAIN`` for a page not cached; Linux AIO, whose requests carry the
same flag where a filter cannot read it; ``cachestat``) are refused, ``EPERM`` (``EOPNOTSUPP`` for
the ``RWF_NOWAIT`` flag, as a kernel without it answers). The kernel itself answers ``mincore`` on
such a file as if every page were cached and skips its pages in ``MADV_PAGEOUT``.
"""

from __future__ import annotations

import errno
import os
import threading

__all__ = ["DENIED", "CLONE_NAMESPACE_FLAGS", "F_NOTIFY", "PAGE_CACHE_FLAGS", "SOCKET_FAMILIES", "INET_FAMILIES",
           "bpf_program", "seccomp_fd"]

DENIED = (
    # namespaces, mounts, root changes
    "unshare", "setns", "mount", "umount", "umount2", "pivot_root", "chroot", "mount_setattr", "move_mount",
    "open_tree", "fsopen", "fsconfig", "fsmount", "fspick",
    # code into the kernel, kernel state
    "bpf", "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load", "reboot",
    "swapon", "swapoff", "acct", "syslog", "quotactl", "settimeofday", "clock_settime", "clock_adjtime",
    "adjtimex", "sethostname", "setdomainname", "iopl", "ioperm", "vhangup", "lookup_dcookie", "nfsservctl",
    # other processes' memory and descriptors (the way to forge bwrap's exit report), tracing
    "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "kcmp", "perf_event_open",
    # kernel subsystems with a record of privilege bugs and no use in a graded program
    "io_uring_setup", "io_uring_enter", "io_uring_register", "keyctl", "add_key", "request_key",
    "userfaultfd", "fanotify_init", "name_to_handle_at", "open_by_handle_at",
    # page-cache probes shared between samples (see above); AIO requests carry RWF_NOWAIT unfiltered
    "cachestat", "io_setup", "io_submit", "process_madvise",
    # file events: another sample's opens and reads of the files all samples share (/usr, the devices)
    "inotify_init", "inotify_init1", "inotify_add_watch",
)
"""Syscalls the filter answers with EPERM."""

CLONE_NAMESPACE_FLAGS = {"CLONE_NEWNS": 0x00020000, "CLONE_NEWCGROUP": 0x02000000, "CLONE_NEWUTS": 0x04000000,
                         "CLONE_NEWIPC": 0x08000000, "CLONE_NEWUSER": 0x10000000, "CLONE_NEWPID": 0x20000000,
                         "CLONE_NEWNET": 0x40000000, "CLONE_NEWTIME": 0x00000080}
"""``clone`` flags that make a namespace: a ``clone`` with any of them set is denied."""

SOCKET_FAMILIES = {"AF_UNIX": 1}
"""Address families every sample may open."""
INET_FAMILIES = {"AF_INET": 2, "AF_INET6": 10}
"""Families opened only where the limits say ``inet``."""
F_NOTIFY = 1026
"""``fcntl`` command of directory notifications (dnotify), denied (EPERM)."""
PAGE_CACHE_FLAGS = {"POSIX_FADV_DONTNEED": 4, "RWF_NOWAIT": 0x8}
"""``fadvise64`` with advice ``POSIX_FADV_DONTNEED`` is denied (EPERM); ``preadv2``/``pwritev2`` with
flag ``RWF_NOWAIT`` get EOPNOTSUPP."""
_FAMILY_SPAN = 64  # above the kernel's AF_MAX (46 in 6.x); the kernel refuses higher ones itself

_lock = threading.Lock()
_programs: dict[bool, bytes] = {}
_error: str | None = None


def _build(inet: bool) -> bytes:
    import pyseccomp as seccomp  # lazily: needs libseccomp.so at import

    f = seccomp.SyscallFilter(defaction=seccomp.ALLOW)
    deny = seccomp.ERRNO(errno.EPERM)
    for name in DENIED:
        try:
            f.add_rule(deny, name)
        except (OSError, RuntimeError, ValueError):  # a syscall this architecture does not have
            pass
    for flag in CLONE_NAMESPACE_FLAGS.values():  # the rules OR together: any one flag denies
        f.add_rule(deny, "clone", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
    f.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
    f.add_rule(deny, "fcntl", seccomp.Arg(1, seccomp.MASKED_EQ, 0xFFFFFFFF, F_NOTIFY))  # (fd, cmd, arg)
    dontneed, nowait = PAGE_CACHE_FLAGS["POSIX_FADV_DONTNEED"], PAGE_CACHE_FLAGS["RWF_NOWAIT"]
    f.add_rule(deny, "fadvise64", seccomp.Arg(3, seccomp.MASKED_EQ, 0xFFFFFFFF, dontneed))  # (fd, off, len, advice)
    for call in ("preadv2", "pwritev2"):  # (fd, iov, iovcnt, pos_l, pos_h, flags)
        f.add_rule(seccomp.ERRNO(errno.EOPNOTSUPP), call, seccomp.Arg(5, seccomp.MASKED_EQ, nowait, nowait))
    allowed = set(SOCKET_FAMILIES.values()) | (set(INET_FAMILIES.values()) if inet else set())
    refuse = seccomp.ERRNO(errno.EAFNOSUPPORT)
    for family in range(_FAMILY_SPAN):
        if family not in allowed:
            for call in ("socket", "socketpair"):
                f.add_rule(refuse, call, seccomp.Arg(0, seccomp.MASKED_EQ, 0xFFFFFFFF, family))
    with os.fdopen(os.memfd_create("rlvr-seccomp"), "w+b") as out:
        f.export_bpf(out)
        out.seek(0)
        return out.read()


def bpf_program(inet: bool = False) -> tuple[bytes | None, str | None]:
    """(the filter as BPF bytes, None) or (None, why it cannot be built here); built once for
    each ``inet`` (whether AF_INET and AF_INET6 sockets are allowed)."""
    global _error
    with _lock:
        if inet not in _programs and _error is None:
            try:
                _programs[inet] = _build(inet)
            except (ImportError, OSError, RuntimeError, ValueError, AttributeError) as err:
                _error = f"{type(err).__name__}: {err}"
        return _programs.get(inet), _error


def seccomp_fd(program: bytes) -> int:
    """A pipe's read end holding ``program``, for ``bwrap --seccomp`` (the caller closes it)."""
    r, w = os.pipe()
    try:
        os.write(w, program)  # a few hundred bytes: well under a pipe's buffer
    finally:
        os.close(w)
    return r
