"""The update step: micro-batches -> log-probs -> objective -> aggregate -> backward -> clip -> step.

One function, shared by every loop. The aggregation is normalised by counts over
the whole optimizer step, computed before the first micro-batch, so gradients do not depend on
`micro_batch_size` (a test checks 1 vs 4 micro-batches).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from rlvr.algos.aggregate import global_counts
from rlvr.batch import TrainBatch
from rlvr.protocols import PolicyModel
from rlvr.runtime.distributed import ONE_PROCESS, Shard
from rlvr.runtime.fsdp import scalar
from rlvr.runtime.rows import RowPool
from rlvr.trainer import budget
from rlvr.trainer.expert import split_loss
from rlvr.trainer.logit_stats import loss_outputs
from rlvr.trainer.plan import LossSpec

__all__ = ["LossSpec", "micro_batch_loss", "optimizer_step"]


def micro_batch_loss(policy: PolicyModel, mb: TrainBatch, spec: LossSpec, *, num_tokens: float, num_seqs: float,
                     kl_coef: float = 0.0, keep: list | None = None):
    """This micro-batch's share of the step loss, and its per-token metric sums (masked); `kl_coef`
    weighs the KL term of `spec.kl_estimator`; `keep` (a list) gets the forward's detached log-probs
    appended."""
    # An objective that declared more than log-probs (ShiQ's logsumexp) gets it from this same forward.
    logp, entropy, data = loss_outputs(policy, mb, spec)
    mb = mb.to(logp.device)  # the loss runs where the model does
    if keep is not None:
        keep.append(logp.detach())
    old = logp.detach() if mb.old_logp is None else mb.old_logp
    mask = mb.completion_mask
    if mb.expert is None or spec.expert is None:
        loss_tok, tok_metrics = spec.objective(logp, old, mb.advantages, mask, **data)
    else:  # off-policy expert rows in the batch: each side gets its own objective
        loss_tok, tok_metrics = split_loss(spec.objective, spec.expert, logp, old, mb, mask, data)
    if spec.kl_estimator is not None and kl_coef > 0:
        kl_tok = spec.kl_estimator(logp, mb.ref_logp, old_logp=old)
        loss_tok = loss_tok + kl_coef * kl_tok
        tok_metrics = {**tok_metrics, "kl": kl_tok.detach()}
    if spec.entropy_coef:
        loss_tok = loss_tok - spec.entropy_coef * entropy
    if mb.loss_weights is not None:
        loss_tok = loss_tok * mb.loss_weights
    if spec.proximal_weights is not None:
        loss_tok = loss_tok * spec.proximal_weights(logp.detach(), mb.rollout_logp, mask)[0]
    if mb.sample_weight is not None:
        loss_tok = loss_tok * mb.sample_weight.to(loss_tok.device)[:, None]
    # an aggregation that declared batch fields gets them by name (CJ-GRPO's per-step mean: the trace)
    declared = {name: getattr(mb, name) for name in spec.aggregation_fields}
    loss = spec.aggregation(loss_tok, mask, num_tokens=num_tokens, num_seqs=num_seqs, **declared)
    sums = {name: float((value.detach() * mask).sum()) for name, value in tok_metrics.items()}
    sums.update(_drift_sums(logp, old, mask, sums))
    sums["entropy"] = float((entropy.detach() * mask).sum())
    if mb.rollout_logp is not None:  # how far the sampler's log-probs are from the trainer's
        sampled = mask if mb.expert is None else mask * (~mb.expert.to(mask.device))[:, None]
        sums["rollout_logprob_gap"] = float(((old - mb.rollout_logp).abs() * sampled).sum())
    return loss, sums


def _drift_sums(logp, old, mask, sums: dict[str, float]) -> dict[str, float]:
    """Policy-drift metric sums logged in every configuration, KL term on or off: the k1 estimate
    of KL(old || new) on the old policy's samples, sum of (old_logp - logp) (verl's
    `actor/ppo_kl`, cleanrl's `approx_kl`), and the clip fractions split low/high (0 for an
    objective that never clips: `reinforce`, `sapo`, `wd1`)."""
    keep = mask > 0
    diff = torch.where(keep, old.detach() - logp.detach(), torch.zeros_like(logp))
    out = {"old_policy_kl": float(diff.sum())}
    for key in ("clip_frac_low", "clip_frac_high"):
        out[key] = sums.get(key, 0.0)
    return out


def optimizer_step(policy: PolicyModel, optimizer: torch.optim.Optimizer,
                   scheduler: torch.optim.lr_scheduler.LRScheduler, batch: TrainBatch, spec: LossSpec, *,
                   micro_batch_size: int, grad_clip: float, kl_coef: float = 0.0, rows: RowPool | None = None,
                   keep: list | None = None, shard: Shard = ONE_PROCESS,
                   micro_batch_tokens: int = 0) -> dict[str, float]:
    """One optimizer step over `batch`, accumulated over micro-batches, the KL term weighed by
    `kl_coef`. Returns metrics.

    `rows` (a `runtime.rows.RowPool`, optional) splits each micro-batch over worker threads. `keep`
    (a list) gets the detached log-probs of the step's forwards, in `batch`'s row order. `shard`:
    this data-parallel rank trains its share of `batch`'s rows; the counts, the loss and the metric
    sums are the whole batch's (summed over the ranks), so the update is the single process's.
    `micro_batch_tokens` > 0: micro-batches under that token budget (`trainer.budget`), not
    `micro_batch_size` rows; `keep` then still gets this rank's rows in `batch`'s order."""
    whole = batch.completion_mask
    counts = dict(zip(("num_tokens", "num_seqs"), global_counts([whole])))
    if counts["num_tokens"] == 0:
        if keep is not None:  # no forward ran: the log-probs are 0, as outside any mask
            keep.append(torch.zeros_like(whole))
        return {}
    picks = budget.micro_batches(batch, shard, micro_batch_size, micro_batch_tokens)
    # a shorter share's missing last micro-batch is a row with no tokens in the loss
    chunks = [batch.select(rows) if rows is not None else _no_tokens(batch) for rows in picks]
    kept = [] if keep is not None else None
    totals: dict[str, float] = {}
    loss_value = 0.0
    for mb in chunks:
        for loss, sums in _backward(policy, mb, spec, {**counts, "kl_coef": kl_coef}, rows, kept, shard.size):
            loss_value += loss
            for key, value in sums.items():
                totals[key] = totals.get(key, 0.0) + value
    if keep is not None:  # back in batch order (token-budget bins are not consecutive rows)
        order = budget.rows_of(picks, len(batch))
        kept = torch.cat(kept)[:len(order)] if kept else whole[:0]  # stand-in rows come last
        keep.append(kept[torch.argsort(order)])
    totals = shard.sum({**totals, "loss/policy": loss_value})
    loss_value = totals.pop("loss/policy")
    params = [p for p in policy.parameters() if p.grad is not None]
    grad_norm = torch.nn.utils.clip_grad_norm_(params, grad_clip if grad_clip > 0 else float("inf"))
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    metrics = {f"actor/{k}": v / counts["num_tokens"] for k, v in totals.items()}
    metrics.update({"loss/policy": loss_value, "actor/grad_norm": scalar(grad_norm),
                    "actor/lr": scheduler.get_last_lr()[0]})
    return metrics


def _no_tokens(batch: TrainBatch) -> TrainBatch:
    """One row of `batch` with an all-zero completion mask: a forward and backward that add
    nothing to the loss, its gradient or its metric sums."""
    row = batch.select(slice(0, 1))
    return replace(row, completion_mask=torch.zeros_like(row.completion_mask))


def _backward(policy: PolicyModel, mb: TrainBatch, spec: LossSpec, counts: dict, rows: RowPool | None,
              keep: list | None, ranks: int = 1) -> list[tuple[float, dict]]:
    """Accumulate `mb`'s gradient into `.grad`; its (loss, metric sums), one per piece of rows.

    FSDP averages the `ranks` ranks' gradients and the loss is already normalised by the global
    counts, so each rank's backward is scaled by `ranks` (the sum the single process takes).
    With a row pool each worker takes `torch.autograd.grad` of its rows' loss, and the pieces
    are added in row order: the same sums as serial micro-batches of those rows."""
    if rows is None:
        loss, sums = micro_batch_loss(policy, mb, spec, **counts, keep=keep)
        (loss * ranks).backward()
        return [(float(loss.detach()), sums)]
    params = [p for p in policy.parameters() if p.requires_grad]

    def piece(part: slice):
        kept = [] if keep is not None else None  # per piece: the workers finish in any order
        loss, sums = micro_batch_loss(policy, mb.select(part), spec, **counts, keep=kept)
        return float(loss.detach()), sums, torch.autograd.grad(loss * ranks, params, allow_unused=True), kept

    results = rows.map(piece, len(mb))
    for _, _, grads, kept in results:
        for p, g in zip(params, grads):
            if g is not None:
                p.grad = g if p.grad is None else p.grad.add_(g)
        if keep is not None:
            keep.extend(kept)
    return [(loss, sums) for loss, sums, _, _ in results]
