"""Loss aggregations: per-token loss (B, T) -> this micro-batch's share of the step's loss.

Papers (arXiv ids and links in docs/papers.md):
- `token_mean`: DAPO (Yu et al. 2025), token-level policy-gradient loss.
- `seq_mean_token_mean`: DeepSeekMath GRPO (Shao et al. 2024), per-sample mean then batch mean.
- `seq_mean_token_sum_norm`: Dr.GRPO (Liu et al. 2025), divide by a constant length.
- `token_sum`, `seq_mean_token_sum`: plain sums, as in verl's `agg_loss` modes.
- `step_mean`: CJ-GRPO (Yang et al. 2025), masked-diffusion rollouts: the mean over sampler steps of
  the mean loss of the tokens each step committed (declares `trace`, the sampler's commit steps).

Signature of every aggregation:
    fn(loss_tok (B, T), mask (B, T), *, num_tokens, num_seqs, norm_length) -> scalar Tensor
`num_tokens` and `num_seqs` are GLOBAL counts over the whole optimizer step (every micro-batch,
every data-parallel rank); each call returns its micro-batch's contribution, so summing the
returned values over the micro-batches of a step gives the step's aggregate exactly, and the
gradient does not depend on how the step is split. Each function accepts all three keywords and
ignores those it does not need; `global_counts` computes the first two from the step's masks.

Hyperparameters:
- `norm_length` (float): the constant length L_norm of Dr.GRPO's `seq_mean_token_sum_norm`
  (typically the maximum completion length).

Deliberate deviations:
1. No data-parallel factor D inside: the caller owns how gradients are reduced across ranks
   (with DDP's mean reduction, multiply by the world size there).
2. `seq_mean_token_sum_norm` divides by num_seqs * norm_length (verl's newer form and TRL's
   `dr_grpo`); verl's 2026-01 tree left out num_seqs. `norm_length` must be given, there is no
   silent fallback to the padded width of whatever micro-batch arrives.
3. A row with no valid token contributes 0 to `seq_mean_token_mean` (its length is clamped to
   1), rather than 0/(0 + 1e-8). Whether such rows count in `num_seqs` is the caller's choice;
   `global_counts` counts only non-empty rows, like verl.
4. Padding is zeroed with `torch.where`, so inf/NaN at masked positions cannot leak through 0*inf.
5. `step_mean` normalises per row, (1/N) Σ_i (1/S_i) Σ_s mean_{t ∈ U_is} ℓ_it; CJ-GRPO's code takes
   each step's token mean over the whole batch, Σ_s (1/S) Σ_{i,t ∈ U_s} ℓ_it / |U_s|. The two are equal
   when every row commits the same number of valid tokens at each step (a fixed step schedule and
   `rollout.window=full`, CJ-GRPO's setting), and the per-row form splits exactly over micro-batches.
   Tokens never committed by the sampler (trace -1: IGPO's inpainted hint) carry no loss.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import Tensor

from rlvr.algos._registry import Requirement, lookup, needs, requires

__all__ = [
    "AGGREGATIONS",
    "counts_tokens",
    "get_aggregation",
    "global_counts",
    "seq_mean_token_mean",
    "seq_mean_token_sum",
    "seq_mean_token_sum_norm",
    "step_mean",
    "token_mean",
    "token_sum",
]


def global_counts(masks: Iterable[Tensor]) -> tuple[float, float]:
    """(num_tokens, num_seqs) over every (B_mb, T) mask of one optimizer step.

    num_seqs counts rows with at least one valid token.
    """
    num_tokens, num_seqs = 0.0, 0.0
    for m in masks:
        num_tokens += float(m.sum().item())
        num_seqs += float((m.sum(dim=-1) > 0).sum().item())
    return num_tokens, num_seqs


def _row_sums(loss_tok: Tensor, mask: Tensor) -> Tensor:
    """(B,) per-sequence sum of the valid per-token losses."""
    return torch.where(mask > 0, loss_tok, torch.zeros_like(loss_tok)).sum(dim=-1)


def _need(value: float | None, name: str, fn: str) -> float:
    if value is None:
        raise ValueError(f"aggregation {fn!r} needs {name}")
    if value <= 0:
        raise ValueError(f"aggregation {fn!r}: {name} must be > 0, got {value}")
    return float(value)


def token_mean(
    loss_tok: Tensor,
    mask: Tensor,
    *,
    num_tokens: float | None = None,
    num_seqs: float | None = None,
    norm_length: float | None = None,
) -> Tensor:
    """Sum of valid token losses / num_tokens: every token of the step weighs the same."""
    return _row_sums(loss_tok, mask).sum() / _need(num_tokens, "num_tokens", "token_mean")


def token_sum(
    loss_tok: Tensor,
    mask: Tensor,
    *,
    num_tokens: float | None = None,
    num_seqs: float | None = None,
    norm_length: float | None = None,
) -> Tensor:
    """Plain sum of valid token losses (scale grows with batch and length)."""
    return _row_sums(loss_tok, mask).sum()


def seq_mean_token_sum(
    loss_tok: Tensor,
    mask: Tensor,
    *,
    num_tokens: float | None = None,
    num_seqs: float | None = None,
    norm_length: float | None = None,
) -> Tensor:
    """Mean over sequences of each sequence's summed token loss."""
    return _row_sums(loss_tok, mask).sum() / _need(num_seqs, "num_seqs", "seq_mean_token_sum")


