"""What a run is made of (`Components`) and what its steps do (the plans), decided once: the
builder resolves the plans from the config and from what the engine, the policy and the registry
entries declare, and freezes them.

The loop reads these fields and the components; it never reads the config, compares a registry or
engine name, or asks an `isinstance` what mode it is in. A new method adds a field here (or a
declaration on its entry) and the builder sets it; the step does not grow a branch on a name.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import torch

from rlvr.models.value import ValueModel
from rlvr.protocols import PolicyModel, RolloutEngine, Task
from rlvr.rewards.runner import RewardRunner
from rlvr.runtime.distributed import Shard
from rlvr.runtime.fsdp import ShardedState
from rlvr.runtime.rows import RowPool
from rlvr.sampling.base import GroupFilter, Sampler
from rlvr.sampling.calibration import Calibration
from rlvr.sampling.replay import ReplayBuffer
from rlvr.trainer.expert import Canvas, ExpertSource
from rlvr.trainer.inpaint import InpaintPlan
from rlvr.trainer.step import LossSpec


@dataclass(frozen=True)
class Proximal:
    """Where the old (proximal) policy's log-probs of one kind of batch come from, and the
    behaviour weights pi_old / pi_behav its tokens get."""

    source: str
    """`none`: on-policy, the update's own detached log-probs stand in (ratio 1); `pass`: a no-grad
    forward over the batch before the update; `fused`: the update's own forward keeps them
    (`trainer.proximal`, one optimizer step per batch)."""
    weights: Callable | None
    """(old_logp, rollout_logp, mask) -> (weights, metrics); None = unweighted."""


@dataclass(frozen=True)
class RolloutPlan:
    """How one step's batch is drawn and scored (`trainer.collect`)."""

    seed: int
    prompts_per_step: int
    group_size: int
    temperature: float
    greedy_in_group: bool  # the last row of every group decoded greedily
    group_filter: GroupFilter | None  # which generated groups train, and refills (DAPO); None = all of them
    micro_group_size: int  # completions per prompt in one engine pass (G = one pass)
    greedy_baseline: bool  # one greedy completion per prompt scored for the advantage (ReMax)
    inpaint: InpaintPlan | None = None  # IGPO: hinted completions for groups with no correct one; None = off
    calibration: Calibration | None = None  # the Monte-Carlo probe of the sampler's predictions; None = off


@dataclass(frozen=True)
class ExpertPlan:
    """Off-policy expert rows (`trainer.expert`): the μ schedule and how their loss is counted."""

    mu: Callable[[int], float]  # step -> the expert loss weight μ
    keep_onpolicy: bool
    token_units: bool  # the aggregation counts tokens (so μ weighs tokens, not rows)
    advantage: str = "batch"  # `expert.advantage`: joint (`batch`) or per-source (`source`) standardisation
    canvas: Canvas | None = None  # diffusion models: the window the rows are length-controlled to; None = causal


@dataclass(frozen=True)
class StepPlan:
    """One RL step (`trainer.sync.rl_step`)."""

    rollout: RolloutPlan
    micro_batch_size: int
    ppo_epochs: int
    minibatches: int
    grad_clip: float
    samples_per_step: int
    fresh: Proximal  # a batch sampled by the current weights
    stale: Proximal  # a batch sampled by an older version (asynchronous rollouts): decoupled PPO
    push_weights: bool  # the engine holds its own weights: push them after the step's updates
    overlong_filter: bool  # DAPO: truncated completions are masked out of the loss
    shaping: Callable | None  # lengths (B,) -> reward added to each row (DAPO's overlong penalty)
    token_rewards: bool  # the objective learns from per-token rewards (it declared `token_rewards`)
    value_clip: float  # the critic's value clip (with a critic)
    critic_warmup_steps: int  # steps that train only the critic (with a critic)
    kl_controller: Callable | None  # (coef, seq_kl, n) -> new coef: the adaptive KL; None = fixed
    expert: ExpertPlan | None
    shard: Shard = Shard()  # this learner's rank of the data-parallel ranks: the update trains its share of the rows
    # the engine loads the weights LoRA-merged under the base model's names (vLLM); False: the learner's own
    # parameters, as named in its module (the data-parallel learners' full copy takes the trained ones)
    push_merged: bool = True


