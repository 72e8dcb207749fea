"""The seams of the loop, as `typing.Protocol`s: what each stage must offer the next.

    Task --Example--> RolloutEngine --Rollouts--> RewardFn --rewards--> advantage --> update step
                            ^ weights (PolicyModel's model)                 TrainBatch --> PolicyModel

Any object with these methods plugs in (no base class to subclass). The trainer never branches
on the model type: a causal LM and a masked-diffusion LM differ only behind `PolicyModel` (exact
log-probs vs a named likelihood estimator) and `RolloutEngine` (KV-cache sampler vs denoising
sampler).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:  # torch stays out of this module's import, so tasks and rewards can name the seams
    import torch

    from rlvr.batch import Rollouts, TrainBatch
    from rlvr.types import Example


@runtime_checkable
class Task(Protocol):
    """A source of prompts with a verifier: procedural generators or files."""

    def sample(self, n: int, rng: random.Random) -> list[Example]:
        """`n` training examples drawn with `rng` (the run's seeded generator)."""

    def heldout(self) -> list[Example]:
        """The fixed evaluation set, disjoint from training."""

    def reward(self, prompt: str, completion: str, **example: Any) -> float | dict | None:
        """The verifier's score of one completion (see `RewardFn`)."""

    def is_correct(self, completion: str, example: Example) -> bool:
        """Whether `completion` solves `example` (accuracy metrics; may differ from reward > 0)."""


@runtime_checkable
class RewardFn(Protocol):
    """`fn(prompt, completion, **example) -> float | dict | None`: every field of the example
    (dataset column) arrives as a keyword. A dict holds `"reward"` and extra numeric metrics;
    `None` means not scorable. Batched (`fn.batched = True`) and async forms are accepted by
    `rlvr.rewards.runner.RewardRunner`."""

    def __call__(self, prompt: str, completion: str, **example: Any) -> float | dict | None: ...


@runtime_checkable
class BatchVerifier(Protocol):
    """The run's verifier over a batch (`rlvr.rewards.runner.RewardRunner`, `RewardSum`, Ray's reward
    workers): `verifier(prompts, completions, examples) -> RewardBatch`, and the step it scores.

    `on_step_begin(step, steps)` tells it which step's batch comes next (TRL-form functions'
    `trainer_state`); `reads_step` says whether its scores depend on that, so that a batch scored
    ahead of the learner is scored with its own step set."""

    reads_step: bool

    def __call__(self, prompts: list[str], completions: list[str], examples: list[dict[str, Any]]) -> Any: ...

    def on_step_begin(self, step: int, steps: int) -> None: ...

    def judged(self, task: Task, group: list, completions: list[str],
               examples: list[dict[str, Any]]) -> tuple[Any, list[bool]]:
        """(the batch's `RewardBatch`, whether each completion is correct by `task.is_correct`): both
        under the verifier's own bounds (`rlvr.rewards.runner.judge_batch`). `group`: the `Example`s."""
        ...

    def correct(self, task: Task, group: list, completions: list[str]) -> list[bool]:
        """Whether each completion is correct by `task.is_correct`, under the verifier's own bounds
        (held-out evaluation asks this)."""
        ...


@runtime_checkable
class RolloutEngine(Protocol):
    """Turns B prompt rows into B completions: token ids in and out, behaviour log-probs per token.

    `seeds` (B,) long: one seed per row, so a row's completion does not depend on its batch
    neighbours. `temperature` 0 is greedy; a (B,) tensor gives each row its own."""

    def __call__(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, seeds: torch.Tensor, *,
                 temperature: float | torch.Tensor) -> Rollouts: ...


@runtime_checkable
class WeightSyncEngine(RolloutEngine, Protocol):
    """A rollout engine that holds its own copy of the policy's weights (vLLM, a worker in another
    process or thread). The trainer pushes the weights after every optimizer step; every
    `Rollouts` it returns was produced by the weights of `policy_version`.

    Engines that read the trainer's model directly (the torch samplers in the trainer's process)
    need no push and do not implement this."""

    policy_version: int
    """Version of the weights the engine samples with: 0 at start, then the `version` of the last push."""

    def push_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Replace the engine's weights with `named_tensors` (the trainer model's `named_parameters`
        names; LoRA pushes the merged weights) and tag later rollouts with `version`."""


@runtime_checkable
class PolicyModel(Protocol):
    """Answers one question: the log-probabilities of given completion tokens under the current
    weights, (B, Tc), plus the entropy when asked.

    Causal LMs return exact per-token log-probs; masked-diffusion LMs a named likelihood
    estimator's values. Estimator inputs (advantages, the sampler's trace) are read from the
    batch, so the trainer passes the same `TrainBatch` to every policy."""

    forwards: int
    """Model forwards this policy has run (a cost measure; fused paths that bypass the module
    forward do not count)."""
    exact_logprobs: bool
    """Its training forward gives the log-probs themselves (causal LMs), not an estimator's sample:
    the builder lets a step with one update keep them as the proximal policy's."""

    def parameters(self) -> Iterator[torch.nn.Parameter]: ...

    def begin_step(self, seed: int) -> None:
        """Called once per step before any log-prob of that step, with the step's seed: estimators
        that draw masks use it for common random numbers across old, reference and current
        policy; exact log-probs ignore it."""

    def batch_logprobs(self, batch: TrainBatch, *,
                       with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(log-probs (B, Tc), entropy (B, Tc) or None) of `batch.completion_ids`."""


@runtime_checkable
class LogitStatsPolicy(PolicyModel, Protocol):
    """A PolicyModel with logits to read (causal LMs): besides the log-probs, per-token statistics
    of the same (temperature-scaled) logits, from the same forward, for the losses and
    estimators that declare they need them (`rlvr.algos._registry.needs_of`). The names are
    `rlvr.models.policy.LOGIT_STATS`: `logsumexp`, `logit` (at the sampled token),
    `sum_pi_squared` (Σ_v π_v²). A likelihood estimator (masked-diffusion LMs) has no such
    logits and does not implement this; the config refuses the entries that need it there."""

    def batch_token_stats(self, batch: TrainBatch, *, with_entropy: bool = False, stats: tuple[str, ...] = ()
                          ) -> tuple[torch.Tensor, torch.Tensor | None, dict[str, torch.Tensor]]:
        """(log-probs (B, Tc), entropy (B, Tc) or None, {stat: (B, Tc)} for each name in `stats`)."""


@runtime_checkable
class DrawsPolicy(PolicyModel, Protocol):
    """A PolicyModel whose log-probs are the mean of n Monte-Carlo draws (a masked-diffusion LM's
    `bgpo` estimator), which it can hand over one by one for an objective that reads them (BGPO)."""

    def batch_draws(self, batch: TrainBatch, *, with_entropy: bool = False
                    ) -> tuple[torch.Tensor, torch.Tensor | None, dict[str, torch.Tensor]]:
        """(log-probs (B, Tc), entropy (B, Tc) or None, {"draws": (B, n)}), from the same forwards."""


@runtime_checkable
class Tracker(Protocol):
    """A metric sink beside `metrics.jsonl`. `metrics` maps `area/name` to a float; `step` is the x-axis."""

    name: str

    def log_config(self, config: Mapping) -> None: ...

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class Callback(Protocol):
    """Hooks into a training run (all optional: define the ones you need).

    `on_step_end(step, metrics)` after each step's metrics are logged; `on_evaluate(step, metrics)`
    after each held-out evaluation (the `eval/` keys), step 0 included: the evaluation before the
    first step, line 0 of metrics.jsonl; `on_checkpoint(step, path)` after a checkpoint is
    written.
    Any hook returning `False` stops the run cleanly after the current step (the final
    checkpoint is still written); at step 0, after the first step."""

