"""A rollout engine in a process of its own, which the trainer's process drives through a pipe.

What data-parallel learners need for an engine that joins torch.distributed itself (vLLM builds
its world group over the process's default group: in a learner rank, whose default group is the
learners', `LLM()` then waits for peers that never join). The child is spawned, not forked, so it
starts without the learners' process group, and without torchrun's rendezvous variables.

`SpawnedEngine(factory)`: `factory()` builds the engine in the child (a picklable callable: the
engine's class with its arguments); calls, `push_weights` and `close` go to it, and an error there
comes back as the same exception type with the child's message.
"""

from __future__ import annotations

import multiprocessing
import os

# torchrun's variables: a child that saw them would take itself for a rank of the learners' group
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
                 "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT")


def _serve(factory, conn, threads: int) -> None:
    """The child: build the engine, then answer (method, args, kwargs) until "close"."""
    for name in LAUNCHER_VARS:
        os.environ.pop(name, None)
    import torch

    torch.set_num_threads(threads)
    try:
        engine = factory()
    except Exception as err:  # noqa: BLE001 - reported to the parent, which raises it
        conn.send((type(err), str(err)))
        return
    conn.send(None)
    while True:
        method, args, kwargs = conn.recv()
        try:
            result = getattr(engine, method)(*args, **kwargs)
        except Exception as err:  # noqa: BLE001
            conn.send((False, (type(err), str(err))))
            continue
        conn.send((True, result))
        if method == "close":
            return


def _reraise(kind: type, message: str):
    """The child's exception again in this process: its type where one message builds it."""
    try:
        error = kind(message)
    except Exception:  # noqa: BLE001 - a type with another constructor
        error = RuntimeError(f"{kind.__name__}: {message}")
    raise error


class SpawnedEngine:
    """`factory()`'s engine in a spawned child process; the same calls as the engine itself."""

    def __init__(self, factory, *, threads: int = 1):
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self._process = context.Process(target=_serve, args=(factory, child, threads), name="rlvr-engine",
                                        daemon=True)
        self._process.start()
        child.close()
        failed = self._receive()
        if failed is not None:
            self._process.join()
            _reraise(*failed)

    def _receive(self):
        try:
            return self._conn.recv()
        except EOFError:
            raise RuntimeError(f"rollout engine process exited with code {self._process.exitcode}") from None

    def _call(self, method: str, *args, **kwargs):
        self._conn.send((method, args, kwargs))
        ok, result = self._receive()
        if not ok:
            _reraise(*result)
        return result

    def __call__(self, prompt_ids, prompt_mask, seeds, *, temperature):
        return self._call("__call__", prompt_ids, prompt_mask, seeds, temperature=temperature)

    def push_weights(self, named_tensors, version: int) -> None:
        self._call("push_weights", [(name, t.detach()) for name, t in named_tensors], version)

    def close(self) -> None:
        """Shut the engine down and wait for its process (idempotent)."""
        if self._process.is_alive():
            self._call("close")
            self._process.join()
