"""Data-parallel learners: N processes (torchrun, or Ray actors) train one model, each a rank.

`Shard` is this process's place among them and the collectives its code runs (sums, gathers,
broadcasts, the agreed stop), `init_learners` joins the process group the launcher started and
`side_group` gives the asynchronous rollout side a group of its own. What the ranks train and save
is `runtime.fsdp`'s (FSDP2 sharding, sharded checkpoints); how a hung or dead rank is named is
`runtime.liveness`'s; the engines that sample across ranks are `engines.ranks`.

Each rank samples its share of every batch and the ranks exchange the samples, so every rank holds
the whole batch: advantages and metrics are the single process's. The no-grad passes (old policy,
reference) and the update split the rows over the ranks, and the passes' log-probs are
all-gathered back into the whole batch; the loss is normalised by the minibatch's global counts
and FSDP2 reduce-scatters the gradients, so the update does not depend on the number of ranks.

Deviations from a production FSDP trainer: every rank holds a full copy of the weights to sample
with (and a full frozen KL reference, outside LoRA); the samples travel as pickled objects
(`all_gather_object`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import os
import re
from dataclasses import dataclass, field

import torch

from rlvr.errors import ConfigError, LearnerLost
from rlvr.runtime.liveness import (
    STOP_KEY,
    behind_ranks,
    collective_error,
    group_store,
    launcher_store,
    silent_ranks,
    start_heartbeat,
)


@dataclass(frozen=True)
class Shard:
    """This process's place among the learners: `rank` of `size` (size 1 = a single process,
    whose methods change nothing); `fsdp`: the model trains FSDP2 shards (any size, one process
    too with `trainer.learners=fsdp`), else it is a plain module. `group`: the process group its
    collectives run on (None = the default one; the asynchronous rollout side's own, `side_group`)."""

    rank: int = 0
    size: int = 1
    fsdp: bool = False
    group: object = field(default=None, compare=False, repr=False)

    def rows(self, count: int) -> slice:
        """This rank's consecutive share of `count` rows (near-equal shares, in rank order)."""
        return slice(count * self.rank // self.size, count * (self.rank + 1) // self.size)

    def micro_batches(self, count: int, size: int) -> list[slice | None]:
        """This rank's share of `count` rows in micro-batches of `size`, as slices of the whole
        batch's rows, as many on every rank (a sharded model's collectives pair up): where a
        shorter share has run out, None (the caller runs a stand-in that adds nothing)."""
        mine, longest = self.rows(count), -(-count // self.size)
        return [slice(mine.start + i, min(mine.start + i + size, mine.stop)) if mine.start + i < mine.stop else None
                for i in range(0, longest, size)]

    def sum(self, values: dict[str, float]) -> dict[str, float]:
        """`values` summed over the ranks, a key a rank lacks counting 0 there: a rank whose rows
        are all expert rows (or none are) has only that side's metric sums (`split_loss`)."""
        if self.size == 1:
            return values
        keys = sorted(set().union(*self.gather(sorted(values))))
        if not keys:
            return values
        total = torch.tensor([values.get(k, 0.0) for k in keys], dtype=torch.float64)
        torch.distributed.all_reduce(total, group=self.group)
        return dict(zip(keys, total.tolist()))

    def broadcast(self, value):
        """Rank 0's `value`, on every rank."""
        if self.size == 1:
            return value
        box = [value]
        torch.distributed.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    def agree_stop(self, received: str | None) -> str | None:
        """The stop every rank takes after this step: the first signal a rank received, or what a
        launcher asked for in the store (`STOP_KEY`: the Ray driver's Ctrl-C); None = go on. A
        collective, so the ranks stop after the same step and none waits in the next one's
        collectives for a peer that stopped."""
        if self.size == 1:
            return received
        store = launcher_store()
        asked = received or (store.get(STOP_KEY).decode() if store.check([STOP_KEY]) else None)
        return next((name for name in self.gather(asked) if name), None)

    def mark(self, step: int, phase: str) -> None:
        """Publish where this rank is (`step`, one of `PHASES`) in the launcher's store: what names
        a hung rank when a collective times out."""
        if self.size > 1:
            group_store().set(f"rlvr/progress/{self.rank}", f"{step} {phase}")

    @contextlib.contextmanager
    def failures(self):
        """A collective that fails (a rank died: its peers' connections close; or one hangs past
        `trainer.collective_timeout_s`) becomes one `LearnerLost` line, naming the ranks whose
        heartbeat stopped (a dead one) or, when every rank still beats, those whose published
        progress (`mark`) is behind the others' (a hung one, with where each rank is)."""
        try:
            yield
        except RuntimeError as err:
            if self.size == 1 or not collective_error(err):
                raise
            silent = silent_ranks(self.rank, self.size)
            behind, where = behind_ranks(self.size)
            if silent:
                who = f"rank(s) {', '.join(map(str, silent))} stopped"
            elif behind:
                who = f"rank(s) {', '.join(map(str, behind))} hung ({where})"
            else:
                who = "another rank stopped answering"
            text = re.sub(r"^\[[^\]]*\]\s*", "", str(err).strip())  # gloo's source location
            first = text.split(". ")[0].splitlines()[0][:160] if text else type(err).__name__
            raise LearnerLost(f"learner rank {self.rank}: {who} (a collective failed: {first}); "
                              "--resume RUN_DIR continues from the last checkpoint") from None

    def share(self, rank: int, count: int) -> int:
        """How many of `count` rows `rank` holds (`rows`)."""
        return count * (rank + 1) // self.size - count * rank // self.size

    def cat_rows(self, parts: dict[str, torch.Tensor], count: int) -> dict[str, torch.Tensor]:
        """{key: (count, ...)}: this rank's share of `count` rows (`parts`, `rows(count)`, every
        rank the same keys and trailing shapes) joined with the other ranks' shares in rank order,
        on every rank (a collective: each share padded to the longest for `all_gather`)."""
        if self.size == 1:
            return parts
        longest, out = -(-count // self.size), {}
        for key in sorted(parts):
            mine = parts[key]
            padded = mine.new_zeros((longest, *mine.shape[1:]))
            padded[:len(mine)] = mine
            gathered = [torch.empty_like(padded) for _ in range(self.size)]
            torch.distributed.all_gather(gathered, padded, group=self.group)
            out[key] = torch.cat([g[:self.share(r, count)] for r, g in enumerate(gathered)])
        return out

    def gather(self, value) -> list:
        """Every rank's `value`, in rank order (on every rank)."""
        if self.size == 1:
            return [value]
        out = [None] * self.size
        torch.distributed.all_gather_object(out, value, group=self.group)
        return out


ONE_PROCESS = Shard()  # a learner alone


def side_group(shard: Shard, timeout_s: float) -> Shard:
    """`shard` on a gloo process group of its own, for the asynchronous rollout side: its thread
    exchanges samples while the learner's thread runs the update's collectives, and on one group
    the two threads' collectives would pair up in a different order on each rank. A collective
    itself: every rank calls it at the same point (the rollout side's start)."""
    if shard.size == 1:
        return shard
    group = torch.distributed.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))
    return dataclasses.replace(shard, group=group)


def launched_world() -> tuple[int, int, int]:
    """(rank, world size, local world size) as torchrun sets them; (0, 1, 1) outside it."""
    env = os.environ
    if env.get("RANK", "0") != "0" and "WORLD_SIZE" not in env:  # torchrun sets them together
        raise ConfigError(f"RANK={env['RANK']} is set without WORLD_SIZE: start the ranks with torchrun "
                          "--nproc_per_node N (it sets both), or unset RANK for one process")
    rank, size, local = (_env_int(env, name, default) for name, default in
                         (("RANK", 0), ("WORLD_SIZE", 1), ("LOCAL_WORLD_SIZE", 1)))
    if size < 1 or not 0 <= rank < size or not 1 <= local <= size:
        raise ConfigError(f"RANK={rank}, WORLD_SIZE={size}, LOCAL_WORLD_SIZE={local}: need 0 <= RANK < WORLD_SIZE "
                          "and 1 <= LOCAL_WORLD_SIZE <= WORLD_SIZE; start the ranks with torchrun, or unset them")
    return rank, size, local


def _env_int(env, name: str, default: int) -> int:
    text = env.get(name, str(default)).strip()
    if not text.isdigit():
        raise ConfigError(f"{name}={env[name]!r} in the environment is not a whole number; torchrun sets it "
                          f"(e.g. {name}={default}), or unset it")
    return int(text)


def init_learners(*, device: torch.device, threads: int, cores: int, timeout_s: float, fsdp: bool = False) -> Shard:
    """Join the process group torchrun started (gloo on CPU, NCCL on CUDA); a single process
    joins nothing unless `fsdp` (`trainer.learners=fsdp`): then it is a group of one, on an
    in-memory store when torchrun did not start it, so the sharded path runs on one device.
    Ranks × threads on one machine must fit its cores (one-line error)."""
    rank, size, local = launched_world()
    if size == 1 and not fsdp:
        return ONE_PROCESS
    if device.type == "cpu" and local * threads > cores:
        fix = (f"start at most {cores} ranks here (torchrun --nproc_per_node {cores})" if local > cores else
               f"set trainer.threads={cores // local} or start fewer ranks")  # threads=1 cannot go lower
        raise ConfigError(f"trainer.threads: {local} ranks x {threads} thread(s) exceed the {cores} cores of this "
                          f"machine; {fix}")
    if not torch.distributed.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            # a Ray learner sees only the GPU Ray gave it (device 0); torchrun's see every GPU of the node
            torch.cuda.set_device(device.index if size == 1 and device.index is not None
                                  else int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
        timeout = datetime.timedelta(seconds=timeout_s)
        if size == 1 and "MASTER_ADDR" not in os.environ:  # no torchrun: nobody else to find
            torch.distributed.init_process_group(backend, store=torch.distributed.HashStore(), rank=0, world_size=1,
                                                 timeout=timeout)
        else:
            torch.distributed.init_process_group(backend, timeout=timeout)
    if size > 1:
        start_heartbeat(rank)
    return Shard(rank, size, fsdp=True)