@dataclass(frozen=True)
class LoopPlan:
    """The schedule around the steps (`trainer.loop.run_loop`) and what a run records."""

    steps: int
    eval_every: int
    save_every: int
    keep_last: int
    eval_samples: int  # sampled completions per held-out prompt (0 = greedy evaluation only)
    eval_temperature: float
    trackers: tuple[str, ...]
    adapter_checkpoints: bool  # checkpoints hold a LoRA adapter: a resume loads it into the built base
    push_on_resume: bool  # the engine holds its own weights, started from the initial ones: push the resumed
    facts: dict  # what the run records of its engines beside the measured ones (run.json `runtime`)
    batch_numbers: dict  # the derived batch vocabulary, printed at the start
    config_tree: dict  # the resolved config, for the trackers
    upper_bounds: bool  # dynamic sampling: the batch numbers are upper bounds
    reads_advantages: bool = True  # False: the objective trains on tied groups too (no "nothing trains" warning)
    writer: bool = True  # this process writes the run's metrics, samples and checkpoints (rank 0 of the learners)


@dataclass(frozen=True)
class AsyncPlan:
    """Asynchronous rollouts (`trainer.async_loop`): the staleness bound and the thread layout the
    builder gave each side."""

    max_staleness: int
    exact: bool  # the batch of step k always from version max(0, k-1-η), whatever the timing (`trainer.staleness`)
    learner_threads: int  # torch's intra-op threads on the learner while the rollout side runs
    rollout_threads: int  # torch's intra-op threads in the rollout thread
    publish_merged: bool  # the rollout engine holds its own weights: publish them LoRA-merged, as it loads them
    facts: dict  # the layout as the run records it


@dataclass(frozen=True)
class RolloutSide:
    """The asynchronous rollout side as the builder made it: the components it rolls out with (its
    own engine, and the verifier it scores with), that engine, torch's threads in its thread, what
    to close at the end, and whether the engine is the run's own, shared with evaluation."""

    components: Components
    engine: object  # a `WeightSyncEngine`: the learner's published weights are pushed into it
    threads: int
    closers: tuple[Callable[[], None], ...] = ()
    shared: bool = False  # `snapshot.SharedEngine`: evaluation samples through `engine.evaluator`
    # `trainer.rollout_lanes`: (components, engine) of each lane, the first being the two above; () = one
    lanes: tuple = ()


@dataclass
class Components:
    model: torch.nn.Module
    tokenizer: object  # a `transformers` tokenizer (pad, eos and, for diffusion models, mask ids set)
    policy: PolicyModel
    reference: PolicyModel | None  # frozen initial policy, when a KL term is on or the objective reads it
    task: Task
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    loss: LossSpec
    advantage: object  # a bound advantage estimator: (AdvantageInputs) -> (advantages (B, T), metrics)
    rng: random.Random
    reward: RewardRunner
    engine: RolloutEngine
    plan: StepPlan
    loop: LoopPlan
    critic: ValueModel | None = None
    critic_optimizer: torch.optim.Optimizer | None = None
    sampler: Sampler | None = None  # which prompts a step rolls out, and how many completions each
    replay: ReplayBuffer | None = None  # rollout replay: recent groups reused in later batches; None = off
    speculative: Callable | None = None  # SPEC-RL (`engines.speculative.SpeculativeRollouts`); None = off
    rows: RowPool | None = None  # batches split over worker threads (None = torch's own threads)
    heap_kept: bool = False  # glibc keeps freed memory mapped (runtime/allocator.py)
    expert: ExpertSource | None = None  # off-policy expert rows (config section `expert`); None = off
    # agent tasks: (batch, tokenizer, prompts) -> the batch with a process reward model's dense turn rewards added
    turn_reward: Callable | None = None
    asynchronous: AsyncPlan | None = None  # rollouts ahead of the learner; None = the synchronous loop
    # start version -> the rollout side, made by the builder (`components.rollout_side`)
    rollout_side: Callable[[int], RolloutSide] | None = None
    # data-parallel learners (`runtime.fsdp`): how the sharded model and optimizer are saved and
    # loaded, and the plain full-weight copy (the engine's) that checkpoints save; None = one process
    shards: ShardedState | None = None
    full_model: torch.nn.Module | None = None
    critic_shards: ShardedState | None = None  # the sharded critic's and its optimizer's (PPO/GAE)

    @property
    def full_weights(self) -> torch.nn.Module:
        """The model with every weight in full: the plain copy of sharded learners, else the model."""
        return self.model if self.full_model is None else self.full_model
