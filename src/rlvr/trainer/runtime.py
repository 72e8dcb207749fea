"""Process-wide settings a run needs, applied by one explicit call (the CLI and the API make it).

`configure_process(threads=..., thread_mode=..., model_kind=...)` sets torch's intra-op thread
count, starts the row pool when batches are split over worker threads, and keeps freed memory
in glibc's heap. Nothing else in rlvr changes process state, so building components or calling
the math in a notebook never changes the caller's threads or allocator.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlvr.trainer.allocator import keep_freed_memory
from rlvr.trainer.rows import RowPool, configure_threads, resolve_mode


@dataclass(frozen=True)
class Runtime:
    """What `configure_process` set up: the row pool (None = torch's own intra-op threads) and
    whether glibc keeps freed memory mapped."""

    rows: RowPool | None = None
    heap_kept: bool = False


def configure_process(*, threads: int, thread_mode: str, model_kind: str) -> Runtime:
    """Apply `trainer.threads` / `trainer.thread_mode` and the allocator setting to this process."""
    rows = configure_threads(threads, resolve_mode(thread_mode, model_kind))
    return Runtime(rows=rows, heap_kept=keep_freed_memory())


def configure_for(config) -> Runtime:
    """`configure_process` from a `Config`'s trainer and model sections."""
    from rlvr.trainer.build import resolve_device

    mode, threads = config.trainer.thread_mode, config.trainer.threads
    on_cpu = resolve_device(config.trainer.device, config.model.kind).type == "cpu"
    if mode == "auto" and not on_cpu:
        mode = "ops"  # row workers share out CPU work; a batch on a GPU runs whole
    if config.rollout.engine == "vllm" and on_cpu:  # vLLM's threads share the cores: more of ours slow both
        mode, threads = "ops", 1
    return configure_process(threads=threads, thread_mode=mode, model_kind=config.model.kind)
