"""Data-parallel learners: N processes (torchrun) train one model with FSDP2.

Each rank samples its share of every batch (`RankEngine`: the rows' seeds are the ones a single
process gives them, so the union of the ranks' samples is the single process's batch) and the
ranks exchange the samples, so every rank holds the whole batch: advantages and metrics are the
single process's. The no-grad passes (old policy, reference) and the update split the rows over
the ranks, and the passes' log-probs are all-gathered back into the whole batch;
the loss is normalised by the minibatch's global counts and FSDP2 reduce-scatters the gradients,
so the update does not depend on the number of ranks. The rollout engine samples from a plain
(unsharded) copy of the model, whose trained weights (under LoRA the adapters only) are gathered
from the shards after every step. An engine with weights of its own (vLLM) is rank 0's alone
(`LeadEngine`): it samples each batch whole and broadcasts it, and takes the gathered weights.
So are Ray rollout workers (`trainer.rollout_workers` under `trainer.ray_learners`), and Ray
reward workers score each batch whole on rank 0 (`LeadReward`), as the one Ray process does.

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
import threading
import time
import warnings
from dataclasses import dataclass, field

import torch

from rlvr.batch import Rollouts, concat_rollouts
from rlvr.errors import ConfigError, LearnerLost
from rlvr.models.lora import merged_weights
from rlvr.runtime.safe_load import load_sharded


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
            _store().set(f"rlvr/progress/{self.rank}", f"{step} {phase}")

    @contextlib.contextmanager
    def failures(self):
        """A collective that fails (a rank died: its peers' connections close; or one hangs past
        `trainer.collective_timeout_s`) becomes one `LearnerLost` line, naming the ranks whose
        heartbeat stopped (a dead one) or, when every rank still beats, those whose published
        progress (`mark`) is behind the others' (a hung one, with where each rank is)."""
        try:
            yield
        except RuntimeError as err:
            if self.size == 1 or not _collective_error(err):
                raise
            silent = silent_ranks(self)
            behind, where = behind_ranks(self)
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


def scalar(value) -> float:
    """A float from a tensor that may be a `DTensor` (the grad norm of sharded parameters)."""
    return float(value.full_tensor() if hasattr(value, "full_tensor") else value)


def launched_world() -> tuple[int, int, int]:
    """(rank, world size, local world size) as torchrun sets them; (0, 1, 1) outside it."""
    env = os.environ
    return int(env.get("RANK", 0)), int(env.get("WORLD_SIZE", 1)), int(env.get("LOCAL_WORLD_SIZE", 1))


def init_learners(*, device: torch.device, threads: int, cores: int, timeout_s: float, fsdp: bool = False) -> Shard:
    """Join the process group torchrun started (gloo on CPU, NCCL on CUDA); a single process
    joins nothing unless `fsdp` (`trainer.learners=fsdp`): then it is a group of one, on an
    in-memory store when torchrun did not start it, so the sharded path runs on one device.
    Ranks × threads on one machine must fit its cores (one-line error)."""
    rank, size, local = launched_world()
    if size == 1 and not fsdp:
        return ONE_PROCESS
    if device.type == "cpu" and local * threads > cores:
        raise ConfigError(f"trainer.threads: {local} ranks x {threads} thread(s) exceed the {cores} cores of this "
                          f"machine; set trainer.threads={max(1, cores // local)} or start fewer ranks")
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
        threading.Thread(target=_beat, args=(rank,), name="rlvr-heartbeat", daemon=True).start()
    return Shard(rank, size, fsdp=True)


STOP_KEY = "rlvr/stop"  # a signal's name set here, in the launcher's store, stops every rank after its step
BEAT_S = 1.0  # each rank's heartbeat in the launcher's store, which outlives the ranks
PHASES = ("rollout", "logprob", "update", "weight_sync")  # a step's phases in order (`Shard.mark`)


def _store():
    return torch.distributed.distributed_c10d._get_default_store()


def launcher_store():
    """The store the ranks met in (torchrun's, or rank 0's TCP store under Ray) without the key
    prefixes the process group and its rendezvous put in front: what a launcher outside writes to."""
    store = _store()
    while hasattr(store, "underlying_store"):
        store = store.underlying_store
    return store


def _beat(rank: int) -> None:
    store = _store()
    while True:
        store.set(f"rlvr/beat/{rank}", repr(time.time()))
        time.sleep(BEAT_S)


def silent_ranks(shard: Shard) -> list[int]:
    """The other ranks whose heartbeat stopped (read after waiting out a few beats)."""
    time.sleep(3 * BEAT_S)
    store = _store()
    now, silent = time.time(), []
    for rank in range(shard.size):
        key = f"rlvr/beat/{rank}"
        if rank != shard.rank and (not store.check([key]) or now - float(store.get(key)) > 2.5 * BEAT_S):
            silent.append(rank)
    return silent


