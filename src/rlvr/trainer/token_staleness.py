"""Per-token staleness of an asynchronous batch: how many versions behind the learner each
completion token's sampling weights are, the tokens within the bound, and the step's summary.

Under partial rollouts (`trainer.partial_rollouts`) a weight update reaches a batch in flight, so
one completion's tokens come from several versions (`Rollouts.versions`); otherwise every token of
a batch comes from the version its sampling began with. Admission (AReaL's
`max_head_offpolicyness`) bounds a batch's oldest token by η; `trainer.max_token_staleness` may
bound each token tighter, and the tokens over it are masked out of the loss, the rest of their
sample still training (AReaL's `behav_imp_weight_cap` likewise filters tokens, not samples).
"""

from __future__ import annotations

import torch

from rlvr.batch import Rollouts


def token_staleness(rollouts: Rollouts, version: int, learner_version: int) -> torch.Tensor:
    """(B, Tc) long: `learner_version` minus each completion token's sampling version, -1 on padding.
    A token without a recorded version is the batch's `version`'s; none is older than it (a server
    whose first push has not come reports its start weights as 0: they are the batch's)."""
    valid = rollouts.completion_mask > 0
    versions = rollouts.versions
    if versions is None:
        versions = torch.full(valid.shape, version, dtype=torch.long)
    versions = versions.clamp(min=version)
    return torch.where(valid, learner_version - versions, torch.full_like(versions, -1))


def within_bound(staleness: torch.Tensor, bound: int) -> torch.Tensor | None:
    """(B, Tc) float, 1 on the tokens at most `bound` versions stale (padding too: its mask is 0
    anyway), or None when every token is within it (the loss mask unchanged)."""
    keep = staleness <= bound
    return None if bool(keep.all()) else keep.float()


def staleness_metrics(staleness: torch.Tensor, bound: int, most: int) -> dict[str, float]:
    """The step's per-token staleness: mean, max, the share over `bound` (masked out of the loss),
    the share of each age 0..`most` (η), and the share of completions whose tokens span versions."""
    valid = staleness >= 0
    ages = staleness[valid].float()
    if not len(ages):
        return {"rollout/staleness_mean": 0.0, "rollout/staleness_max": 0.0, "rollout/staleness_over_frac": 0.0}
    spans = torch.where(valid, staleness, staleness.max() + 1).amin(-1) != torch.where(valid, staleness, -1).amax(-1)
    rows = valid.any(-1)
    metrics = {"rollout/staleness_mean": float(ages.mean()), "rollout/staleness_max": float(ages.max()),
               "rollout/staleness_over_frac": float((ages > bound).float().mean()),
               "rollout/staleness_mixed_rows_frac": float((spans & rows).float().sum() / rows.sum().clamp(min=1))}
    metrics.update({f"rollout/staleness_{k}_frac": float((ages == k).float().mean()) for k in range(most + 1)})
    return metrics
