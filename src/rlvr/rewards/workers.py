"""Worker processes for verifiers: every call under its own deadline, a breach costing that call only.

Why processes: a backtracking regex, ``int`` of a million digits, a sympy simplification or any
other C code holds the GIL, so no thread of the trainer can stop it, and a thread cannot be
killed anyway. A process can.

A `WorkerPool` keeps a *zygote*, a process that only forks workers, and up to `size` workers
forked from it. The zygote is either a fork of the calling process made when the pool first
runs (``spawn=False``: closures and objects built in the trainer are there, as they are) or a
fresh interpreter that imports the named ``module:function`` targets once (``spawn=True``: a
clean image; the symbolic math checks). Each worker closes the sockets and pipes it inherited,
ignores Ctrl-C and SIGTERM (the trainer handles them) and exits when the trainer's end of its socket
closes.

`run(key, calls, timeout_s)` hands the calls out in small chunks; a worker answers each call as
it finishes it. A call that runs past `timeout_s` (wall clock; RLIMIT_CPU, reset per call, is a
backstop) or whose worker dies gets an error starting with `TIMEOUT` or `CRASH`: its worker is
killed and replaced, and the calls it had not started go to the others. A call that raises
``MemoryError`` under the worker's memory budget (RLIMIT_AS: the worker's size when forked plus
`memory_mb`) gets a `MEMORY` error and the worker goes on. Once a call holds its worker past
`GRACE_S`, the calls still waiting get a worker each (at most `SURGE` more than `size`), so k
hostile calls run out their deadlines side by side and a batch with k of them ends about one
deadline after it started, not k. A batch in which a call reaches its deadline before any call has
answered is a function that never returns: every call still running or waiting fails with `TIMEOUT`
at once, so such a function costs one deadline per batch, not one per wave of workers.

A zygote that does not hand over a worker within `FORK_S` (`START_S` for its first worker when it
imports first: a spawned zygote's targets, the `PRELOAD` hooks), stopped or stuck, is killed: the
calls of that batch not yet handed out fail with `CRASH` (counted), the calls already running
finish, and the next batch starts a fresh zygote. So a batch ends within its deadline plus one fork
bound, and the run goes on.

Inside a worker, every pool runs its calls inline: the worker itself is the bound. The worker's
side (the zygote, the call loop, the limits) is `rlvr.rewards.zygote`.
"""

from __future__ import annotations

import collections
import math
import os
import pickle
import selectors
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rlvr.rewards.calls import describe
from rlvr.rewards.zygote import (  # noqa: F401  re-exported: the pool's vocabulary is one namespace
    BREACHES,
    CRASH,
    HEADER,
    MEMORY,
    PRELOAD,
    SPAWNED,
    TIMEOUT,
    RewardTimeout,
    import_target,
    in_worker,
    send,
    zygote,
)

__all__ = ["WorkerPool", "PoolStats", "RewardTimeout", "in_worker", "TIMEOUT", "MEMORY", "CRASH", "BREACHES", "PRELOAD"]

GRACE_S = 0.1  # a call running longer than this may be hostile: pending calls get an extra worker
SURGE = 16  # extra workers at most, beyond `size`, while calls hold theirs past GRACE_S
CHUNK = 16  # calls handed to a worker at once at most (one round trip per chunk, not per call)
FORK_S = 10.0  # a zygote's answer to a fork, once it has answered one
START_S = 120.0  # a zygote's first answer: it imports its targets (spawned) and runs the PRELOAD hooks first
STOP_S = 5.0  # a zygote told to exit that has not within this is killed


@dataclass
class PoolStats:
    """What the pool did since it started: calls answered, breaches, workers forked, and the wall
    time workers spent on calls (`busy_s`)."""

    calls: int = 0
    timeouts: int = 0
    memory: int = 0
    crashes: int = 0
    forks: int = 0
    busy_s: float = 0.0