def behind_ranks(shard: Shard) -> tuple[list[int], str]:
    """(the ranks whose published (step, phase) is behind the furthest rank's, where every rank
    is: "rank 1 at step 2 rollout, rank 0 at step 2 update"); a rank that published nothing yet
    is behind any that did."""
    store, at = _store(), {}
    for rank in range(shard.size):
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


def _collective_error(err: RuntimeError) -> bool:
    """A failure of the process group's transport or a collective's timeout (gloo, NCCL)."""
    text = str(err)
    return isinstance(err, torch.distributed.DistError) or any(
        marker in text for marker in ("gloo", "NCCL", "Connection closed by peer", "Timed out", "timed out"))


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated blocks of a transformer (`model.layers`, GPT-2's `transformer.h`, ...): the
    children of the largest `ModuleList`."""
    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList)]
    return list(max(lists, key=len)) if lists else []


def shard_model(model: torch.nn.Module, *, param_dtype: torch.dtype | None = None,
                reduce_dtype: torch.dtype | None = None, offload: bool = False,
                in_float32: tuple[torch.nn.Module, ...] = ()) -> torch.nn.Module:
    """FSDP2 full sharding: one group per decoder layer, then the root (embeddings, head, norm).
    `param_dtype` / `reduce_dtype` (None = the parameters' own): the dtype each layer is gathered
    and computed in and the one its gradients are reduce-scattered in (`MixedPrecisionPolicy`;
    the shards and the optimizer keep the model's dtype). `offload`: the shards, their gradients
    and the optimizer's states live in CPU memory between uses (`CPUOffloadPolicy`, a GPU run).
    `in_float32`: submodules that are groups of their own, gathered, computed and reduced in
    float32 whatever `param_dtype` says (a critic's value head)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    offload_policy = CPUOffloadPolicy() if offload else OffloadPolicy()
    policies = {"mp_policy": MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype),
                "offload_policy": offload_policy}
    for layer in decoder_layers(model):
        fully_shard(layer, **policies)
    for module in in_float32:
        fully_shard(module, mp_policy=MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32),
                    offload_policy=offload_policy)
    fully_shard(model, **policies)
    return model


def full_weights(named) -> dict[str, torch.Tensor]:
    """{name: full tensor} from (name, tensor) pairs whose tensors may be shards (`DTensor`):
    a collective, every rank calls it with the same names."""
    return {name: (t.full_tensor() if hasattr(t, "full_tensor") else t).detach() for name, t in named}


class RankEngine:
    """A rollout engine over a plain copy of the weights (`model`), which samples this rank's
    share of every batch's rows and gathers the others': each rank returns the whole batch.

    `push_weights(named, version)` loads the learner's (sharded) weights into the copy."""

    def __init__(self, engine, model: torch.nn.Module, shard: Shard, pad_id: int):
        self.engine, self.model, self.shard, self.pad_id = engine, model, shard, pad_id
        self.version = 0

    def __call__(self, prompt_ids, prompt_mask, seeds, *, temperature, **kwargs) -> Rollouts:
        rows = self.shard.rows(len(seeds))
        mine = None
        if rows.stop > rows.start:
            t = temperature[rows] if isinstance(temperature, torch.Tensor) else temperature
            mine = self.engine(prompt_ids[rows], prompt_mask[rows], seeds[rows], temperature=t, **kwargs)
        parts = [p for p in self.shard.gather(mine) if p is not None]
        return concat_rollouts(parts, self.pad_id)

    def push_weights(self, named, version: int) -> None:
        """The trained weights of `named` (the learner's own parameters, sharded) into the copy:
        under LoRA only the adapters."""
        load_trained(self.model, named)
        self.version = version


def load_trained(model: torch.nn.Module, named) -> None:
    """The trained ones of `named` (the learner's parameters, sharded; under LoRA the adapters)
    gathered into `model`, a plain copy with the same names: a collective."""
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, tensor in full_weights((name, t) for name, t in named if t.requires_grad).items():
            params[name].copy_(tensor)


class LeadEngine:
    """A rollout engine that holds its own weights (vLLM), on rank 0 only: it samples every
    batch whole, with the seeds a single process gives its rows, and broadcasts the rollouts, so
    every rank holds the single process's batch. `push_weights` gathers the trained weights into
    every rank's plain copy `model` (what checkpoints save) and rank 0 pushes them on to its
    engine, merged under LoRA, as a single process does. `engine` is None on the other ranks."""

    def __init__(self, engine, model: torch.nn.Module, shard: Shard):
        self.engine, self.model, self.shard = engine, model, shard
        self.version = 0

    def __call__(self, prompt_ids, prompt_mask, seeds, *, temperature, **kwargs) -> Rollouts:
        rollouts = None
        if self.engine is not None:
            rollouts = self.engine(prompt_ids, prompt_mask, seeds, temperature=temperature, **kwargs)
        return self.shard.broadcast(rollouts)

    def push_weights(self, named, version: int) -> None:
        load_trained(self.model, named)
        if self.engine is not None:
            self.engine.push_weights(merged_weights(self.model), version)
        self.version = version

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()


class LeadReward:
    """A verifier on rank 0 only (Ray reward workers, `trainer.reward_workers` under
    `trainer.ray_learners`): it scores every batch whole and broadcasts the scores, so every rank
    holds the single process's. `reward` is None on the other ranks."""

    def __init__(self, reward, shard: Shard):
        self.reward, self.shard = reward, shard

    def __call__(self, prompts, texts, examples):
        return self.shard.broadcast(self.reward(prompts, texts, examples) if self.reward is not None else None)

    def on_step_begin(self, step: int, steps: int) -> None:
        if self.reward is not None:
            self.reward.on_step_begin(step, steps)


class ShardedState:
    """How sharded learners save and load what a checkpoint holds of the model and optimizer:
    the full weights in the Hugging Face files (gathered; what an export or a single process
    loads) and the optimizer's shards with `torch.distributed.checkpoint` in `optimizer/`, which
    any number of ranks (one process too) can load. The critic's optimizer (PPO/GAE) is a second
    one, in `CRITIC_FOLDER`, beside its gathered weights in the trainer state."""

    FOLDER = "optimizer"
    CRITIC_FOLDER = "critic_optimizer"

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, shard: Shard,
                 folder: str = FOLDER):
        self.model, self.optimizer, self.shard, self.folder = model, optimizer, shard, folder

    def save_optimizer(self, folder) -> None:
        """Every rank writes its optimizer shard under `folder` (a collective). An optimizer that
        has not stepped yet (the policy's during the critic's warm-up) writes nothing: DCP would
        step it at lr 0 to make its state, which moves Adam's step count off the single process's."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        if not self.optimizer.state:
            return
        dcp.save({"optimizer": get_optimizer_state_dict(self.model, self.optimizer)},
                 checkpoint_id=str(folder / self.folder))

    def load(self, checkpoint, weights: dict[str, torch.Tensor], optimizer: dict | None = None, *,
             trust_pickle: bool = False) -> None:
        """The full `weights` into the shards, then the optimizer: its saved shards resharded to
        this run's ranks (read as `load_sharded_optimizer` says), or `optimizer`, the full state one
        process saved, cut into this rank's shards."""
        if optimizer is None:
            load_sharded_optimizer(self.model, self.optimizer, checkpoint / self.folder, weights,
                                   trust_pickle=trust_pickle)
            return
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
        from torch.distributed.tensor import distribute_tensor

        set_model_state_dict(self.model, weights, options=StateDictOptions(full_state_dict=True, strict=False))
        params = [p for group in self.optimizer.param_groups for p in group["params"]]

        def cut(value, p):  # a full per-parameter tensor (Adam's moments) -> this rank's shard of it
            if isinstance(value, torch.Tensor) and value.shape == p.shape and value.dim() > 0:
                return distribute_tensor(value.to(p.device), p.device_mesh, p.placements)
            return value

        state = {i: {k: cut(v, params[i]) for k, v in moments.items()} for i, moments in optimizer["state"].items()}
        self.optimizer.load_state_dict({"state": state, "param_groups": optimizer["param_groups"]})

    def barrier(self) -> None:
        torch.distributed.barrier()


def load_sharded_optimizer(model, optimizer, folder, weights: dict[str, torch.Tensor] | None = None, *,
                           trust_pickle: bool = False) -> None:
    """Load `weights` (full tensors by name; None = keep the model's) and the optimizer state a
    `ShardedState` saved in `folder`, into `model` and `optimizer` however they are sharded (a
    plain model in a single process too); no folder: the optimizer had not stepped, it stays fresh.
    The folder's pickles are read with an allow-list (`runtime.safe_load`) unless `trust_pickle`."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    if weights is not None:
        set_model_state_dict(model, weights, options=StateDictOptions(full_state_dict=True, strict=False))
    if not (folder / ".metadata").is_file():
        return
    state = {"optimizer": get_optimizer_state_dict(model, optimizer)}
    with warnings.catch_warnings():  # one process loading shards: DCP warns that it assumes so
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        load_sharded(state, folder, trust_pickle=trust_pickle)
    set_optimizer_state_dict(model, optimizer, state["optimizer"])
