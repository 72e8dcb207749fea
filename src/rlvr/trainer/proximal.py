"""The proximal policy's log-probs from the update's own forward, in a step with one update.

Decoupled PPO (a stale batch under `trainer.max_staleness`) and the rollout correction weight each
token by pi_prox / pi_behav, pi_prox being the policy before the update, and the gap metrics compare
pi_prox with the sampler's log-probs. When the step makes one optimizer step (`ppo_epochs=1`,
`minibatches=1`) the policy before the update is the one the update's forward runs with (the
micro-batches' gradients accumulate before the weights move), so that forward's detached log-probs
are pi_prox, and the separate forward over the whole batch before the update is not needed: it cost
about a third of the update (0.057 of 0.157 CPU-seconds per step at the default scale, 1 thread).

Whether a run's steps can do this is the builder's decision (`builder.plans.fusable`, recorded as
`ProximalSource.FUSED` in the step plan). The weights are computed per micro-batch inside the
loss (`plan.LossSpec.proximal_weights`; every weight is a function of its own token or row), the
forward's log-probs are kept, and the gap and behaviour metrics are computed from them after the
update: the same numbers as from a separate forward, up to float rounding between a no-grad and a
training forward (the clip ratio is then exactly 1 in value, which it is up to that rounding
otherwise).
"""

from __future__ import annotations

import math

import torch

from rlvr.algos.correction import mismatch_metrics


def placed(kept: list[torch.Tensor], rows: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The kept log-probs (in the update's row order `rows`) back in the batch's row order, 0 where
    `mask` is (as a separate forward's)."""
    out = torch.empty_like(mask)
    out[rows.to(mask.device)] = torch.cat(kept).to(mask)
    return out * mask


def gap_metrics(old_logp, rollout_logp, mask, weigh) -> tuple[dict[str, float], dict[str, float]]:
    """({} or how far the sampler's log-probs are from the trainer's on the sampled tokens:
    `mismatch_kl` (k3 estimate of KL(rollout || trainer)), `mismatch_k1`, and the largest per-token
    probability ratio either way, `mismatch_max_ratio`; {} or the metrics of the weights `weigh`)."""
    if old_logp is None:
        return {}, {}
    gap = mismatch_metrics(old_logp, rollout_logp, mask)
    worst = gap["mismatch_max_abs"]
    return ({"mismatch_kl": gap["mismatch_k3"], "mismatch_k1": gap["mismatch_k1"], "mismatch_max_abs": worst,
             "mismatch_max_ratio": math.exp(min(worst, 20.0))},
            {} if weigh is None else weigh(old_logp, rollout_logp, mask)[1])
