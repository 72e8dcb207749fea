"""Which knob made a step's loss non-finite, read from the step's metrics and the resolved config.

A non-finite loss has one cause of a few kinds, each visible in what else went non-finite: rewards whose
mean or spread overflows (the reward function); the sampled log-probs (a temperature so small that
logits / T overflow); or a coefficient so large that its term, or its gradient, overflows (the KL or
entropy weight, the learning rate). The error names the first that fits, else the usual suspects.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from rlvr.errors import ConfigError

SAMPLED = ("actor/entropy", "actor/old_policy_kl", "actor/ratio", "actor/rollout_logprob_gap")
"""Metrics of the log-probs themselves: non-finite when the logits are, before any coefficient."""
HUGE = 1e6  # a loss coefficient past this is a typo or a probe, not a setting (typical: 1e-3 to 1)
TINY_TEMPERATURE = 1e-3  # logits / T overflow float32 once T is this small for a logit of ~1e35 · T


class NonFiniteLoss(ConfigError, FloatingPointError):
    """The step's loss or gradient norm is inf or NaN; the message names the knob responsible."""


def nonfinite_loss(step: int, metrics: Mapping[str, float], config: Mapping) -> NonFiniteLoss:
    """The one-line error for a step whose loss is not finite. `config`: the resolved config tree."""
    bad = sorted(k for k, v in metrics.items() if isinstance(v, float) and not math.isfinite(v))
    algo, rollout = config.get("algo", {}), config.get("rollout", {})
    head = f"non-finite loss at step {step} ({', '.join(bad[:4])} not finite)"
    reward = [k for k in ("reward/mean", "reward/std") if k in bad or abs(metrics.get(k, 0.0)) > 1e30]
    if reward:
        return NonFiniteLoss(f"reward: {head}: the rewards' {reward[0].split('/')[1]} overflows; have the reward "
                             f"function (reward.fn) return bounded numbers, e.g. in [0, 1]")
    temperature = rollout.get("temperature") or 1.0
    if any(k in bad for k in SAMPLED) and 0 < temperature < TINY_TEMPERATURE:
        return NonFiniteLoss(f"rollout.temperature: {head}: logits / {temperature:g} overflow; use a temperature "
                             f"of 0.1 or more, e.g. 1.0")
    for key, value in (("algo.kl_coef", algo.get("kl_coef")), ("algo.entropy_coef", algo.get("entropy_coef"))):
        if value is not None and abs(value) > HUGE:
            return NonFiniteLoss(f"{key}: {head}: a weight of {value:g} overflows the loss or its gradient; "
                                 f"use a value like 0.001 to 0.1")
    return NonFiniteLoss(f"optim.lr: {head}; lower optim.lr (now {config.get('optim', {}).get('lr')}) or raise "
                         f"algo.adv_eps")