class _Worker:
    """The trainer's handle on one worker: its socket, a pidfd to kill it by, a read buffer."""

    def __init__(self, sock: socket.socket, pid: int, generation: int):
        self.sock, self.pid, self.generation = sock, pid, generation  # generation: of the zygote it came from
        self.pidfd = os.pidfd_open(pid) if hasattr(os, "pidfd_open") else None  # no kill of a reused pid
        self.buffer = bytearray()
        sock.setblocking(False)

    def kill(self) -> None:
        try:
            if self.pidfd is not None:
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            else:
                os.kill(self.pid, signal.SIGKILL)
        except (ProcessLookupError, OSError):
            pass
        self.close()

    def close(self) -> None:
        self.sock.close()
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None

    def answers(self) -> list[tuple[str, Any]] | None:
        """The answers that arrived whole (None: the worker is gone)."""
        try:
            data = self.sock.recv(1 << 20)
        except BlockingIOError:
            return []
        except OSError:
            return None
        if not data:
            return None
        self.buffer += data
        out = []
        while len(self.buffer) >= 8:
            (size,) = HEADER.unpack_from(self.buffer)
            if len(self.buffer) < 8 + size:
                break
            out.append(pickle.loads(bytes(self.buffer[8:8 + size])))
            del self.buffer[:8 + size]
        return out


@dataclass
class _Job:
    """A worker's share of one `run`: the call indices it holds, how many it answered, since when
    it works on the current one."""

    worker: _Worker
    indices: list[int]
    done: int
    started: float
    reclaimed: bool = False  # its unstarted calls went to others: it holds stale calls, not to be reused


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class _ZygoteDown(Exception):
    """The zygote did not hand over a worker in time (stopped, stuck in an import) or died twice."""


class _Processes:
    """A pool's processes, apart from the pool so that a finalizer can end them when the pool is dropped."""

    def __init__(self):
        self.idle: list[_Worker] = []
        self.zygote: tuple[socket.socket, Any] | None = None  # (control socket, pid or Popen)

    def stop_zygote(self, kill: bool = False) -> None:
        """Close the zygote's socket (it exits on EOF); one that does not exit within `STOP_S`, or that
        stopped answering (`kill`), is killed."""
        if self.zygote is None:
            return
        ctl, handle = self.zygote
        self.zygote = None
        ctl.close()
        if isinstance(handle, subprocess.Popen):
            if kill:
                handle.kill()
            try:
                handle.wait(timeout=STOP_S)
            except subprocess.TimeoutExpired:
                handle.kill()
                handle.wait()
            return
        if kill:
            _kill(handle)
        until = time.monotonic() + STOP_S
        try:
            while os.waitpid(handle, os.WNOHANG) == (0, 0):
                if time.monotonic() > until:
                    _kill(handle)
                    os.waitpid(handle, 0)
                    return
                time.sleep(0.01)
        except ChildProcessError:
            pass

    def close(self) -> None:
        if in_worker():  # a worker's copy: the processes are the trainer's
            return
        idle, self.idle = self.idle, []
        for worker in idle:
            worker.kill()
        self.stop_zygote()


