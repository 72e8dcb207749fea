"""Name lookup shared by the four registries (one error message format everywhere)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


def lookup(registry: Mapping[str, Callable], kind: str, name: str) -> Callable:
    """Return `registry[name]`, or raise ValueError naming the valid choices."""
    try:
        return registry[name]
    except KeyError:
        valid = ", ".join(sorted(registry))
        raise ValueError(f"unknown {kind} {name!r}; valid: {valid}") from None


def needs(*names: str) -> Callable[[Callable], Callable]:
    """Decorator: the entry reads these inputs beyond its registry's usual ones, and the trainer
    computes them only for entries that declare them (an objective's `logsumexp`, an advantage's
    `sum_pi_squared`). The names an objective may declare are its keyword-only data parameters
    (`OBJECTIVE_NEEDS`); an advantage estimator's are `AdvantageInputs` fields (`ADVANTAGE_NEEDS`)."""
    def mark(fn: Callable) -> Callable:
        fn.needs = frozenset(names)
        return fn
    return mark


def needs_of(fn: Callable) -> frozenset[str]:
    """What `fn` (or the function under a `functools.partial`) declared with `needs`; empty if nothing."""
    while hasattr(fn, "func"):
        fn = fn.func
    return getattr(fn, "needs", frozenset())


SET = object()
"""A `Requirement` value: any non-empty value (`model.teacher_path`)."""


@dataclass(frozen=True)
class Requirement:
    """What an entry needs of the rest of the config, stated once on the entry and enforced by
    `rlvr.config.checks` whenever the config chooses it. Every field in `fields` (dotted name ->
    the value it must have: one value, a tuple of allowed values, or `SET`) must hold, or the run
    is refused with the one line `<field>: <fix>`; `field` "" names the field that chose the entry
    (`algo.objective`) and `{name}` in `fix` is replaced by the entry's name."""

    fields: Mapping[str, Any]
    fix: str
    field: str = ""

    def met(self, value_of: Callable[[str], Any]) -> bool:
        """Whether the config (`value_of(dotted) -> value`) gives every field a value it allows."""
        for dotted, allowed in self.fields.items():
            value = value_of(dotted)
            ok = bool(value) if allowed is SET else value in allowed if isinstance(allowed, tuple) else value == allowed
            if not ok:
                return False
        return True


def requires(*requirements: Requirement) -> Callable[[Callable], Callable]:
    """Decorator: the entry runs only where the config meets these (`Requirement`); the config
    checks read them from the chosen entries, so a new method states its needs here, once."""
    def mark(fn: Callable) -> Callable:
        fn.requires = tuple(requirements)
        return fn
    return mark


def requirements_of(entry: Any) -> tuple[Requirement, ...]:
    """What `entry` (or the function under a `functools.partial`) declared with `requires`, or an
    engine kind's `requires` field; empty if nothing."""
    while hasattr(entry, "func"):
        entry = entry.func
    return tuple(getattr(entry, "requires", ()))


OBJECTIVE_NEEDS = ("logsumexp", "logit", "ref_logp", "ref_logsumexp", "token_rewards", "draws", "old_draws",
                   "trace")
"""Data an objective may declare, passed as keywords of the same names, each (B, T): the current
policy's `logsumexp` of its logits and the `logit` of the sampled token (from the forward that
gives `logp`, with gradients), the reference's `ref_logp` and `ref_logsumexp` (detached; a
reference is built for them), and `token_rewards`, the row's reward on its last valid token (NaN
on every token of an unscorable row). `draws` and `old_draws` are (B, n): a masked-diffusion
likelihood estimator's n Monte-Carlo draws per row under the current policy (with gradients) and
under the policy before the update (BGPO's per-draw bound). `trace` (B, T) long is the diffusion
sampler's step at which each token was committed (DiPO's per-step ratios)."""

ADVANTAGE_NEEDS = ("old_logp", "sum_pi_squared", "reward_components", "reward_weights", "baseline_rewards", "trace")
"""`AdvantageInputs` fields an estimator may declare: the behaviour policy's log-probs of the
sampled tokens and its Σ_v π_v² per position, from the trainer's old-policy pass (`BEHAVIOUR_NEEDS`);
each reward function's own score and its weight, from the verifier (GDPO); the reward of one
greedy completion per prompt, which the rollout phase then scores (ReMax); the masked-diffusion
rollouts' per-token commit step (LightningRL's tokens per forward)."""

BEHAVIOUR_NEEDS = frozenset({"old_logp", "sum_pi_squared"})
"""The advantage needs that the old-policy pass computes."""