def seq_mean_token_mean(
    loss_tok: Tensor,
    mask: Tensor,
    *,
    num_tokens: float | None = None,
    num_seqs: float | None = None,
    norm_length: float | None = None,
) -> Tensor:
    """Mean over sequences of each sequence's mean token loss (GRPO's sample-level loss)."""
    lengths = mask.sum(dim=-1).clamp(min=1)  # (B,)
    per_seq = _row_sums(loss_tok, mask) / lengths
    return per_seq.sum() / _need(num_seqs, "num_seqs", "seq_mean_token_mean")


def seq_mean_token_sum_norm(
    loss_tok: Tensor,
    mask: Tensor,
    *,
    num_tokens: float | None = None,
    num_seqs: float | None = None,
    norm_length: float | None = None,
) -> Tensor:
    """Dr.GRPO: sum of valid token losses / (num_seqs * norm_length), a constant normaliser
    that does not favour short or long completions."""
    fn = "seq_mean_token_sum_norm"
    denom = _need(num_seqs, "num_seqs", fn) * _need(norm_length, "norm_length", fn)
    return _row_sums(loss_tok, mask).sum() / denom


@requires(Requirement({"model.kind": "diffusion"}, "step_mean averages over the diffusion sampler's steps; set "
                     "model.kind=diffusion or use seq_mean_token_mean"))
@needs("trace")
def step_mean(
    loss_tok: Tensor,
    mask: Tensor,
    *,
    trace: Tensor | None = None,
    num_tokens: float | None = None,
    num_seqs: float | None = None,
    norm_length: float | None = None,
) -> Tensor:
    """CJ-GRPO's per-step mean: row i's loss is the mean over its sampler steps s of the mean loss
    of the valid tokens committed at s (`trace` (B, T) holds each token's step), and rows are
    averaged over num_seqs (deviation 5). A token committed alone at a step weighs as much as a
    whole later step's tokens together, so the early, small steps of an ascending schedule count."""
    if trace is None:
        raise ValueError("aggregation 'step_mean' needs the sampler's commit steps: model.kind=diffusion rollouts")
    trace = trace.to(loss_tok.device)
    keep = (mask > 0) & (trace >= 0)
    steps = int(trace.max().clamp(min=0)) + 1  # over every position: the one-hot must hold them all
    at_step = torch.nn.functional.one_hot(trace.clamp(min=0), steps).to(loss_tok.dtype)  # (B, T, S)
    at_step = at_step * keep[..., None].to(loss_tok.dtype)
    clean = torch.where(keep, loss_tok, torch.zeros_like(loss_tok))
    step_sums = torch.einsum("bt,bts->bs", clean, at_step)
    step_sizes = at_step.sum(1)  # (B, S): valid tokens committed at each step
    step_means = step_sums / step_sizes.clamp(min=1)
    per_row = step_means.sum(-1) / (step_sizes > 0).sum(-1).clamp(min=1)
    return per_row.sum() / _need(num_seqs, "num_seqs", "step_mean")


AGGREGATIONS: dict[str, Callable[..., Tensor]] = {
    "token_mean": token_mean,
    "token_sum": token_sum,
    "seq_mean_token_sum": seq_mean_token_sum,
    "seq_mean_token_mean": seq_mean_token_mean,
    "seq_mean_token_sum_norm": seq_mean_token_sum_norm,
    "step_mean": step_mean,
}


TOKEN_WEIGHTED = frozenset({token_mean})
"""The aggregations in which every token of the step weighs the same (rather than every row): a
loss mixed into them (the expert rows' μ) is counted in tokens."""


def counts_tokens(aggregation: Callable) -> bool:
    """Whether `aggregation` (or the function under a `functools.partial`) weighs every token alike."""
    while hasattr(aggregation, "func"):
        aggregation = aggregation.func
    return aggregation in TOKEN_WEIGHTED


def get_aggregation(name: str) -> Callable[..., Tensor]:
    """The aggregation registered as `name`; ValueError listing valid names otherwise."""
    return lookup(AGGREGATIONS, "aggregation", name)
