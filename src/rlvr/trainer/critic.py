"""Critic update for GAE: clipped value loss, token-mean over the optimizer step."""

from __future__ import annotations

import torch

from rlvr.algos.value import value_loss
from rlvr.batch import TrainBatch
from rlvr.models.value import ValueModel


@torch.no_grad()
def critic_values(critic: ValueModel, batch: TrainBatch, micro_batch_size: int) -> torch.Tensor:
    parts = [critic.values(batch.prompt_ids[i:i + micro_batch_size], batch.prompt_mask[i:i + micro_batch_size],
                           batch.completion_ids[i:i + micro_batch_size])
             for i in range(0, len(batch), micro_batch_size)]
    return torch.cat(parts) * batch.completion_mask


def critic_step(critic: ValueModel, optimizer, batch: TrainBatch, old_values: torch.Tensor, returns: torch.Tensor,
                *, value_clip: float | None, micro_batch_size: int, grad_clip: float) -> dict[str, float]:
    """One optimizer step of the critic on `batch` (rows aligned with old_values/returns)."""
    num_tokens = float(batch.completion_mask.sum())
    if num_tokens == 0:
        return {}
    sums = {"value_loss": 0.0, "value_clip_frac": 0.0, "value_abs_error": 0.0}
    for i in range(0, len(batch), micro_batch_size):
        rows = slice(i, i + micro_batch_size)
        mask = batch.completion_mask[rows]
        values = critic.values(batch.prompt_ids[rows], batch.prompt_mask[rows], batch.completion_ids[rows])
        loss_tok, metrics = value_loss(values, old_values[rows], returns[rows], mask, value_clip=value_clip)
        loss = (loss_tok * mask).sum() / num_tokens
        loss.backward()
        sums["value_loss"] += float(loss.detach())
        sums["value_clip_frac"] += float((metrics["value_clip_frac"] * mask).sum()) / num_tokens
        sums["value_abs_error"] += float((metrics["value_error"].abs() * mask).sum()) / num_tokens
    torch.nn.utils.clip_grad_norm_(critic.parameters(), grad_clip if grad_clip > 0 else float("inf"))
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return {f"critic/{k}": v for k, v in sums.items()}
