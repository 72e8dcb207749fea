"""What a run's steps do, decided once: the builder resolves these plans from the config and from
what the engine, the policy and the registry entries declare, and freezes them.

The loop reads these fields; it never reads the config or a registry entry's declarations,
compares a registry or engine name, or asks an `isinstance` what mode it is in. A new method adds
a field here (or a declaration on its entry) and the builder sets it; the step does not grow a
branch on a name. This module is a leaf of the trainer: the loop's modules import it, it imports
none of them.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from rlvr.runtime.distributed import Shard
from rlvr.sampling.base import GroupFilter
from rlvr.sampling.calibration import Calibration


class ProximalSource(enum.Enum):
    """Where the old (proximal) policy's log-probs of a batch come from."""

    NONE = "none"
    """On-policy: the update's own detached log-probs stand in (ratio 1)."""
    PASS = "pass"
    """A no-grad forward over the batch before the update."""
    FUSED = "fused"
    """The update's own forward keeps them (`trainer.proximal`, one optimizer step per batch)."""


@dataclass(frozen=True)
class Proximal:
    """Where the old (proximal) policy's log-probs of one kind of batch come from, and the
    behaviour weights pi_old / pi_behav its tokens get."""

    source: ProximalSource
    weights: Callable | None
    """(old_logp, rollout_logp, mask) -> (weights, metrics); None = unweighted."""


@dataclass(frozen=True)
class LossSpec:
    """The resolved loss: registry functions with their hyperparameters already bound (the
    builder binds them from the config once), called by the update step with data only, and what
    their declarations ask of the update's forward and of the batch, resolved with them."""

    objective: Callable  # (logp, old_logp, advantages, mask) -> (loss (B, T), metrics)
    aggregation: Callable  # (loss_tok, mask, *, num_tokens, num_seqs) -> scalar
    kl_estimator: Callable | None  # (logp, ref_logp, *, old_logp) -> (B, T); None = no KL term in the loss
    entropy_coef: float
    # (logp, old_logp, expert_logp, advantages, mask) -> (loss, metrics) on expert rows; None = no expert
    # rows, or `expert.objective=main` (the objective trains them too)
    expert: Callable | None = None
    # (old_logp, rollout_logp, mask) -> (weights, metrics) applied to this forward's detached log-probs: the
    # proximal policy of a step with one update (`rlvr.trainer.proximal`); None = the weights come with the batch
    proximal_weights: Callable | None = None
    stats: tuple[str, ...] = ()  # what the update's forward gives beside log-probs (`logit_stats.LOSS_STATS`)
    fields: tuple[str, ...] = ()  # the objective's data keywords, in order (`logit_stats.loss_outputs`)
    aggregation_fields: tuple[str, ...] = ()  # `TrainBatch` fields the aggregation reads by name (CJ-GRPO's trace)


@dataclass(frozen=True)
class AdvantageSpec:
    """The advantage estimator named by `algo.advantage` and, for `gae`, the critic's targets,
    both with their hyperparameters bound: `estimate(inputs) -> (advantages, metrics)`,
    `returns(inputs) -> (B, T)`; and which optional `AdvantageInputs` it declared it reads."""

    estimate: Callable
    returns: Callable | None = None
    needs: frozenset[str] = frozenset()  # optional AdvantageInputs fields it declares (`_registry.needs`)
    behaviour: tuple[str, ...] = ()  # of them, those the old-policy pass computes (`_registry.BEHAVIOUR_NEEDS`)
    components: bool = False  # it reads each reward function's own score and weight (GDPO)
    trace: bool = False  # it reads the diffusion sampler's commit steps (LightningRL)


@dataclass(frozen=True)
class Passes:
    """What the no-grad passes compute beside log-probs, from what the advantage estimator and the
    objective declared (`rlvr.algos._registry.needs`)."""

    old_stats: tuple[str, ...] = ()  # logit statistics the old-policy pass adds for the advantage (Σπ²)
    old_draws: bool = False  # the objective reads the old policy's per-draw estimates (BGPO)
    reference_stats: tuple[str, ...] = ()  # ("logsumexp",): the objective reads the reference's (ShiQ)


class Canvas(NamedTuple):
    """A diffusion model's generation window: the length every completion has, and which of its
    tokens are the completion (`rollout.window`: `eos` up to the first EOS, `full` all)."""

    gen_length: int
    window: str


@dataclass(frozen=True)
class InpaintPlan:
    """IGPO's knobs, resolved from `rollout.igpo_*` (`trainer.inpaint`)."""

    hint_low: float   # the injected share of the reference is η ~ U[hint_low, hint_high] per group
    hint_high: float
    max_replace: int  # k = ⌊λ G⌋ hinted completions per group, and at most k replaced rows
    gen_length: int


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
    agent: bool = False  # multi-turn episodes of an agent task: its environments act and score (`rlvr.agents`)
    sampler_feedback: bool = False  # the sampler's proposals read the verdicts it observed (not uniform draws)


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
    # (coef, seq_kl, n) -> new coef: the adaptive KL, moved by the per-sequence KL the step charged where it
    # lives (the loss's, or the reward's); None = fixed
    kl_controller: Callable | None
    expert: ExpertPlan | None
    passes: Passes = Passes()
    # (logp, ref_logp, *, old_logp) -> (B, T): the bound `algo.kl_estimator` when the KL lives in the reward
    # (`algo.kl_placement=reward`), charged there times the step's coefficient; None = not
    reward_kl: Callable | None = None
    shard: Shard = Shard()  # this learner's rank of the data-parallel ranks: the update trains its share of the rows
    # the engine loads the weights LoRA-merged under the base model's names (vLLM); False: the learner's own
    # parameters, as named in its module (the data-parallel learners' full copy takes the trained ones)
    push_merged: bool = True
    # the engine serves LoRA adapters unmerged: push the adapter's own tensors alone (peft's names)
    push_adapter: bool = False
    micro_batch_tokens: int = 0  # > 0: forwards under this token budget, not micro_batch_size rows (trainer.budget)


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
    retie: bool  # the model ties weights that a Hugging Face save drops: tie them again after loading
    push_on_resume: bool  # the engine holds its own weights, started from the initial ones: push the resumed
    facts: dict  # what the run records of its engines beside the measured ones (run.json `runtime`)
    batch_numbers: dict  # the derived batch vocabulary, printed at the start
    config_tree: dict  # the resolved config, for the trackers
    upper_bounds: bool  # dynamic sampling: the batch numbers are upper bounds
    reads_advantages: bool = True  # False: the objective trains on tied groups too (no "nothing trains" warning)
    writer: bool = True  # this process writes the run's metrics, samples and checkpoints (rank 0 of the learners)


@dataclass(frozen=True)
class PartialPlan:
    """Partial rollouts (`trainer.partial_rollouts`): how a published update reaches the batch in flight."""

    in_flight: bool  # the engine takes the push while its requests run (servers); False: the sampler swaps
    every: int  # tokens between the sampler's checks for newer weights (`trainer.partial_chunk`)


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
    publish_adapter: bool = False  # ... or the LoRA adapter alone, which it serves unmerged
    partial: PartialPlan | None = None  # partial rollouts; None = each batch from one version
    token_bound: int | None = None  # tokens staler than this train nothing (`trainer.max_token_staleness`); None = η
