"""How the learner ranks tell a hung or dead rank from a slow one, and how a launcher stops them.

Each rank beats in the launcher's store (which outlives the ranks) and publishes where it is
(`Shard.mark`: the step and its phase); when a collective fails, the ranks whose beat stopped are
dead and, when all still beat, those behind the furthest one are hung. A launcher outside the
process group (the Ray driver's Ctrl-C) stops every rank after its step by setting `STOP_KEY`.
"""

from __future__ import annotations

import threading
import time

import torch

STOP_KEY = "rlvr/stop"  # a signal's name set here, in the launcher's store, stops every rank after its step
BEAT_S = 1.0  # each rank's heartbeat in the launcher's store, which outlives the ranks
PHASES = ("rollout", "logprob", "update", "weight_sync")  # a step's phases in order (`Shard.mark`)


def group_store():
    """The launcher's store as the process group sees it (keys under its prefix)."""
    return torch.distributed.distributed_c10d._get_default_store()


def launcher_store():
    """The store the ranks met in (torchrun's, or rank 0's TCP store under Ray) without the key
    prefixes the process group and its rendezvous put in front: what a launcher outside writes to."""
    store = group_store()
    while hasattr(store, "underlying_store"):
        store = store.underlying_store
    return store


def start_heartbeat(rank: int) -> None:
    """Beat for `rank` in the launcher's store every `BEAT_S`, on a daemon thread, until the process ends."""
    threading.Thread(target=_beat, args=(rank,), name="rlvr-heartbeat", daemon=True).start()


def _beat(rank: int) -> None:
    store = group_store()
    while True:
        store.set(f"rlvr/beat/{rank}", repr(time.time()))
        time.sleep(BEAT_S)


def silent_ranks(rank: int, size: int) -> list[int]:
    """The other ranks whose heartbeat stopped (read after waiting out a few beats)."""
    time.sleep(3 * BEAT_S)
    store = group_store()
    now, silent = time.time(), []
    for other in range(size):
        key = f"rlvr/beat/{other}"
        if other != rank and (not store.check([key]) or now - float(store.get(key)) > 2.5 * BEAT_S):
            silent.append(other)
    return silent


def behind_ranks(size: int) -> tuple[list[int], str]:
    """(the ranks whose published (step, phase) is behind the furthest rank's, where every rank
    is: "rank 1 at step 2 rollout, rank 0 at step 2 update"); a rank that published nothing yet
    is behind any that did."""
    store, at = group_store(), {}
    for rank in range(size):
        key = f"rlvr/progress/{rank}"
        if store.check([key]):
            step, phase = store.get(key).decode().split()
            at[rank] = (int(step), PHASES.index(phase), phase)
        else:
            at[rank] = (-1, -1, "start")
    front = max(p[:2] for p in at.values())
    behind = [rank for rank, p in at.items() if p[:2] < front]
    order = behind + [rank for rank in at if rank not in behind]
    where = ", ".join(f"rank {r} at step {at[r][0]} {at[r][2]}" if at[r][0] >= 0 else f"rank {r} before step 1"
                      for r in order)
    return behind, where


def collective_error(err: RuntimeError) -> bool:
    """A failure of the process group's transport or a collective's timeout (gloo, NCCL)."""
    text = str(err)
    return isinstance(err, torch.distributed.DistError) or any(
        marker in text for marker in ("gloo", "NCCL", "Connection closed by peer", "Timed out", "timed out"))
