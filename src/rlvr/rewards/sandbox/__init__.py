"""Run model-written programs so that they cannot touch the host or starve each other.

Design. Every program runs in its own process tree:

1. **Process layer, always on.** ``Popen`` in a new session with an allow-list environment,
   ``python -E -s -S``, stdin a pipe fed by the parent (never a host file), rlimits applied in
   the exec chain (a ``/bin/sh`` ``ulimit`` line in front of bwrap or at the start gate: CPU,
   address space, file size, open files, processes, no core; no ``preexec_fn``, which is unsafe
   next to threads; see ``launch``), ``oom_score_adj`` 1000 so the
   kernel's OOM killer picks sandboxed code before the trainer, a reader that drains stdout and
   stderr concurrently with a byte cap, a wall-clock ``SIGKILL`` of the process group, then
   ``wait()`` so no zombie is left. The reader's wake-ups are bounded (``launch.WAKE_BURST``):
   its CPU is the trainer's.
2. **A cgroup per sample** (``cgroup``), born into (v1) or joined before the first exec: memory
   for the sample as a whole (tmpfs, shm and memfd pages included, no swap), ``pids.max`` and
   ``cpu.max``, so many processes or sessions cannot add up past one sample's share. Its peak
   memory and limit events are read from the host side into ``RunResult.extra``; it is emptied,
   reclaimed (the page cache and kernel memory it still holds, which would pass to the trainer
   and, the page cache, to the next sample) and removed after the run.
3. **Unprivileged uid per worker slot.** As root, slot ``k`` runs as uid/gid ``uid_range[k]``:
   root ignores ``RLIMIT_NPROC``, and one uid per slot keeps a fork bomb in one sample from
   starving the others. After every run every process of that uid is killed (a backstop that also
   catches ``setsid`` daemons without namespaces), so each range is reserved host-wide (``uids``);
   under bwrap with a cgroup, the sample's pid namespace and its group found empty are the proof
   (nothing of it can leave either) and only bwrap's pid 1 is left to reap (``Sandbox._reaped``).
4. **Namespaces.** ``bwrap`` (bubblewrap) when installed and working: new user (nested user
   namespaces disabled), pid, ipc, uts, cgroup and mount namespaces, and a network namespace of
   the sample's own: as root the slot's, made once and empty, which one sample uses at a time
   (``netns``), else (and with ``Limits.inet``) a fresh one from bwrap; only ``/usr``
   (read-only), a private read-only ``/proc``, a ``/dev`` the sample cannot change (the
   sandbox's device directory, ``devices``, or bwrap's) with a sized ``/dev/shm``, a size-capped
   ``/tmp``; the program's files copied to ``/task`` and the root read-only; a fresh size-capped
   tmpfs as its working directory ``/work``; ``--die-with-parent`` so killing our ``bwrap``
   tears the pid namespace down; a seccomp filter (``seccomp``) that decides every syscall of the
   kernel's table: namespace, mount, tracing, BPF, io_uring, keyring and module syscalls and the
   calls that evict or probe the shared page cache refused, the host's writeback (``sync`` and
   its family) answered without running, an allow-list of socket families (``AF_UNIX``;
   ``AF_INET``/``AF_INET6`` only with ``Limits.inet``). Without bwrap, as root: ``unshare`` of net/pid/ipc/uts
   with a shell as pid 1 (the program must not be pid 1: pid 1 ignores SIGXCPU). Neither: rlimits
   only. Anything short of the full stack prints one loud warning per process, never a silent
   downgrade.

The sandbox reports how a program ended (``Verdict.OK`` = exit status 0, or one of the limit
verdicts); deciding PASS or FAIL is the grader's job (``rlvr.rewards.code``), done outside. The
exit status passes through bwrap's init inside the sandbox, so it is only as trustworthy as the
program (the seccomp filter denies the ``pidfd_getfd``/``ptrace`` route to rewrite it); the limit
verdicts come from the host side (timers, output caps, the cgroup's counters).

Deviation from a full isolation design: remote backends are not implemented.
"""

from rlvr.rewards.sandbox.procs import uid_processes as _uid_processes
from rlvr.rewards.sandbox.results import Limits, RunResult, Verdict, with_limits
from rlvr.rewards.sandbox.sandbox import (
    ISOLATIONS,
    Sandbox,
    SandboxWarning,
    cgroup_host,
    default_python,
    detect_isolation,
)

__all__ = ["ISOLATIONS", "Verdict", "Limits", "RunResult", "Sandbox", "SandboxWarning", "cgroup_host",
           "detect_isolation", "default_python", "with_limits", "_uid_processes"]
