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

Writeback: ``sync``, ``syncfs``, ``fsync``, ``fdatasync`` and ``sync_file_range`` would start the
host's writeback of every dirty page (``sync``) or of a file system the sample shares (``/usr``,
through a read-only descriptor), a host-wide effect at will. They return 0 without running: every
file a sample can write lives on a tmpfs (``/work``, ``/tmp``, ``/dev/shm``), where they do nothing
anyway, so a program that syncs its own files sees what it would see there. ``quotactl_fd`` (the
descriptor form of the named ``quotactl``, whose ``Q_SYNC`` writes back too) and ``modify_ldt``
(a deny-list gap Docker's profile closes) are refused.

Review. Every syscall of the kernel's table for this architecture is a decision: allowed
(``ALLOWED``, by purpose), denied (``DENIED``), given arguments to check (``CHECKED``), answered
without running (``NO_OP``), or absent from the kernel (``ABSENT``, which answers ``ENOSYS`` by
itself). The table is libseccomp's (``SYSCALLS_AFTER_LIBSECCOMP`` adds what the kernel gained after
the libseccomp the project is tested with, by number); numbers past the newest in it
(``FUTURE_SPAN``) get ``ENOSYS``, as from a kernel without them, until someone reviews them.
"""

from __future__ import annotations

import errno
import os
import threading

__all__ = ["DENIED", "ALLOWED", "CHECKED", "NO_OP", "ABSENT", "SYSCALLS_AFTER_LIBSECCOMP", "FUTURE_SPAN",
           "reviewed", "CLONE_NAMESPACE_FLAGS", "F_NOTIFY", "PAGE_CACHE_FLAGS", "SOCKET_FAMILIES", "INET_FAMILIES",
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
    # writeback control of a file system the sample shares; the local descriptor table (Docker denies it)
    "quotactl_fd", "modify_ldt",
    # other processes' and the machine's memory placement, obsolete interfaces, secret memory,
    # the process's security-module labels, mounts and namespaces by newer calls
    "mbind", "set_mempolicy", "set_mempolicy_home_node", "migrate_pages", "move_pages", "uselib", "ustat", "sysfs",
    "memfd_secret", "lsm_set_self_attr", "open_tree_attr", "listns",
)
"""Syscalls the filter answers with EPERM."""

NO_OP = ("sync", "syncfs", "fsync", "fdatasync", "sync_file_range", "sync_file_range2")
"""Writeback calls answered 0 without running (a sample's own files are on tmpfs: nothing to write back)."""

CHECKED = ("clone", "clone3", "fcntl", "fadvise64", "preadv2", "pwritev2", "socket", "socketpair")
"""Syscalls whose arguments decide (the rules in ``_build``; ``clone3`` is ENOSYS whatever they are)."""

ALLOWED = (
    # files and descriptors (writes reach only the sample's tmpfs: the root is read-only)
    "read", "write", "open", "close", "stat", "fstat", "lstat", "lseek", "pread64", "pwrite64", "readv", "writev",
    "access", "pipe", "dup", "dup2", "dup3", "pipe2", "ioctl", "flock", "truncate", "ftruncate", "getdents",
    "getdents64", "getcwd", "chdir", "fchdir", "rename", "renameat", "renameat2", "mkdir", "mkdirat", "rmdir", "creat",
    "link", "linkat", "unlink", "unlinkat", "symlink", "symlinkat", "readlink", "readlinkat", "chmod", "fchmod",
    "fchmodat", "fchmodat2", "chown", "fchown", "lchown", "fchownat", "umask", "utime", "utimes", "futimesat",
    "utimensat", "mknod", "mknodat", "statfs", "fstatfs", "openat", "openat2", "newfstatat", "faccessat",
    "faccessat2", "statx", "readahead", "fallocate", "copy_file_range", "sendfile", "splice", "tee", "vmsplice",
    "close_range", "preadv", "pwritev", "setxattr", "lsetxattr", "fsetxattr", "getxattr", "lgetxattr", "fgetxattr",
    "listxattr", "llistxattr", "flistxattr", "removexattr", "lremovexattr", "fremovexattr", "setxattrat",
    "getxattrat", "listxattrat", "removexattrat", "file_getattr", "file_setattr", "inotify_rm_watch",
    "fanotify_mark", "memfd_create", "statmount", "listmount",
    # memory of the process itself (bounded by its cgroup and rlimits)
    "mmap", "mprotect", "munmap", "brk", "mremap", "msync", "mincore", "madvise", "remap_file_pages", "mlock",
    "munlock", "mlockall", "munlockall", "mlock2", "pkey_mprotect", "pkey_alloc", "pkey_free", "get_mempolicy",
    "map_shadow_stack", "mseal", "membarrier", "process_mrelease",
    # processes, threads, signals (inside the sample's pid namespace)
    "rt_sigaction", "rt_sigprocmask", "rt_sigreturn", "rt_sigpending", "rt_sigtimedwait", "rt_sigqueueinfo",
    "rt_sigsuspend", "rt_tgsigqueueinfo", "sigaltstack", "fork", "vfork", "execve", "execveat", "exit", "exit_group",
    "wait4", "waitid", "kill", "tkill", "tgkill", "getpid", "getppid", "gettid", "getpgrp", "getpgid", "setpgid",
    "getsid", "setsid", "set_tid_address", "set_robust_list", "get_robust_list", "restart_syscall", "arch_prctl",
    "set_thread_area", "get_thread_area", "prctl", "personality", "seccomp", "rseq", "pidfd_open",
    "pidfd_send_signal", "signalfd", "signalfd4", "futex", "futex_waitv", "futex_wake", "futex_wait",
    "futex_requeue", "uprobe", "uretprobe", "landlock_create_ruleset", "landlock_add_rule", "landlock_restrict_self",
    # identity: the sample's own ids in its user namespace (no capability outside it)
    "getuid", "getgid", "geteuid", "getegid", "setuid", "setgid", "setreuid", "setregid", "getgroups", "setgroups",
    "setresuid", "getresuid", "setresgid", "getresgid", "setfsuid", "setfsgid", "capget", "capset",
    "lsm_get_self_attr", "lsm_list_modules",
    # limits and scheduling (raising a hard limit or a real-time class needs a capability it lacks)
    "getrlimit", "setrlimit", "prlimit64", "getrusage", "getpriority", "setpriority", "sched_yield",
    "sched_setparam", "sched_getparam", "sched_setscheduler", "sched_getscheduler", "sched_get_priority_max",
    "sched_get_priority_min", "sched_rr_get_interval", "sched_setaffinity", "sched_getaffinity", "sched_setattr",
    "sched_getattr", "ioprio_set", "ioprio_get", "getcpu",
    # time and waiting
    "nanosleep", "clock_nanosleep", "clock_gettime", "clock_getres", "gettimeofday", "time", "times", "alarm",
    "getitimer", "setitimer", "timer_create", "timer_settime", "timer_gettime", "timer_getoverrun", "timer_delete",
    "timerfd_create", "timerfd_settime", "timerfd_gettime", "pause", "poll", "ppoll", "select", "pselect6",
    "epoll_create", "epoll_create1", "epoll_ctl", "epoll_wait", "epoll_pwait", "epoll_pwait2", "eventfd",
    "eventfd2", "sysinfo", "uname", "getrandom",
    # System V and POSIX IPC (the sample's own ipc namespace), sockets of the allowed families
    "shmget", "shmat", "shmctl", "shmdt", "semget", "semop", "semctl", "semtimedop", "msgget", "msgsnd", "msgrcv",
    "msgctl", "mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive", "mq_notify", "mq_getsetattr", "connect",
    "accept", "accept4", "sendto", "recvfrom", "sendmsg", "recvmsg", "sendmmsg", "recvmmsg", "shutdown", "bind",
    "listen", "getsockname", "getpeername", "setsockopt", "getsockopt",
    # Linux AIO's teardown and reads of requests (io_setup and io_submit are denied: no context to use them on)
    "io_destroy", "io_getevents", "io_pgetevents", "io_cancel",
)
"""Syscalls reviewed and allowed (the filter's default action, so this list is the review, not a rule)."""

ABSENT = ("_sysctl", "create_module", "get_kernel_syms", "query_module", "getpmsg", "putpmsg", "afs_syscall",
          "tuxcall", "security", "vserver", "epoll_ctl_old", "epoll_wait_old")
"""Numbers of the table the kernel does not implement (it answers ENOSYS itself)."""

SYSCALLS_AFTER_LIBSECCOMP = {"uretprobe": 335, "uprobe": 336, "statmount": 457, "listmount": 458,
                             "lsm_get_self_attr": 459, "lsm_set_self_attr": 460, "lsm_list_modules": 461,
                             "mseal": 462, "setxattrat": 463, "getxattrat": 464, "listxattrat": 465,
                             "removexattrat": 466, "open_tree_attr": 467, "file_getattr": 468, "file_setattr": 469,
                             "listns": 470}
"""x86_64 syscalls newer than libseccomp 2.5.4's table, by number (the kernel's ``syscall_64.tbl``)."""
FUTURE_SPAN = (471, 512)
"""x86_64 numbers not reviewed yet (up to the x32 range): ENOSYS, as a kernel without them answers."""


def reviewed() -> set[str]:
    """Every syscall name the policy decides."""
    return set(ALLOWED) | set(DENIED) | set(NO_OP) | set(CHECKED) | set(ABSENT)


def _native_number(name: str) -> int | str:
    """The number for a syscall libseccomp does not know (x86_64 only), else the name itself."""
    if name in SYSCALLS_AFTER_LIBSECCOMP and os.uname().machine == "x86_64":
        return SYSCALLS_AFTER_LIBSECCOMP[name]
    return name

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
    try:
        f.set_attr(seccomp.Attr.CTL_OPTIMIZE, 2)  # a binary tree over the syscall numbers, not a linear chain
    except (OSError, RuntimeError, ValueError):  # libseccomp before 2.5: the chain
        pass
    deny = seccomp.ERRNO(errno.EPERM)
    for action, names in ((deny, DENIED), (seccomp.ERRNO(0), NO_OP)):
        for name in names:
            try:
                f.add_rule(action, _native_number(name))
            except (OSError, RuntimeError, ValueError):  # a syscall this architecture does not have
                pass
    if os.uname().machine == "x86_64":
        for number in range(*FUTURE_SPAN):
            f.add_rule(seccomp.ERRNO(errno.ENOSYS), number)
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
