"""How the reward runner calls user functions: a daemon thread per function (a call past its
deadline is abandoned to it), awaiting with a deadline, and the one-line names of a function and
of its error."""

from __future__ import annotations

import asyncio
import inspect
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path

__all__ = ["CallThread", "Deadline", "awaited", "where", "describe", "run_coroutine", "one_shot"]


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
