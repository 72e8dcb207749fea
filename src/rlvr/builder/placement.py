"""Where a run's work runs: the threads and row pools of each side, the engine of each learner
rank and the asynchronous rollout side (a thread here, or Ray actors). Resolved from the config
once, like the plans (`builder.plans`); what data-parallel (FSDP2) learners support is checked
in `config.checks`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from rlvr.backends import ray_rollouts
from rlvr.backends.ray import RayEngine, RayReward, ensure_ray
from rlvr.builder import build
from rlvr.config import Config
from rlvr.config.registries import adapter_sync, engine_kind
from rlvr.engines.ranks import LeadEngine, RankEngine
from rlvr.engines.rows import split_engine
from rlvr.engines.snapshot import SharedEngine, SnapshotEngine
from rlvr.protocols import BatchVerifier, RolloutEngine
from rlvr.runtime.distributed import Shard, side_group
from rlvr.runtime.process import Runtime, available_cores, thread_budget
from rlvr.runtime.rows import CoreLease, RowPool, resolve_mode
from rlvr.trainer.parts import RolloutParts, RolloutSide
from rlvr.trainer.plan import AsyncPlan, PartialPlan

DTYPES = {"": None, "float32": torch.float32, "bfloat16": torch.bfloat16}  # trainer.fsdp_*_dtype


def asynchronous(config: Config) -> bool:
    """Rollouts run ahead of the learner: `trainer.max_staleness` set, or the Ray backend."""
    return config.trainer.max_staleness is not None or on_ray(config)


def on_ray(config: Config) -> bool:
    """The rollout side on Ray actors (not Ray-started learners, which sample as torchrun's do)."""
    return ray_rollouts(config.trainer.backend, config.trainer.ray_learners)


def shares_engine(config: Config) -> bool:
    """An engine with its own weights under local asynchronous rollouts: the rollout side and the
    learner's evaluation share the run's one engine (`snapshot.SharedEngine`); the rollout side pushes."""
    return asynchronous(config) and not on_ray(config) and engine_kind(config).own_weights


@dataclass(frozen=True)
class ThreadLayout:
    """The row pools of each side and the async plan (None for the synchronous loop)."""

    learner_rows: RowPool | None
    rollout_rows: RowPool | None = None
    rows_mode: bool = False
    rollout_worker_threads: int = 1
    plan: AsyncPlan | None = None


def _pool(threads: int) -> RowPool | None:
    return RowPool(threads) if threads > 1 else None


def thread_layout(config: Config, runtime: Runtime) -> ThreadLayout:
    """`side_threads` with the async plan's partial rollouts and per-token bound resolved."""
    layout = side_threads(config, runtime)
    if layout.plan is None:
        return layout
    t = config.trainer
    partial = None
    if t.partial_rollouts and t.max_staleness:  # η = 0: no update can arrive mid-batch, nothing to swap
        partial = PartialPlan(in_flight=engine_kind(config).partial == "in_flight", every=t.partial_chunk)
    token_bound = t.max_token_staleness if t.max_token_staleness is not None and t.max_staleness is not None else None
    return dataclasses.replace(layout, plan=dataclasses.replace(layout.plan, partial=partial, token_bound=token_bound))


def side_threads(config: Config, runtime: Runtime) -> ThreadLayout:
    """Threads and row pools for each side of the run. Synchronous: the process's own (`runtime`).
    Asynchronous with rows split over threads and a local backend: the two sides share all the
    process's cores through one `rows.CoreLease`, each splitting its rows as the synchronous loop
    does. Otherwise overlapping sides each get a fixed share (`runtime.thread_budget`), and sides
    that alternate (`max_staleness=0`) each use what the synchronous loop would."""
    if not asynchronous(config):
        return ThreadLayout(runtime.rows)
    t = config.trainer
    max_staleness = t.max_staleness or 0
    exact = t.staleness == "exact"
    overlap = max_staleness > 0
    workers = t.rollout_workers if on_ray(config) else 1
    cores = available_cores(t.threads)
    budget = thread_budget(cores, overlap=overlap, rollout_workers=workers)
    kind = engine_kind(config)
    own = kind.own_weights  # vLLM: never a second engine here (it is shared or on its workers)
    # FSDP2 learners run each batch whole: lanes on another thread would unshard a layer mid-forward
    rows_mode = not kind.batches_itself and not runtime.shard.fsdp and (
        runtime.rows is not None or resolve_mode(t.thread_mode, config.model.kind) == "rows")
    facts = {"learner": budget["learner"], "rollout_worker": budget["rollout_worker"],
             "concurrent": budget["concurrent"], "rows_mode": rows_mode}
    torch_threads = torch.get_num_threads()
    if overlap and rows_mode and not on_ray(config) and cores > 1:  # either side on every core, never more in all
        lease = CoreLease(cores)
        plan = AsyncPlan(max_staleness, exact, learner_threads=1, rollout_threads=1, publish_merged=own,
                         publish_adapter=adapter_sync(config),
                         facts={"learner": cores, "rollout_worker": cores, "concurrent": cores, "rows_mode": True,
                                "shared_cores": True})
        return ThreadLayout(RowPool(cores, lease), RowPool(cores, lease), True, budget["rollout_worker"], plan)
    if overlap:
        learner = _pool(budget["learner"]) if rows_mode else None
        rollout = _pool(budget["rollout_worker"]) if rows_mode else None
        plan = AsyncPlan(max_staleness, exact, learner_threads=1 if rows_mode else budget["learner"],
                         rollout_threads=1 if rows_mode else budget["rollout_worker"], publish_merged=own,
                         publish_adapter=adapter_sync(config),
                         facts=facts)
        return ThreadLayout(learner, rollout, rows_mode, budget["rollout_worker"], plan)
    plan = AsyncPlan(max_staleness, exact, learner_threads=torch_threads, rollout_threads=torch_threads,
                     publish_merged=own, publish_adapter=adapter_sync(config), facts=facts)
    return ThreadLayout(runtime.rows, runtime.rows, rows_mode, budget["rollout_worker"], plan)


def learner_engine(config: Config, plain: torch.nn.Module, tokenizer, shard: Shard) -> RolloutEngine:
    """The rollout engine over `plain`, the full weights. Of FSDP2 learners, an engine with its
    own weights (vLLM) is rank 0's alone, in a process of its own (`LeadEngine`), fed the gathered
    weights after every step, and so are Ray rollout workers under `trainer.ray_learners`; the
    torch engine samples each rank's share (`RankEngine`)."""
    t = config.trainer
    if shard.fsdp and t.ray_learners and t.rollout_workers > 1:
        workers = None
        if shard.rank == 0:
            workers = RayEngine(functools.partial(build.build_engine, config), plain, tokenizer,
                                workers=t.rollout_workers, threads=t.threads or 1, rows_mode=False, version=0,
                                own_weights=engine_kind(config).own_weights)
        return LeadEngine(workers, plain, shard)
    kind = engine_kind(config)
    if not (shard.fsdp and kind.own_weights):
        return build.build_engine(config, plain, tokenizer)
    lead = None
    if shard.rank == 0:  # vLLM servers run apart already; the in-process engine needs a process of its own
        lead = (build.build_engine(config, plain, tokenizer) if kind.own_processes
                else build.build_vllm_engine(config, plain, tokenizer, own_process=True))
    return LeadEngine(lead, plain, shard)


@dataclass(frozen=True)
class RolloutSides:
    """How the asynchronous rollout side is made, resolved when the run is built; called with the
    policy version it starts at (a resumed run's), it makes the side (`trainer.parts.RolloutSide`):
    the sampler and the verifier on Ray actors, the run's own engine shared with evaluation (an
    engine with its own weights), or snapshots of the weights sampled in threads of this process.

    `make_engine(model, tokenizer)` and `make_verifier(tokenizer)` build an engine and a verifier
    as the builder does: in Ray's worker processes, and for each snapshot of the weights."""

    rollout: RolloutParts  # the run's own, whose engine and verifier the side replaces
    model: torch.nn.Module  # what Ray's workers copy at the start
    full_weights: torch.nn.Module  # what a snapshot copies: the plain full weights, never a shard
    shard: Shard
    layout: ThreadLayout
    make_engine: Callable[[torch.nn.Module, object], RolloutEngine]
    make_verifier: Callable[[object], BatchVerifier]
    ray: bool = False
    ray_address: str | None = None
    cores: int = 1
    rollout_workers: int = 1
    reward_workers: int = 1
    own_weights: bool = False
    shared: bool = False  # `shares_engine`
    lanes: int = 1
    collective_timeout_s: float = 0.0

    def __call__(self, start: int) -> RolloutSide:
        if self.ray:
            return self._on_ray(start)
        r, threads = self.rollout, self.layout.plan.rollout_threads
        if self.shared:
            engine = SharedEngine(r.engine, start, exact=self.layout.plan.exact)
            return RolloutSide(dataclasses.replace(r, engine=engine), engine, threads=threads, shared=True,
                               lock=engine.lock)
        shard = self.shard
        side_shard = side_group(shard, self.collective_timeout_s) if shard.fsdp else shard
        pad = r.tokenizer.pad_token_id

        def make(model, rows: RowPool | None):
            made = self.make_engine(model, r.tokenizer)
            made = split_engine(made, rows, pad, model) if rows is not None else made
            # data-parallel learners: this rank samples its share, exchanged on the rollout side's own group
            return RankEngine(made, model, side_shard, pad) if shard.fsdp else made

        lease = self.layout.rollout_rows.lease if self.layout.rollout_rows is not None else None
        reward = r.reward if lease is None else ScoringWithoutCore(r.reward, lease)
        lanes = []
        partial = self.layout.plan.partial
        for lane in range(self.lanes):  # a lane's own row pool: two maps at once never queue
            rows = self.layout.rollout_rows
            rows = RowPool(rows.workers, rows.lease) if lane and rows is not None else rows
            if partial is not None:  # weights swapped mid-batch: one sampler, not row workers computing across a swap
                rows = None
            engine = SnapshotEngine(self.full_weights, functools.partial(make, rows=rows), version=start,
                                    swap_every=partial.every if partial is not None else 0)
            lanes.append((dataclasses.replace(r, engine=engine, reward=reward), engine))
        return RolloutSide(*lanes[0], threads=threads, lanes=tuple(lanes))

    def _on_ray(self, start: int) -> RolloutSide:
        ensure_ray(self.ray_address, self.cores)
        r = self.rollout
        engine = RayEngine(self.make_engine, self.model, r.tokenizer, workers=self.rollout_workers,
                           threads=self.layout.rollout_worker_threads, rows_mode=self.layout.rows_mode,
                           version=start, own_weights=self.own_weights)
        reward = RayReward(self.make_verifier, r.tokenizer, workers=self.reward_workers, local=r.reward)
        # this process only tokenizes, decodes and checks answers for the rollout side
        return RolloutSide(dataclasses.replace(r, engine=engine, reward=as_verifier(reward)), engine, threads=1,
                           closers=(engine.close, reward.close), restarts=lambda: engine.restarts)


def rollout_sides(config: Config, rollout: RolloutParts, model: torch.nn.Module, full_weights: torch.nn.Module,
                  shard: Shard, layout: ThreadLayout) -> RolloutSides:
    """The maker of the run's asynchronous rollout side (`RolloutSides`)."""
    t = config.trainer
    return RolloutSides(rollout, model, full_weights, shard, layout,
                        make_engine=functools.partial(build.build_engine, config),
                        make_verifier=functools.partial(build.build_verifier, config),
                        ray=on_ray(config), ray_address=t.ray_address, cores=available_cores(t.threads),
                        rollout_workers=t.rollout_workers, reward_workers=t.reward_workers,
                        own_weights=engine_kind(config).own_weights, shared=shares_engine(config),
                        lanes=t.rollout_lanes, collective_timeout_s=t.collective_timeout_s)


class StepHooks:
    """A verifier given the step hooks of `BatchVerifier` it lacks: `on_step_begin` a no-op where it
    has none, `reads_step` whether it has one."""

    def __init__(self, verifier):
        self.verifier = verifier
        self.reads_step = getattr(verifier, "reads_step", hasattr(verifier, "on_step_begin"))
        self.on_step_begin = getattr(verifier, "on_step_begin", lambda step, steps: None)

        self.judged = getattr(verifier, "judged", self._asked_apart)
        self.correct = getattr(verifier, "correct", _asked_here)

    def __call__(self, prompts, completions, examples):
        return self.verifier(prompts, completions, examples)

    def _asked_apart(self, task, group, completions, examples):
        """A verifier with no bounded correctness of its own (Ray's reward workers): the task is asked here."""
        return self.verifier([ex.prompt for ex in group], completions, examples), _asked_here(task, group, completions)


def _asked_here(task, group, completions) -> list[bool]:
    return [bool(task.is_correct(text, ex)) for ex, text in zip(group, completions)]


def as_verifier(verifier) -> BatchVerifier:
    """`verifier` as a `BatchVerifier`: itself when it has every hook, else wrapped (`StepHooks`)."""
    if all(hasattr(verifier, hook) for hook in ("on_step_begin", "reads_step", "judged", "correct")):
        return verifier
    return StepHooks(verifier)


class ScoringWithoutCore:
    """The verifier, called with the rollout side's core given back: scoring mostly waits (sandboxed
    test processes, a judge, a remote service), and meanwhile the learner computes on that core."""

    def __init__(self, verifier: BatchVerifier, lease: CoreLease):
        self.verifier, self.lease = verifier, lease
        self.reads_step = verifier.reads_step

    def __call__(self, prompts, completions, examples):
        with self.lease.released():
            return self.verifier(prompts, completions, examples)

    def judged(self, task, group, completions, examples):
        with self.lease.released():
            return self.verifier.judged(task, group, completions, examples)

    def correct(self, task, group, completions):
        with self.lease.released():
            return self.verifier.correct(task, group, completions)

    def on_step_begin(self, step: int, steps: int) -> None:
        self.verifier.on_step_begin(step, steps)