class WorkerPool:
    """Up to `size` worker processes running registered targets; see the module doc.

    `targets`: key -> callable (fork mode) or ``"module:function"`` (``spawn=True``).
    """

    def __init__(self, targets: dict[str, Any], *, size: int = 2, memory_mb: int = 0, spawn: bool = False,
                 name: str = "reward"):
        if size < 1:
            raise ValueError(f"{name} workers: need at least 1, got {size}")
        self.targets, self.size, self.memory_mb, self.spawn, self.name = dict(targets), size, memory_mb, spawn, name
        self.stats = PoolStats()
        self._lock = threading.Lock()
        self._procs = _Processes()
        self._zygote_targets: set[str] = set()
        self._generation = 0
        self._answered = False
        self.fork_s, self.start_s = FORK_S, START_S
        weakref.finalize(self, self._procs.close)  # also at exit

    # --- the zygote and the workers

    def register(self, key: str, target: Any) -> None:
        """Add a target; a zygote forked before it knew the key is replaced on the next fork."""
        if self.targets.get(key) is not target:
            self.targets[key] = target

    def _start_zygote(self) -> None:
        self._procs.stop_zygote()
        mine, theirs = socket.socketpair()
        if self.spawn:
            specs = [f"{k}={v}" for k, v in self.targets.items()]
            proc = subprocess.Popen([sys.executable, "-c", SPAWNED, str(theirs.fileno()),
                                     str(self.memory_mb), *specs], pass_fds=[theirs.fileno()],
                                    stdin=subprocess.DEVNULL)
            theirs.close()
            self._procs.zygote = (mine, proc)
        else:
            pid = os.fork()
            if pid == 0:
                try:
                    mine.close()
                    zygote(theirs, self.targets, self.memory_mb)
                finally:
                    os._exit(0)
            theirs.close()
            self._procs.zygote = (mine, pid)
        self._zygote_targets = set(self.targets)
        self._generation += 1
        self._answered = False  # its first answer waits on its imports: `start_s`

    def _fork(self) -> _Worker:
        """A new worker from the zygote (started, or restarted, as needed). Raises `_ZygoteDown` when the
        zygote does not answer within its bound (`fork_s`; `start_s` for a spawned one's first answer),
        killing it, or when a fresh one dies too: the caller fails its batch, the next batch starts anew."""
        with self._lock:
            for attempt in range(2):
                if self._procs.zygote is None or set(self.targets) != self._zygote_targets:
                    self._start_zygote()
                ctl = self._procs.zygote[0]
                # a zygote's first answer waits on its imports (a spawned one's targets, the PRELOAD hooks)
                bound = self.start_s if (self.spawn or PRELOAD) and not self._answered else self.fork_s
                try:
                    ctl.settimeout(bound)
                    ctl.send(b"f")
                    data, fds, _, _ = socket.recv_fds(ctl, 16, 1)
                    if not data or not fds:
                        raise EOFError
                except TimeoutError:
                    self._procs.stop_zygote(kill=True)
                    raise _ZygoteDown(f"the zygote did not fork a worker within {bound:g}s") from None
                except (OSError, EOFError):
                    self._procs.stop_zygote(kill=True)
                    if attempt:
                        raise _ZygoteDown("the zygote process cannot fork workers") from None
                    continue
                self._answered = True
                self.stats.forks += 1
                return _Worker(socket.socket(fileno=fds[0]), struct.unpack("<i", data)[0], self._generation)
        raise AssertionError("unreachable")

    def _checkout(self) -> _Worker:
        with self._lock:
            while self._procs.idle:
                worker = self._procs.idle.pop()
                if worker.generation == self._generation and set(self.targets) == self._zygote_targets:
                    return worker
                worker.kill()  # forked before a target was added: it does not know it
        return self._fork()

    def _give_back(self, worker: _Worker) -> None:
        with self._lock:
            if len(self._procs.idle) < 2 * self.size:  # rewards and is_correct are asked side by side
                self._procs.idle.append(worker)
                return
        worker.kill()  # a surge worker beyond them

    def close(self) -> None:
        with self._lock:
            self._procs.close()

    def __getstate__(self):  # a copy in another process starts its own processes
        return {k: v for k, v in self.__dict__.items() if k not in ("_procs", "_lock")}

    def __setstate__(self, state):
        self.__dict__.update(state, _procs=_Processes(), _lock=threading.Lock(), _zygote_targets=set())
        weakref.finalize(self, self._procs.close)

    # --- running calls

    def run(self, key: str, calls: list[tuple[tuple, dict]], timeout_s: float) -> list[tuple[Any, str | None]]:
        """(value, None) or (None, error) per call, in order; errors of breaches start with
        `TIMEOUT`, `MEMORY` or `CRASH`. ``timeout_s`` = 0: no deadline (memory still bounded)."""
        if in_worker():
            fn = self.targets[key]
            fn = import_target(fn) if isinstance(fn, str) else fn
            return [_inline(fn, args, kwargs) for args, kwargs in calls]
        results: list[tuple[Any, str | None] | None] = [None] * len(calls)
        pending = collections.deque(range(len(calls)))
        jobs: dict[_Worker, _Job] = {}
        cpu_s = timeout_s + 1.0 if timeout_s else 0.0
        with selectors.DefaultSelector() as selector:
            try:
                while pending or jobs:
                    self._hand_out(key, calls, pending, jobs, selector, cpu_s, results)
                    if jobs:  # none: the zygote failed this batch's calls
                        self._wait(jobs, selector, results, pending, timeout_s)
            finally:
                for job in jobs.values():  # interrupted (Ctrl-C): nothing is left running
                    job.worker.kill()
        return results

    def _hand_out(self, key, calls, pending, jobs, selector, cpu_s, results) -> None:
        now = time.monotonic()
        held = 0
        for job in jobs.values():
            if now - job.started <= GRACE_S:
                continue
            held += 1
            if job.done + 1 < len(job.indices):  # calls queued behind a held one go to other workers
                pending.extendleft(reversed(job.indices[job.done + 1:]))
                job.indices, job.reclaimed = job.indices[:job.done + 1], True
        # Once a call is held, hostile calls may be queued too: each of the rest gets a worker of its own
        # (up to SURGE more), so they all run out their deadlines at once instead of one after another.
        while pending and len(jobs) < self.size + (SURGE if held else 0):
            chunk_size = 1 if held else max(1, min(CHUNK, math.ceil(len(pending) / (2 * self.size))))
            indices = [pending.popleft() for _ in range(min(chunk_size, len(pending)))]
            try:
                worker = self._checkout()
            except _ZygoteDown as err:  # this batch's calls not yet handed out fail; running ones go on
                left = [*indices, *pending]
                pending.clear()
                self.stats.crashes += len(left)
                for index in left:
                    results[index] = (None, f"{CRASH}: {self.name} workers: {err}")
                return
            try:
                message = pickle.dumps((key, [calls[i] for i in indices], cpu_s), protocol=pickle.HIGHEST_PROTOCOL)
                worker.sock.setblocking(True)
                send(worker.sock, message)
                worker.sock.setblocking(False)
            except OSError:  # a dead idle worker: its calls go back, a fresh one is forked next
                worker.kill()
                pending.extendleft(reversed(indices))
                continue
            jobs[worker] = _Job(worker, indices, 0, time.monotonic())
            selector.register(worker.sock, selectors.EVENT_READ, worker)

    def _wait(self, jobs, selector, results, pending, timeout_s) -> None:
        now = time.monotonic()
        wakes = [job.started + timeout_s for job in jobs.values()] if timeout_s else []
        if pending:  # a worker held past the grace lets another start
            wakes += [job.started + GRACE_S for job in jobs.values() if now - job.started <= GRACE_S]
        wait = max(0.0, min(wakes) - now) if wakes else None
        for event, _ in selector.select(wait):
            worker = event.data
            job = jobs[worker]
            answers = worker.answers()
            now = time.monotonic()
            for status, value in (answers or [])[:len(job.indices) - job.done]:  # past it: reclaimed calls
                index = job.indices[job.done]
                self.stats.calls += 1
                self.stats.busy_s += now - job.started
                if status == "ok":
                    results[index] = (value, None)
                elif status == "error":
                    results[index] = (None, value)
                else:
                    self.stats.memory += 1
                    results[index] = (None, f"{MEMORY}: over the worker's memory budget of {self.memory_mb} MB")
                job.done += 1
                job.started = now
            if answers is None:
                self._lost(job, jobs, selector, results, pending, timeout_s, killed=False)
            elif job.done == len(job.indices):
                selector.unregister(worker.sock)
                del jobs[worker]
                if job.reclaimed:
                    worker.kill()
                else:
                    self._give_back(worker)
        if timeout_s:
            now = time.monotonic()
            late = [j for j in jobs.values() if now - j.started > timeout_s]
            answered = any(r is not None and not (r[1] or "").startswith(TIMEOUT) for r in results)
            never = bool(late) and not answered
            for job in list(jobs.values()) if never else late:
                self._lost(job, jobs, selector, results, pending, timeout_s, killed=True)
            if never:  # a whole deadline and not one call answered: the function never returns, the step ends
                self.stats.timeouts += len(pending)
                for index in pending:
                    results[index] = (None, f"{TIMEOUT}: not asked: no call of this batch returned within "
                                            f"{timeout_s:g}s")
                pending.clear()

    def _lost(self, job, jobs, selector, results, pending, timeout_s, *, killed: bool) -> None:
        """The job's worker is past its deadline or gone: its current call fails, the rest go back."""
        selector.unregister(job.worker.sock)
        del jobs[job.worker]
        job.worker.kill()
        left = job.indices[job.done:]
        if not left:
            return
        elapsed = time.monotonic() - job.started
        if killed or (timeout_s and elapsed >= timeout_s):  # RLIMIT_CPU ends it a little later
            self.stats.timeouts += 1
            results[left[0]] = (None, f"{TIMEOUT}: took longer than {timeout_s:g}s")
        else:
            self.stats.crashes += 1
            results[left[0]] = (None, f"{CRASH}: the worker process died during the call")
        pending.extendleft(reversed(left[1:]))


def _inline(fn: Callable, args: tuple, kwargs: dict) -> tuple[Any, str | None]:
    try:
        return fn(*args, **kwargs), None
    except MemoryError:
        return None, f"{MEMORY}: out of memory"
    except BaseException as err:  # noqa: BLE001 - the enclosing worker's loop reports it the same way
        return None, describe(err)


