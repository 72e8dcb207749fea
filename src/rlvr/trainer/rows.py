"""Row parallelism (`trainer.thread_mode=rows`): each worker thread takes a share of a batch's rows
and runs its torch ops single-threaded.

At rlvr's home scale one op is small (a few thousand rows of width 128). torch's intra-op threads
split every op and meet at a barrier after it, which costs about what they save. Rows are
independent in sampling (each row has its own seed) and in the loss (the gradient is a sum over
rows), so giving each core whole rows changes neither the samples nor the gradients beyond float
summation order, and no op waits for another core. ATen ops, the C++ sampling loop and the C++
training layers release the GIL, so the workers run at the same time. Measured: a step takes ≈ 17% less
time than with intra-op threads on a quiet machine with the C++ layers (docs/results.md §2), and 2.8×
faster when another process holds a core (measured with the eager layers). The default
(`thread_mode=auto`) for causal models.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import torch

from rlvr.batch import Rollouts, concat_rollouts
from rlvr.kernels.decoder import shared_weights


class RowPool:
    """`map(fn, rows)` runs `fn(slice)` on `workers` consecutive slices of `rows` rows in worker
    threads and returns the results in row order."""

    def __init__(self, workers: int):
        if workers < 2:
            raise ValueError(f"a row pool needs at least 2 workers, got {workers}")
        self.workers = workers
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

        return list(self._executor.map(run, self.slices(rows)))


def resolve_mode(mode: str, model_kind: str) -> str:
    """`trainer.thread_mode=auto`: rows for causal models (the faster mode wherever it was measured,
    docs/results.md §2), ops for diffusion models (whose batches are not split)."""
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


def split_engine(engine, pool: RowPool, pad_id: int, model=None):
    """A rollout engine that samples each worker's share of the rows and stacks the results
    (same samples as the whole batch: every row has its own seed). With `model` the workers'
    decoders prepare its weights once per batch (`kernels.decoder.shared_weights`)."""

    def run(prompt_ids, prompt_mask, seeds, **kwargs) -> Rollouts:
        with shared_weights(model) if model is not None else contextlib.nullcontext():
            parts = pool.map(lambda rows: engine(prompt_ids[rows], prompt_mask[rows], seeds[rows], **kwargs),
                             len(seeds))
        return concat_rollouts(parts, pad_id) if parts else engine(prompt_ids, prompt_mask, seeds, **kwargs)

    return run
