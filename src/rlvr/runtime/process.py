"""Process-wide settings a run needs, applied by one explicit call (the CLI and the API make it).

`configure_process(threads=..., thread_mode=..., model_kind=...)` sets torch's intra-op thread
count, starts the row pool when batches are split over worker threads, and keeps freed memory
in glibc's heap. Nothing else in rlvr changes process state, so building components or calling
the math in a notebook never changes the caller's threads or allocator.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from rlvr.config.registries import engine_kind
from rlvr.errors import ConfigError
from rlvr.runtime.allocator import keep_freed_memory
from rlvr.runtime.distributed import ONE_PROCESS, Shard, init_learners, launched_world
from rlvr.runtime.rows import RowPool, configure_threads, resolve_mode


@dataclass(frozen=True)
class Runtime:
    """What `configure_process` set up: the row pool (None = torch's own intra-op threads) and
    whether glibc keeps freed memory mapped."""

    rows: RowPool | None = None
    heap_kept: bool = False
    shard: Shard = ONE_PROCESS  # this process's rank of the data-parallel learners (torchrun)


def configure_process(*, threads: int, thread_mode: str, model_kind: str, shard: Shard = ONE_PROCESS) -> Runtime:
    """Apply `trainer.threads` / `trainer.thread_mode` and the allocator setting to this process."""
    rows = configure_threads(threads, resolve_mode(thread_mode, model_kind))
    return Runtime(rows=rows, heap_kept=keep_freed_memory(), shard=shard)


def configure_for(config) -> Runtime:
    """`configure_process` from a `Config`'s trainer and model sections."""
    mode, threads = config.trainer.thread_mode, config.trainer.threads
    on_cpu = resolve_device(config.trainer.device, config.model.kind).type == "cpu"
    if mode == "auto" and not on_cpu:
        mode = "ops"  # row workers share out CPU work; a batch on a GPU runs whole
    if engine_kind(config).batches_itself and on_cpu:  # vLLM's threads share the cores: more of ours slow both
        mode, threads = "ops", 1
    shard = ONE_PROCESS
    fsdp = config.trainer.learners == "fsdp"
    if launched_world()[1] > 1 or fsdp:  # FSDP2 learners (torchrun, or one forced): torch's threads, rows whole
        mode, threads = "ops", threads or torch.get_num_threads()
        shard = init_learners(device=resolve_device(config.trainer.device, config.model.kind), threads=threads,
                              cores=available_cores(), timeout_s=config.trainer.collective_timeout_s, fsdp=fsdp)
    return configure_process(threads=threads, thread_mode=mode, model_kind=config.model.kind, shard=shard)


def resolve_device(name: str, kind: str = "causal") -> torch.device:
    """`trainer.device`: `auto` is cuda when torch sees a GPU (causal models; diffusion ones run on
    the CPU), else cpu; a cuda device this process cannot use is a one-line ConfigError."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() and kind == "causal" else "cpu")
    device = torch.device(name)
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (device.index or 0) >= count:
            found = f"{count} CUDA device(s)" if count else "no CUDA device (or a CPU-only torch)"
            raise ConfigError(f"trainer.device: '{name}' requested but this process sees {found}; "
                              "use trainer.device=cpu or auto")
    return device


def available_cores(threads: int = 0) -> int:
    """`trainer.threads` when set, else the cores this process may run on."""
    if threads:
        return threads
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def thread_budget(cores: int, *, overlap: bool, rollout_workers: int = 1) -> dict[str, int]:
    """Threads for each role of a run, so that the roles running at the same time never ask for
    more than `cores` in all (two roles each with every core made a 0.12 s torch step take 7-10 s).

    Without `overlap` (the synchronous loop, or `max_staleness=0`, whose rollout and update
    alternate) each role has every core while it runs. With it the learner and the rollout
    workers run together: the learner gets half the cores, the workers share the rest, each
    worker at least one. A reward scorer takes no share of its own: a worker waits while its
    batch is scored, so the scorer runs on the worker's cores."""
    if cores < 1:
        raise ValueError(f"cores must be >= 1, got {cores}")
    if not overlap:
        return {"learner": cores, "rollout_worker": cores, "concurrent": cores}
    if cores < rollout_workers + 1:
        raise ConfigError(f"trainer.max_staleness: overlapping the learner and {rollout_workers} rollout worker(s) "
                          f"needs at least {rollout_workers + 1} cores, this run has {cores}; raise trainer.threads, "
                          "lower trainer.rollout_workers or set trainer.max_staleness=0")
    learner = max(1, cores // 2)
    worker = (cores - learner) // rollout_workers
    return {"learner": learner, "rollout_worker": worker, "concurrent": learner + worker * rollout_workers}
