"""What the loop computes for entries that read more of the logits than the sampled token's
log-prob: the no-grad passes of the old policy and the reference, with the statistics the chosen
objective and advantage estimator declared (`rlvr.algos._registry.needs`), and the data keywords
the update step hands the objective. The builder resolves the declarations into the plan
(`plan.Passes`, `plan.LossSpec.stats` and `.fields`) and checks that the policy gives what they
ask (`builder.plans.check_statistics`); this module reads only those.

Nothing here runs for an entry that declares nothing: the passes then ask the policy for log-probs
only (`batch_logprobs`), exactly as before. A statistic comes from the forward that gives the
log-probs (`LogitStatsPolicy.batch_token_stats`), never from a second one.
"""

from __future__ import annotations

import torch

from rlvr.algos._advantage_core import AdvantageInputs, token_level_rewards
from rlvr.batch import TrainBatch
from rlvr.protocols import PolicyModel
from rlvr.runtime.distributed import ONE_PROCESS, Shard
from rlvr.trainer import budget
from rlvr.trainer.plan import AdvantageSpec, LossSpec, Passes

LOSS_STATS = ("logsumexp", "logit", "draws")
"""Objective needs that the update step's own forward provides (with gradients)."""
ROW_STATS = frozenset({"draws"})
"""Statistics per row (B, n), not per token: no completion mask applies."""


def _policy_outputs(policy: PolicyModel, mb: TrainBatch, stats: tuple[str, ...], with_entropy: bool = False):
    """(log-probs, entropy, {stat: (B, Tc)}): `batch_logprobs` when no stat is asked, a masked-diffusion
    policy's per-draw estimates for `draws` (BGPO), else a causal policy's logit statistics."""
    if not stats:
        return (*policy.batch_logprobs(mb, with_entropy=with_entropy), {})
    if stats == ("draws",):
        return policy.batch_draws(mb, with_entropy=with_entropy)
    return policy.batch_token_stats(mb, with_entropy=with_entropy, stats=stats)


@torch.no_grad()
def no_grad_outputs(policy: PolicyModel, batch: TrainBatch, micro_batch_size: int, rows=None,
                    stats: tuple[str, ...] = (), shard: Shard = ONE_PROCESS,
                    micro_batch_tokens: int = 0) -> dict[str, torch.Tensor]:
    """{"logp": (B, Tc), stat: (B, Tc) for each of `stats`} of `batch` under `policy`, without
    gradients, in micro-batches (split over `rows`, a RowPool, when given); 0 outside the mask.
    `shard`: this data-parallel rank computes its share of the rows and the shares are gathered.
    `micro_batch_tokens` > 0: micro-batches under that token budget (`trainer.budget`)."""
    def run(mb: TrainBatch) -> dict[str, torch.Tensor]:
        logp, _, extra = _policy_outputs(policy, mb, stats)
        return {"logp": logp, **extra}

    # a shorter share's missing last micro-batch runs a row of the batch whose outputs are dropped
    parts: list[dict[str, torch.Tensor]] = []
    picks = budget.micro_batches(batch, shard, micro_batch_size, micro_batch_tokens)
    for chunk in picks:
        mb = batch.select(chunk if chunk is not None else slice(0, 1))
        parts.extend([run(mb)] if rows is None else rows.map(lambda part, mb=mb: run(mb.select(part)), len(mb)))
    order = budget.rows_of(picks, len(batch))
    mine = {key: torch.cat([p[key] for p in parts])[:len(order)] for key in parts[0]}
    if micro_batch_tokens > 0:
        out = budget.gather_rows(shard, mine, order, len(batch))
    else:
        out = shard.cat_rows(mine, len(batch))
    mask = batch.completion_mask
    return {key: value.to(mask.device) * (1 if key in ROW_STATS else mask) for key, value in out.items()}


def old_pass(policy: PolicyModel, batch: TrainBatch, advantage: AdvantageSpec, passes: Passes,
             micro_batch_size: int, rows, needed: bool,
             shard: Shard = ONE_PROCESS,
             micro_batch_tokens: int = 0) -> tuple[torch.Tensor | None, dict[str, torch.Tensor]]:
    """(old log-probs or None, the `AdvantageInputs` keywords the estimator declared). The pass
    runs when the loop needs old log-probs (`needed`) or the estimator declared anything (the
    optimal token baseline reads the behaviour policy's log-probs and Σπ², as verl computes them in
    its old-log-prob pass); the log-probs are returned only when `needed`, so the on-policy
    shortcut (ρ ≡ 1) stays as it is. When the log-probs are needed and the objective declared
    `old_draws` (BGPO, `passes.old_draws`), the same forwards also set `batch.old_draws`."""
    declared = advantage.behaviour
    if not needed and not declared:
        return None, {}
    draws = ("draws",) if needed and passes.old_draws else ()
    out = no_grad_outputs(policy, batch, micro_batch_size, rows, passes.old_stats + draws, shard, micro_batch_tokens)
    batch.old_draws = out.get("draws")
    inputs = {"old_logp": out["logp"]} if "old_logp" in declared else {}
    inputs.update({k: out[k] for k in declared if k in out})
    return (out["logp"] if needed else None), inputs


def reference_pass(reference: PolicyModel, batch: TrainBatch, passes: Passes, micro_batch_size: int, rows,
                   shard: Shard = ONE_PROCESS, micro_batch_tokens: int = 0) -> None:
    """Set `batch.ref_logp` (and `batch.ref_logsumexp` when the objective declared it)."""
    out = no_grad_outputs(reference, batch, micro_batch_size, rows, passes.reference_stats, shard,
                          micro_batch_tokens)
    batch.ref_logp = out["logp"]
    batch.ref_logsumexp = out.get("logsumexp")


def reward_tokens(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, Tc): each row's reward on its last valid token, 0 elsewhere; NaN on every token of an
    unscorable row (the objective drops it)."""
    placed = token_level_rewards(AdvantageInputs(rewards=rewards.float(), group_size=1, response_mask=mask))
    return torch.where(torch.isnan(rewards)[:, None], torch.full_like(placed, float("nan")), placed)


def loss_outputs(policy: PolicyModel, mb: TrainBatch, spec: LossSpec):
    """The update step's forward: (log-probs, entropy, the objective's data keywords)."""
    logp, entropy, extra = _policy_outputs(policy, mb, spec.stats, with_entropy=True)
    # on-policy (no old pass) the old draws are this forward's, detached: ρ ≡ 1 per draw, as old_logp
    draws = extra.get("draws")
    old_draws = mb.old_draws if mb.old_draws is not None or draws is None else draws.detach()
    fields = {"ref_logp": mb.ref_logp, "ref_logsumexp": mb.ref_logsumexp, "token_rewards": mb.token_rewards,
              "old_draws": old_draws, "trace": mb.trace}
    data = {}
    for name in spec.fields:
        value = extra.get(name, fields.get(name))
        if value is None:
            raise ValueError(f"the objective needs {name!r}, which this batch does not carry")
        data[name] = value.to(logp.device)
    return logp, entropy, data
