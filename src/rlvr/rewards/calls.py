"""How the reward runner calls user functions in the trainer's process: a daemon thread per function
(a call past its deadline is abandoned to it), the calls after a stalled one side by side, async
samples on a loop of their own thread, awaiting with a deadline, and the one-line names of a
function and of its error."""

from __future__ import annotations

import asyncio
import inspect
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

__all__ = ["CallThread", "Deadline", "awaited", "where", "describe", "run_coroutine", "one_shot", "side_by_side",
           "each_awaited"]


class CallThread:
    """One daemon thread running reward calls in order. Daemon: a call that never returns must not
    keep the process alive at exit (a ThreadPoolExecutor's threads are joined at exit)."""

    def __init__(self, name: str):
        self.stuck = False  # a call ran past its deadline: later calls go to a fresh worker
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._serve, name=f"rlvr-reward-{name}", daemon=True).start()

    def submit(self, fn: Callable, args: tuple, kwargs: dict) -> Future:
        future: Future = Future()
        self._jobs.put((future, fn, args, kwargs))
        return future

    def _serve(self) -> None:
        while True:
            future, fn, args, kwargs = self._jobs.get()
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as err:  # noqa: BLE001 - handed to the waiting caller
                future.set_exception(err)
            if self.stuck:  # abandoned: its caller has moved on to a fresh worker
                return


def one_shot(fn: Callable, args: tuple = (), kwargs: dict | None = None) -> Future:
    """`fn(*args, **kwargs)` in a daemon thread of its own, which ends with the call (if it ever does)."""
    future: Future = Future()

    def serve():
        try:
            future.set_result(fn(*args, **(kwargs or {})))
        except BaseException as err:  # noqa: BLE001 - handed to the waiting caller
            future.set_exception(err)
    threading.Thread(target=serve, name="rlvr-reward-call", daemon=True).start()
    return future


class Deadline(Exception):  # noqa: N818 - a marker, never escapes the runner
    """An awaited batched call ran past its deadline (told apart from a TimeoutError the function raises)."""


async def awaited(awaitable, timeout_s: float):
    if not timeout_s:
        return await awaitable
    try:
        return await asyncio.wait_for(awaitable, timeout_s)
    except TimeoutError:  # asyncio's is this builtin since 3.11
        raise Deadline from None


def where(fn: Callable) -> str:
    """`file.py:name` of a function (what `reward.fn` would name it), else its qualified name."""
    name = getattr(fn, "__qualname__", None) or getattr(type(fn), "__qualname__", "")
    try:
        source = inspect.getsourcefile(fn)
    except TypeError:
        source = None
    return f"{Path(source).name}:{name}" if source else name


def describe(err: BaseException) -> str:
    text = str(err).splitlines()[0] if str(err) else ""
    return f"{type(err).__name__}: {text[:200]}"


def run_coroutine(coro):
    """Run a coroutine to completion, also from inside a running event loop (in a thread)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    import concurrent.futures
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def side_by_side(fn: Callable, calls: list[tuple[tuple, dict]], timeout_s: float,
                 timeout_error: str) -> list[tuple[Any, str | None]]:
    """After a call ran out its deadline, the batch's other calls each in a thread of its own, all
    under one more deadline: a function that never returns costs two deadlines a step, not one per
    sample, and every sample still has a whole deadline. (value, None) or (None, error) per call."""
    futures = [one_shot(fn, args, kwargs) for args, kwargs in calls]
    end = time.monotonic() + timeout_s
    out = []
    for future in futures:
        try:
            out.append((future.result(timeout=max(0.0, end - time.monotonic())), None))
        except KeyboardInterrupt:
            raise
        except TimeoutError:
            if not future.done():
                out.append((None, timeout_error))
            elif future.exception() is None:  # it finished just now
                out.append((future.result(), None))
            else:  # the function's own TimeoutError
                out.append((None, describe(future.exception())))
        except BaseException as err:  # noqa: BLE001 - one bad sample must not stop the run
            out.append((None, describe(err)))
    return out


def each_awaited(fn: Callable, calls: list[tuple[tuple, dict]], timeout_s: float,
                 timeout_error: str) -> list[tuple[Any, str | None]]:
    """Every call of an async `fn` concurrently, each under `asyncio.wait_for`, on an event loop in a
    thread of its own that the caller waits for one deadline (plus a second for `wait_for` to fire):
    a coroutine that blocks the loop without awaiting stalls the loop's other samples too, but not
    the step; the samples unanswered by then get `timeout_error` and the loop is abandoned."""
    done: dict[int, tuple[Any, str | None]] = {}

    async def contained(args, kwargs):
        try:  # caught inside the awaited task: asyncio re-raises a task's SystemExit out of the loop
            return await fn(*args, **kwargs), None
        except (KeyboardInterrupt, asyncio.CancelledError):  # Ctrl-C; wait_for's timeout
            raise
        except BaseException as err:  # noqa: BLE001 - SystemExit included: one sample, not the run
            return None, describe(err)

    async def one(i, args, kwargs):
        try:
            done[i] = await awaited(contained(args, kwargs), timeout_s)
        except Deadline:
            done[i] = (None, timeout_error)
        except asyncio.CancelledError as err:  # the function's own, not a timeout
            done[i] = (None, describe(err))

    async def gather():
        await asyncio.gather(*(one(i, args, kwargs) for i, (args, kwargs) in enumerate(calls)))
    if not timeout_s:
        run_coroutine(gather())
    else:
        try:
            one_shot(asyncio.run, (gather(),)).result(timeout=timeout_s + 1.0)
        except TimeoutError:
            pass  # the loop is abandoned to its thread, as a stalled sync call is
    return [done.get(i, (None, timeout_error)) for i in range(len(calls))]
