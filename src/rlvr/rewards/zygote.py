"""The worker processes' side of `rlvr.rewards.workers`: the zygote that forks workers, the worker's
loop (a chunk of calls in, one pickled answer out per call), its limits, and the flag that tells
code it is running in a worker.

A worker sets RLIMIT_AS to its size when forked plus its memory budget, and before each call
RLIMIT_CPU to the CPU time it has used plus the call's budget (SIGXCPU ends it: a backstop for the
trainer's wall-clock deadline). The zygote closes the sockets and pipes it inherited (so their
other ends see EOF when the trainer closes them), ignores Ctrl-C and SIGTERM, replaces the standard streams
(a lock another trainer thread held at the fork stays held in the copy), runs the `PRELOAD`
hooks, and forks a worker per byte it reads on its control socket.
"""

from __future__ import annotations

import importlib
import math
import os
import pickle
import resource
import signal
import socket
import stat
import struct
import sys
import weakref
from collections.abc import Callable
from typing import Any

from rlvr.rewards.calls import describe

__all__ = ["RewardTimeout", "in_worker", "zygote", "main", "send", "import_target", "SPAWNED", "HEADER", "TIMEOUT",
           "MEMORY", "CRASH", "BREACHES", "PRELOAD"]

TIMEOUT, MEMORY, CRASH = "RewardTimeout", "RewardMemory", "RewardCrash"
BREACHES = (TIMEOUT, MEMORY, CRASH)
MAX_REPLY = 1 << 20  # a pickled answer larger than this is the call's error, not the trainer's memory
HEADER = struct.Struct("<Q")

_in_worker = False
PRELOAD: list[Callable[[], None]] = []
"""Run in each forked zygote before it forks workers: imports every worker would otherwise pay for
on its own, after each replacement too (sympy for the math verifier: seconds of a deadline)."""


class RewardTimeout(Exception):  # noqa: N818 - named as the error it becomes
    """Raised by code in a worker that keeps its own, shorter deadline (a symbolic check): the call
    ends as a `TIMEOUT` breach, counted as one, as if the pool had stopped it."""


def in_worker() -> bool:
    """Whether this process is a pool's worker (or zygote): pools here call inline."""
    return _in_worker


def send(sock: socket.socket, data: bytes) -> None:
    sock.sendall(HEADER.pack(len(data)) + data)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    parts, left = [], n
    while left:
        part = sock.recv(min(left, 1 << 20))
        if not part:
            raise EOFError
        parts.append(part)
        left -= len(part)
    return b"".join(parts)


def _limit_memory(memory_mb: int) -> None:
    """RLIMIT_AS = this process's present size + `memory_mb` (a fork of a big trainer starts big)."""
    if memory_mb <= 0:
        return
    with open("/proc/self/status") as f:
        size_kb = next((int(line.split()[1]) for line in f if line.startswith("VmSize:")), 0)
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = size_kb * 1024 + (memory_mb << 20)
    resource.setrlimit(resource.RLIMIT_AS, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard))


def _cpu_budget(seconds: float) -> None:
    """SIGXCPU (which ends the worker) once this call has used `seconds` of CPU more than it had."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    soft = math.ceil(usage.ru_utime + usage.ru_stime + seconds)
    resource.setrlimit(resource.RLIMIT_CPU, (soft if hard == resource.RLIM_INFINITY else min(soft, hard), hard))


def _reply(outcome: tuple[str, Any]) -> bytes:
    try:
        data = pickle.dumps(outcome, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as err:  # noqa: BLE001 - a value that cannot travel is the call's error
        return pickle.dumps(("error", f"TypeError: the result cannot be sent back: {describe(err)}"))
    if len(data) > MAX_REPLY:
        return pickle.dumps(("error", f"ValueError: the result is {len(data)} bytes pickled, over {MAX_REPLY}"))
    return data


def _serve(sock: socket.socket, targets: dict[str, Callable], memory_mb: int) -> None:
    """A worker's loop: a chunk of calls in, one answer out per call, until the socket closes."""
    _limit_memory(memory_mb)
    while True:
        try:
            key, calls, cpu_s = pickle.loads(_recv_exact(sock, HEADER.unpack(_recv_exact(sock, 8))[0]))
        except (EOFError, OSError):
            return
        fn = targets[key]
        for args, kwargs in calls:
            if cpu_s:
                _cpu_budget(cpu_s)
            try:
                outcome = ("ok", fn(*args, **kwargs))
            except MemoryError:
                outcome = ("memory", None)
            except BaseException as err:  # noqa: BLE001 - SystemExit too: this call's error, not the worker's
                outcome = ("error", describe(err))
            # After a MemoryError the worker goes on: what the call built is freed as the error unwinds, and
            # a replacement would cost a fork per memory bomb. One that dies instead (the kernel's OOM
            # killer, a C extension's abort) is replaced by the trainer.
            send(sock, _reply(outcome))


