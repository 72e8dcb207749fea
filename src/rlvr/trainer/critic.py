"""Critic update for GAE: clipped value loss, token-mean over the optimizer step.

Data-parallel learners (`shard`) split the rows as the policy's passes do (`logit_stats`,
`step`): each rank computes its share's values, which are all-gathered; each rank trains its
share of a minibatch with the loss normalised by the minibatch's global token count, and FSDP2
reduce-scatters the gradients, so the critic's update and metrics are the single process's.
"""

from __future__ import annotations

import torch

from rlvr.algos.value import value_loss
from rlvr.batch import TrainBatch
from rlvr.models.value import ValueModel
from rlvr.runtime.distributed import ONE_PROCESS, Shard
from rlvr.trainer import budget


@torch.no_grad()
def critic_values(critic: ValueModel, batch: TrainBatch, micro_batch_size: int,
                  shard: Shard = ONE_PROCESS, micro_batch_tokens: int = 0) -> torch.Tensor:
    """(B, Tc) values of `batch`, 0 outside the mask; `shard`: this rank's rows, the shares gathered;
    `micro_batch_tokens` > 0: forwards under that token budget (`trainer.budget`)."""
    parts = []
    picks = budget.micro_batches(batch, shard, micro_batch_size, micro_batch_tokens)
    for rows in picks:
        taken = slice(0, 1) if rows is None else rows  # a shorter share's missing micro-batch: a stand-in, dropped
        part = critic(batch.prompt_ids[taken], batch.prompt_mask[taken], batch.completion_ids[taken],
                      batch.completion_mask[taken])
        parts.append(part if rows is not None else part[:0])
    mine = torch.cat(parts) if parts else batch.completion_mask[:0]
    if micro_batch_tokens > 0:
        return budget.gather_rows(shard, {"values": mine}, budget.rows_of(picks, len(batch)),
                                  len(batch))["values"] * batch.completion_mask
    return shard.cat_rows({"values": mine}, len(batch))["values"] * batch.completion_mask


def critic_step(critic: ValueModel, optimizer, batch: TrainBatch, old_values: torch.Tensor, returns: torch.Tensor,
                *, value_clip: float | None, micro_batch_size: int, grad_clip: float,
                shard: Shard = ONE_PROCESS, micro_batch_tokens: int = 0) -> dict[str, float]:
    """One optimizer step of the critic on `batch` (rows aligned with old_values/returns); `shard`:
    this rank trains its share of the rows, the metric sums are summed over the ranks."""
    num_tokens = float(batch.completion_mask.sum())  # the whole minibatch's: every rank holds it
    if num_tokens == 0:
        return {}
    sums = {"value_loss": 0.0, "value_clip_frac": 0.0, "value_abs_error": 0.0}
    for rows in budget.micro_batches(batch, shard, micro_batch_size, micro_batch_tokens):
        stand_in = rows is None  # a row with no tokens in the loss: a forward and backward that add nothing
        rows = slice(0, 1) if stand_in else rows
        mask = batch.completion_mask[rows] * (0.0 if stand_in else 1.0)
        values = critic(batch.prompt_ids[rows], batch.prompt_mask[rows], batch.completion_ids[rows],
                        batch.completion_mask[rows])
        loss_tok, metrics = value_loss(values, old_values[rows], returns[rows], mask, value_clip=value_clip)
        loss = (loss_tok * mask).sum() / num_tokens
        (loss * shard.size).backward()  # FSDP averages the ranks' gradients: their sum is the single process's
        sums["value_loss"] += float(loss.detach())
        sums["value_clip_frac"] += float((metrics["value_clip_frac"] * mask).sum()) / num_tokens
        sums["value_abs_error"] += float((metrics["value_error"].abs() * mask).sum()) / num_tokens
    torch.nn.utils.clip_grad_norm_(critic.parameters(), grad_clip if grad_clip > 0 else float("inf"))
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return {f"critic/{k}": v for k, v in shard.sum(sums).items()}
