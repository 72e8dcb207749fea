"""What a run is made of, as the builder assembled it: the rollout side's parts (what draws,
samples and scores a batch), the learner's (what trains on it), the frozen plans, and the one
piece of state that changes between steps (`StepState`).

Every part is frozen but the step state: a schedule that needs another engine or verifier (the
asynchronous rollout side) gets a copy with those replaced (`dataclasses.replace`). Like
`trainer.plan`, this module is a leaf of the loop's side: `collect`, `expert`, `inpaint` and the
schedules import it, it imports none of them.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

import torch

from rlvr.models.value import ValueModel
from rlvr.protocols import BatchVerifier, PolicyModel, RolloutEngine, Task, WeightSyncEngine
from rlvr.runtime.fsdp import ShardedState
from rlvr.runtime.rows import RowPool
from rlvr.sampling.base import Sampler
from rlvr.sampling.replay import ReplayBuffer
from rlvr.trainer.plan import AdvantageSpec, AsyncPlan, LoopPlan, LossSpec, RolloutPlan, StepPlan
from rlvr.types import Example


class ExpertRows(Protocol):
    """The off-policy expert problems of a run and their reference solutions (`trainer.expert.ExpertSource`)."""

    def draw(self, step: int) -> list[Example]:
        """This step's expert problems, a pure function of (seed, step)."""

    def solutions(self, examples: list[Example]) -> tuple[list[Example], list[str]]:
        """(examples, solution texts), leaving out problems without a solution."""


@dataclass(frozen=True)
class RolloutParts:
    """What draws, samples and scores a step's batch (`trainer.collect`), and its plan."""

    plan: RolloutPlan
    tokenizer: object  # a `transformers` tokenizer (pad, eos and, for diffusion models, mask ids set)
    task: Task
    reward: BatchVerifier
    engine: RolloutEngine
    sampler: Sampler  # which prompts a step rolls out, and how many completions each
    rng: random.Random  # the run's prompt RNG (the sampler draws with it too)
    replay: ReplayBuffer | None = None  # rollout replay: recent groups reused in later batches; None = off
    speculative: Callable | None = None  # SPEC-RL (`engines.speculative.SpeculativeRollouts`); None = off
    # agent tasks: (batch, tokenizer, prompts) -> the batch with a process reward model's dense turn rewards added
    turn_reward: Callable | None = None


@dataclass(frozen=True)
class Critic:
    """The value model of an estimator with critic targets (gae), its optimizer, and of
    data-parallel learners how its shards and its optimizer's are saved and loaded (None = one process)."""

    model: ValueModel
    optimizer: torch.optim.Optimizer
    shards: ShardedState | None = None


@dataclass(frozen=True)
class LearnerParts:
    """What trains on a batch (`trainer.sync`) and what a checkpoint holds of it."""

    model: torch.nn.Module
    policy: PolicyModel
    reference: PolicyModel | None  # frozen initial policy, when a KL term is on or the objective reads it
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    loss: LossSpec
    advantage: AdvantageSpec
    critic: Critic | None = None
    rows: RowPool | None = None  # batches split over worker threads (None = torch's own threads)
    expert: ExpertRows | None = None  # off-policy expert rows (config section `expert`); None = off
    # data-parallel learners (`runtime.distributed`): how the sharded model and optimizer are saved and
    # loaded, and the plain full-weight copy (the engine's) that checkpoints save; None = one process
    shards: ShardedState | None = None
    full_model: torch.nn.Module | None = None

    @property
    def full_weights(self) -> torch.nn.Module:
        """The model with every weight in full: the plain copy of sharded learners, else the model."""
        return self.model if self.full_model is None else self.full_model


@dataclass
class StepState:
    """What changes from step to step beside the weights, the optimizer and the RNGs: the KL
    coefficient β (the adaptive controller moves it; a checkpoint records it)."""

    kl_coef: float


@dataclass(frozen=True)
class RolloutSide:
    """The asynchronous rollout side as the builder made it: the parts it rolls out with (its own
    engine, and the verifier it scores with), that engine, torch's threads in its thread, what to
    close at the end, and whether the engine is the run's own, shared with evaluation."""

    rollout: RolloutParts
    engine: WeightSyncEngine  # the learner's published weights are pushed into it
    threads: int
    closers: tuple[Callable[[], None], ...] = ()
    shared: bool = False  # `snapshot.SharedEngine`: evaluation samples through `engine.evaluator`
    # `trainer.rollout_lanes`: (parts, engine) of each lane, the first being the two above; () = one
    lanes: tuple[tuple[RolloutParts, WeightSyncEngine], ...] = ()
    lock: AbstractContextManager | None = None  # the shared engine's: one version a batch; None = no lock
    restarts: Callable[[], int] | None = None  # dead workers the engine's backend restarted so far; None = never


@dataclass(frozen=True)
class Components:
    """A run: its two sides, its plans, and its step state."""

    rollout: RolloutParts
    learner: LearnerParts
    plan: StepPlan
    loop: LoopPlan
    state: StepState
    heap_kept: bool = False  # glibc keeps freed memory mapped (runtime/allocator.py)
    asynchronous: AsyncPlan | None = None  # rollouts ahead of the learner; None = the synchronous loop
    # start version -> the rollout side, made by the builder (`builder.placement.RolloutSides`)
    rollout_side: Callable[[int], RolloutSide] | None = None