def _close_inherited(keep: set[int]) -> None:
    """Let go of the sockets and pipes inherited from the trainer (another pool's, a sandbox's), so
    that their other ends see EOF when the trainer closes them; regular files stay open.

    Each is replaced by /dev/null under the same number rather than closed: objects and fork hooks
    copied from the trainer still think they own those numbers (a library's wake-up pipe that its
    after-fork hook closes and remakes in every child, a socket in an uncollected cycle), and a freed
    number would be reused by a worker's socket, which they would then close (every reward a crash)."""
    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd in keep or fd <= 2 or fd == null:
            continue
        try:
            mode = os.fstat(fd).st_mode
        except OSError:
            continue
        if stat.S_ISSOCK(mode) or stat.S_ISFIFO(mode):
            os.dup2(null, fd, inheritable=False)
    os.close(null)


def _fresh_fork_hooks() -> None:
    """Empty the lock sets that loguru's fork hooks walk (vLLM imports loguru): the zygote is forked
    from a trainer thread while another may be inside such a walk, and the copied set's iteration
    state then makes every later fork of the zygote spin in the hook. Nothing in the zygote logs."""
    machinery = sys.modules.get("loguru._locks_machinery")
    if machinery is None:
        return
    for name in ("logger_locks", "handler_locks"):
        if hasattr(machinery, name):
            setattr(machinery, name, weakref.WeakSet())


def zygote(ctl: socket.socket, targets: dict[str, Callable], memory_mb: int) -> None:
    """Fork a worker per byte received, hand back its pid and socket; exit when `ctl` closes."""
    global _in_worker
    _in_worker = True
    # Ctrl-C and a scheduler's SIGTERM reach the whole process group: the trainer stops after its step,
    # with the rewards of that step scored, so its workers ignore both and leave when it closes their sockets.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # workers are reaped by the kernel
    _close_inherited({ctl.fileno()})
    # fresh stream objects: a lock held by another trainer thread at the fork stays held in its copy
    sys.stdout = open(1, "w", buffering=1, closefd=False, errors="replace")  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, closefd=False, errors="replace")  # noqa: SIM115
    _fresh_fork_hooks()
    for preload in PRELOAD:
        preload()
    while True:
        try:
            if not ctl.recv(1):
                return
        except OSError:
            return
        mine, theirs = socket.socketpair()
        pid = os.fork()
        if pid == 0:
            ctl.close()
            mine.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            try:
                _serve(theirs, targets, memory_mb)
            finally:
                os._exit(0)
        theirs.close()
        socket.send_fds(ctl, [struct.pack("<i", pid)], [mine.fileno()])
        mine.close()


def import_target(spec: str) -> Callable:
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


SPAWNED = "import sys; from rlvr.rewards.zygote import main; main(sys.argv[1:])"


def main(argv: list[str]) -> None:
    """A spawned zygote: ``python -c SPAWNED FD MEMORY_MB KEY=MODULE:FN ...``."""
    fd, memory_mb, *specs = argv
    targets = {key: import_target(spec) for key, _, spec in (s.partition("=") for s in specs)}
    for fn in targets.values():  # a module's `preload` warms what every worker would import
        preload = getattr(sys.modules[fn.__module__], "preload", None)
        if preload is not None:
            preload()
    zygote(socket.socket(fileno=int(fd)), targets, int(memory_mb))
