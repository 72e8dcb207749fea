"""Symbolic math checks (math-verify's LaTeX parser and sympy) in a pool of worker processes.

Sympy can hang or grow without bound on a short adversarial answer (``10^{10^{10}}``, a
nested radical), and while it runs it may hold the GIL. So the checks run in ``math_workers``
processes (`rlvr.rewards.workers`, a zygote started as a fresh interpreter that imports
math-verify once): each check under its own deadline (`symbolic_equal`'s ``timeout_s``; RLIMIT_CPU
as a backstop) and each worker under a memory budget (RLIMIT_AS, ``math_memory_mb`` beyond its size
at start). A check that breaches is "not equal", its worker is killed and replaced, and checks
asked at the same time from other threads go on in the other workers: one bomb costs one
check's deadline. `STATS` counts checks, breaches and forks; `pool_stats()` gives the pool's
cost (wall seconds workers spent on checks).

Inside a reward worker (a process that is itself bounded) the check runs inline, under a
``SIGALRM`` deadline when it runs in the main thread; past it, `workers.RewardTimeout` ends the
reward call as a timeout (reward 0, counted in ``<name>/timeouts``) rather than a silent "not equal".
Sympy code in C ignores the alarm until it returns: the reward's own deadline stops that.

Only math-verify's LaTeX parser is used, never its sympy ``parse_expr`` path (which evaluates
Python expressions built from model text); answers are wrapped in ``$...$``.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable

from rlvr.rewards.workers import BREACHES, PRELOAD, PoolStats, RewardTimeout, WorkerPool, in_worker

__all__ = ["STATS", "configure", "symbolic_equal", "pool_stats", "preload"]

STATS = {"symbolic_checks": 0, "timeouts": 0, "worker_restarts": 0}
"""Process-wide counters: checks asked, checks past their deadline or memory, workers replaced."""

_POOL = WorkerPool({"equal": "rlvr.rewards.math_pool:equal_in_worker"}, size=2, memory_mb=1024, spawn=True,
                   name="math")
_equal: Callable[[str, str], bool] | None = None


def configure(*, workers: int, memory_mb: int) -> None:
    """Size the pool (`reward.math_workers`, `reward.math_memory_mb`); running workers are replaced."""
    global _POOL
    if (workers, memory_mb) != (_POOL.size, _POOL.memory_mb):
        _POOL.close()
        _POOL = WorkerPool(dict(_POOL.targets), size=workers, memory_mb=memory_mb, spawn=True, name="math")


def pool_stats() -> PoolStats:
    return _POOL.stats


def preload() -> None:
    """Import math-verify and sympy once, in the zygote: every worker forked from it has them."""
    global _equal
    if _equal is not None:
        return
    try:
        from math_verify import LatexExtractionConfig, parse, verify
    except ImportError:  # math-verify missing: exact text only (the caller already tried numbers)
        _equal = lambda pred, gold: False  # noqa: E731
        return
    logging.disable(logging.CRITICAL)  # math-verify logs every parse failure
    config = [LatexExtractionConfig(boxed_match_priority=0)]

    def equal(pred: str, gold: str) -> bool:
        g = parse(f"${gold}$", extraction_config=config, parsing_timeout=None)
        p = parse(f"${pred}$", extraction_config=config, parsing_timeout=None)
        return bool(g) and bool(p) and bool(verify(g, p, timeout_seconds=None))

    _equal = equal


PRELOAD.append(preload)  # reward workers that run the math verifier inline have sympy from their zygote


def equal_in_worker(pred: str, gold: str) -> bool:
    """The check itself (the deadline is the caller's); any failure to parse or compare is "not equal"."""
    preload()
    try:
        return _equal(pred, gold)
    except MemoryError:
        raise
    except Exception:  # noqa: BLE001 - a parse or sympy failure means "not shown equal"
        return False


def symbolic_equal(pred: str, gold: str, timeout_s: float) -> bool:
    """Whether math-verify shows `pred` equal to `gold` within `timeout_s` (False past it)."""
    STATS["symbolic_checks"] += 1
    if in_worker():
        return _inline(pred, gold, timeout_s)
    [(value, error)] = _POOL.run("equal", [((pred, gold), {})], timeout_s)
    if error is not None and error.startswith(BREACHES):  # its worker is gone: the next check forks one
        STATS["timeouts"] += 1
        STATS["worker_restarts"] += 1
    return error is None and value is True


class _Alarm(BaseException):  # noqa: N818 - raised by the SIGALRM handler only; not caught as a failure
    pass


def _inline(pred: str, gold: str, timeout_s: float) -> bool:
    """The check in this (already bounded) process; a SIGALRM deadline where signals can be set."""
    if threading.current_thread() is not threading.main_thread() or not timeout_s:
        return equal_in_worker(pred, gold)

    def ring(signum, frame):
        raise _Alarm

    previous = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        return equal_in_worker(pred, gold)
    except _Alarm:
        STATS["timeouts"] += 1
        raise RewardTimeout(f"the symbolic check took longer than {timeout_s:g}s") from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
