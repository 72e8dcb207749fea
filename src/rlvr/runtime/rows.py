"""Row parallelism (`trainer.thread_mode=rows`): each worker thread takes a share of a batch's rows
and runs its torch ops single-threaded.

At rlvr's home scale one op is small (a few thousand rows of width 128). torch's intra-op threads
split every op and meet at a barrier after it, which costs about what they save. Rows are
independent in sampling (each row has its own seed) and in the loss (the gradient is a sum over
rows), so giving each core whole rows changes neither the samples nor the gradients beyond float
summation order, and no op waits for another core. ATen ops, the C++ sampling loop and the C++
training layers release the GIL, so the workers run at the same time. Measured: a step takes ≈ 17% less
time than with intra-op threads on a quiet machine with the C++ layers (docs/results/systems.md §2), and 2.8×
faster when another process holds a core (measured with the eager layers). The default
(`thread_mode=auto`) for causal models.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import torch

_HOLDING = threading.local()  # .lease: the CoreLease whose core this thread holds (or held last)


@contextlib.contextmanager
def waiting():
    """A block that waits and computes nothing here (a tool's round trip, a sandboxed process):
    the core this thread holds of a `CoreLease` given back for it, so the other side computes on
    it; a no-op in a thread that holds none (the synchronous loop)."""
    lease = getattr(_HOLDING, "lease", None)
    with lease.released() if lease is not None else contextlib.nullcontext():
        yield


class CoreLease:
    """The cores of a process shared by the sides that compute at the same time (the asynchronous
    learner and rollout side): each holds one core while it works (`held`), and a row pool's map
    borrows free ones for its other slices, at its start or as they free up, so the threads
    computing never outnumber the cores while a side that waits (for a batch, for queue space)
    leaves its core to the other. A side asking for its core stops new borrowing until it has it
    (without that the learner, borrowing again at every micro-batch, could starve the rollout side)."""

    def __init__(self, cores: int):
        self.cores, self._free, self._asking, self._wanting = cores, cores, 0, []
        self._cond = threading.Condition()
        self._mine = threading.local()

    @contextlib.contextmanager
    def held(self):
        """One core for this thread for the block (no-op when it holds one already)."""
        if getattr(self._mine, "held", False):
            yield
            return
        self._take_one()
        try:
            yield
        finally:
            self._mine.held = False
            self._give_back(1)

    @contextlib.contextmanager
    def released(self):
        """This thread's core given back for the block, taken again after (no-op when it holds
        none): for a wait that computes nothing here, a judge or a sandboxed test run."""
        if not getattr(self._mine, "held", False):
            yield
            return
        self._mine.held = False
        self._give_back(1)
        try:
            yield
        finally:
            self._take_one()

    def _take_one(self) -> None:
        with self._cond:
            self._asking += 1
            self._cond.wait_for(lambda: self._free > 0)
            self._asking -= 1
            self._free -= 1
        self._mine.held = True
        _HOLDING.lease = self

    def borrow(self, most: int) -> int:
        """Up to `most` free cores, without waiting: how many were taken (give them back after)."""
        with self._cond:
            taken = 0 if self._asking else max(0, min(most, self._free))
            self._free -= taken
            return taken

    def want(self, take: Callable[[], None], wanted: bool = True) -> None:
        """While wanted, a core that frees up with nobody asking goes to `take()` (which gives it back)."""
        with self._cond:
            if wanted:
                self._wanting.append(take)
            elif take in self._wanting:
                self._wanting.remove(take)
        if wanted:
            self._give_back(0)

    def _give_back(self, count: int) -> None:
        with self._cond:
            self._free += count
            handed = []
            while self._free and not self._asking and self._wanting:
                self._free -= 1
                handed.append(self._wanting.pop(0))
            self._cond.notify_all()
        for take in handed:
            take()


class RowPool:
    """`map(fn, rows)` runs `fn(slice)` on `workers` consecutive slices of `rows` rows in worker
    threads and returns the results in row order.

    With a `lease` (`CoreLease`) the slices run on as many threads at once as the caller's core
    and the free ones it can borrow: the slices and their results are the same either way."""

    def __init__(self, workers: int, lease: CoreLease | None = None):
        if workers < 2:
            raise ValueError(f"a row pool needs at least 2 workers, got {workers}")
        self.workers, self.lease = workers, lease
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix="rlvr-rows")

    def slices(self, rows: int) -> list[slice]:
        """Consecutive, near-equal, non-empty slices covering `rows` rows."""
        bounds = [rows * i // self.workers for i in range(self.workers + 1)]
        return [slice(a, b) for a, b in itertools.pairwise(bounds) if b > a]

    def map(self, fn: Callable[[slice], object], rows: int) -> list:
        # Grad mode is thread-local: a worker must run under the caller's (no_grad for sampling).
        grad = torch.is_grad_enabled()

        def run(part: slice):
            with torch.set_grad_enabled(grad):
                return fn(part)

        if self.lease is None:
            return list(self._executor.map(run, self.slices(rows)))
        return self._leased(run, self.slices(rows)) if rows else []

    def _leased(self, run: Callable, parts: list[slice]) -> list:
        """The slices on the caller's core and on every core the lease hands over before they are done."""
        results: dict[int, object] = {}
        todo, done = list(reversed(range(len(parts)))), threading.Condition()

        def lane(borrowed: bool) -> None:
            try:
                while True:
                    with done:
                        if not todo:
                            return
                        j = todo.pop()
                    try:
                        out = run(parts[j])
                    except BaseException as err:  # re-raised by the caller
                        out = err
                    with done:
                        results[j] = out
                        done.notify_all()
            finally:
                if borrowed:
                    self.lease._give_back(1)

        def take() -> None:  # a core handed over (once per `want`): a lane while slices wait, else back
            with done:
                more = len(todo)
                if more:
                    self._executor.submit(lane, True)
            if not more:
                self.lease._give_back(1)
            elif more > 1:
                self.lease.want(take)

        with self.lease.held():
            self._executor.submit(lane, False)  # on the caller's core, which waits meanwhile
            for _ in range(self.lease.borrow(len(parts) - 1)):
                self._executor.submit(lane, True)
            self.lease.want(take)
            try:
                with done:
                    done.wait_for(lambda: len(results) == len(parts))
            finally:
                self.lease.want(take, wanted=False)
        for out in results.values():
            if isinstance(out, BaseException):
                raise out
        return [results[j] for j in range(len(parts))]


def resolve_mode(mode: str, model_kind: str) -> str:
    """`trainer.thread_mode=auto`: rows for causal models (the faster mode wherever it was measured,
    docs/results/systems.md §2), ops for diffusion models (whose batches are not split)."""
    if mode != "auto":
        return mode
    return "rows" if model_kind == "causal" else "ops"


def configure_threads(threads: int, mode: str) -> RowPool | None:
    """Apply `trainer.threads` / `trainer.thread_mode` to torch; the row pool when rows are split.

    `ops`: torch's intra-op threads (0 = torch's default). `rows`: that many workers (0 = torch's
    default count), each with one intra-op thread; a single worker is simply a 1-thread run."""
    if mode == "ops":
        if threads:
            torch.set_num_threads(threads)
        return None
    workers = threads or torch.get_num_threads()
    torch.set_num_threads(1)
    return RowPool(workers) if workers > 1 else None
