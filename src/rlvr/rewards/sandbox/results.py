"""What a sandbox run is given (``Limits``) and what it reports (``Verdict``, ``RunResult``), and
how an ended run is classified."""

from __future__ import annotations

import enum
import signal
from dataclasses import dataclass, field, replace

__all__ = ["Verdict", "Limits", "RunResult", "classify", "with_limits"]


class Verdict(str, enum.Enum):  # noqa: UP042 - kept: enum.StrEnum would change str()/format() of the members
    """How a program (sandbox) or a test (grader) ended."""

    OK = "OK"  # sandbox only: exited with status 0; the grader turns it into PASS or FAIL
    PASS = "PASS"
    FAIL = "FAIL"
    TIMEOUT = "TIMEOUT"
    MEMORY_LIMIT = "MEMORY_LIMIT"
    OUTPUT_LIMIT = "OUTPUT_LIMIT"
    RESOURCE_LIMIT = "RESOURCE_LIMIT"
    RUNTIME_ERROR = "RUNTIME_ERROR"
    SANDBOX_ERROR = "SANDBOX_ERROR"  # our fault: never a silent zero


@dataclass(frozen=True)
class Limits:
    """Per-program limits. ``cpu_s`` defaults to the wall clock rounded up. The cgroup limits
    (``memory_mb`` for the whole sample, ``nproc`` as ``pids.max``, ``cpus``) apply where the host
    has per-sample cgroups (see ``rlvr.rewards.sandbox.cgroup``)."""

    wall_s: float = 5.0  # wall clock, then SIGKILL of the whole tree
    cpu_s: int | None = None  # RLIMIT_CPU seconds (SIGXCPU), None = ceil(wall_s)
    memory_mb: int = 512  # RLIMIT_AS per process, and the sample's cgroup memory.max (tmpfs and shm included)
    file_mb: int = 16  # RLIMIT_FSIZE: largest file the program may write
    disk_mb: int = 64  # size of the working tmpfs (bwrap) and of /tmp inside
    shm_mb: int = 16  # size of /dev/shm (bwrap)
    nofile: int = 64  # RLIMIT_NOFILE
    nproc: int = 32  # RLIMIT_NPROC for the slot's uid (effective only when not root), and cgroup pids.max
    cpus: float = 1.0  # cgroup cpu.max: CPUs' worth of time the sample may use, however many processes it runs
    output_bytes: int = 1 << 20  # stdout and stderr caps, each; more = OUTPUT_LIMIT
    inet: bool = False  # AF_INET/AF_INET6 sockets (bwrap's seccomp filter; the sample's own netns: loopback only)


@dataclass
class RunResult:
    verdict: Verdict
    returncode: int | None
    stdout: str
    stderr: str
    elapsed: float
    isolation: str
    detail: str = ""  # why, for SANDBOX_ERROR and limit verdicts
    extra: dict = field(default_factory=dict)  # with a cgroup: memory_peak_bytes, oom_kill, memory_max, pids_max,
    # memory_left_bytes (the group's charge once its processes were gone: page cache, kernel memory)


_MEMORY_MARKERS = ("MemoryError", "Cannot allocate memory")  # RLIMIT_AS; ENOMEM at the cgroup's memory.max
_RESOURCE_MARKERS = (
    "Resource temporarily unavailable",  # fork/clone under RLIMIT_NPROC or pids.max
    "can't start new thread",
    "File too large",  # RLIMIT_FSIZE (Python ignores SIGXFSZ and sees EFBIG)
    "Too many open files",
    "No space left on device",
)


def classify(rc, stderr, timed_out, overflow, started, isolation, events=None) -> tuple[Verdict, str]:
    """The verdict of an ended run. ``events`` are the sample cgroup's counters, seen from the
    host: they name a memory or process limit even when the program's own exit status says
    otherwise (the status passes through processes inside the sandbox)."""
    events = events or {}
    if overflow:
        return Verdict.OUTPUT_LIMIT, "stdout or stderr over the cap"
    if events.get("oom_kill"):
        return Verdict.MEMORY_LIMIT, f"cgroup memory limit ({events['oom_kill']} processes killed)"
    tail = stderr[-2000:]
    if timed_out:  # a program that hit a limit and then hung (e.g. live threads) names the limit
        if any(m in tail for m in _MEMORY_MARKERS):
            return Verdict.MEMORY_LIMIT, "MemoryError, then the wall clock"
        if events.get("memory_max"):  # held at its limit (the kernel reclaiming) until the clock ran out
            return Verdict.MEMORY_LIMIT, "cgroup memory limit reached, then the wall clock"
        if events.get("pids_max"):
            return Verdict.RESOURCE_LIMIT, "cgroup process limit, then the wall clock"
        marker = next((m for m in _RESOURCE_MARKERS if m in tail), None)
        return (Verdict.RESOURCE_LIMIT, f"{marker}, then the wall clock") if marker else (Verdict.TIMEOUT, "wall clock")
    if not started:
        return Verdict.SANDBOX_ERROR, f"sandbox did not start: {stderr.strip()[-300:]}"
    if rc == 0:
        return Verdict.OK, ""
    sig = -rc if rc is not None and rc < 0 else (rc - 128 if rc is not None and rc > 128 and isolation != "none" else 0)
    if sig == signal.SIGXCPU:
        return Verdict.TIMEOUT, "cpu limit (SIGXCPU)"
    if sig == signal.SIGXFSZ:
        return Verdict.RESOURCE_LIMIT, "file size limit (SIGXFSZ)"
    if any(m in tail for m in _MEMORY_MARKERS):
        return Verdict.MEMORY_LIMIT, next(m for m in _MEMORY_MARKERS if m in tail)
    for marker in _RESOURCE_MARKERS:
        if marker in tail:
            return Verdict.RESOURCE_LIMIT, marker
    if events.get("pids_max"):
        return Verdict.RESOURCE_LIMIT, "cgroup process limit"
    return Verdict.RUNTIME_ERROR, f"exit status {rc}"


def with_limits(limits: Limits, **changes) -> Limits:
    """A copy of ``limits`` with some fields changed."""
    return replace(limits, **changes)
