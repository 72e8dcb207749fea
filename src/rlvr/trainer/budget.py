"""Token-budget micro-batches (`trainer.micro_batch_tokens`): the rows of a batch bin-packed into
forwards of at most a budget of tokens, balanced over the data-parallel ranks.

A row costs its real prompt tokens plus its completion tokens up to the last scored one; the rows
of a group (consecutive rows with one prompt) are packed together and their prompt is counted
once, as the shared-prompt forward computes it (`models.packing`). Groups go into bins first-fit
decreasing (a group larger than the budget is split into row runs); bins go to the rank with the
fewest tokens so far, largest first (longest-processing-time), and every rank runs as many forwards
(a rank short of bins runs stand-ins that add nothing), so a sharded model's collectives pair up.

The loss is normalised by the whole step's counts before any forward (`global_counts`), so the
update equals the row-count micro-batching's to float rounding (a test checks it). Deviation from
verl's `rearrange_micro_batches`: the budget bounds every micro-batch, not their mean.
"""

from __future__ import annotations

import torch

from rlvr.batch import TrainBatch
from rlvr.errors import ConfigError
from rlvr.runtime.distributed import Shard


def _lengths(batch: TrainBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """(prompt tokens (B,), completion tokens up to the last scored one (B,))."""
    mask = batch.completion_mask != 0
    last = torch.where(mask, torch.arange(mask.shape[1]) + 1, 0).max(-1).values if mask.shape[1] else mask.sum(-1)
    return batch.prompt_mask.sum(-1).long(), last.long()


def _groups(batch: TrainBatch) -> list[list[int]]:
    """Runs of consecutive rows with the same prompt (ids and mask)."""
    ids, mask = batch.prompt_ids, batch.prompt_mask
    runs: list[list[int]] = []
    for i in range(len(batch)):
        if runs and torch.equal(ids[i], ids[runs[-1][0]]) and torch.equal(mask[i], mask[runs[-1][0]]):
            runs[-1].append(i)
        else:
            runs.append([i])
    return runs


def token_bins(batch: TrainBatch, budget: int) -> list[list[int]]:
    """The rows of `batch` in bins of at most `budget` tokens (a group's prompt counted once),
    first-fit decreasing over groups; each bin's rows in batch order. ConfigError naming
    `trainer.micro_batch_tokens` when one row alone exceeds the budget."""
    prompt, completion = _lengths(batch)
    row_cost = prompt + completion
    if len(batch) and int(row_cost.max()) > budget:
        raise ConfigError(f"trainer.micro_batch_tokens={budget} is smaller than one row "
                          f"({int(row_cost.max())} prompt + completion tokens); raise it to at least that, "
                          f"or set 0 to use trainer.micro_batch_size")
    items: list[tuple[int, list[int]]] = []  # (cost, rows)
    for group in _groups(batch):
        run, cost = [], int(prompt[group[0]])
        for i in group:  # a group over the budget becomes runs of rows, each with its own prompt copy
            if run and cost + int(completion[i]) > budget:
                items.append((cost, run))
                run, cost = [], int(prompt[i])
            run.append(i)
            cost += int(completion[i])
        items.append((cost, run))
    bins: list[tuple[int, list[int]]] = []
    for cost, rows in sorted(items, key=lambda item: -item[0]):  # stable: equal costs keep batch order
        for k, (used, held) in enumerate(bins):
            if used + cost <= budget:
                bins[k] = (used + cost, held + rows)
                break
        else:
            bins.append((cost, list(rows)))
    return [sorted(rows) for _, rows in bins]


def rank_bins(batch: TrainBatch, budget: int, shard: Shard) -> list[torch.Tensor | None]:
    """This rank's token-budget micro-batches (row index tensors into `batch`), as many on every
    rank: None where this rank has run out (the caller runs a stand-in that adds nothing)."""
    bins = token_bins(batch, budget)
    prompt, completion = _lengths(batch)
    cost = [int(prompt[b].sum() + completion[b].sum()) for b in bins]
    load, owned = [0] * shard.size, [[] for _ in range(shard.size)]
    for k in sorted(range(len(bins)), key=lambda k: -cost[k]):
        rank = min(range(shard.size), key=lambda r: (load[r], r))
        load[rank] += cost[k]
        owned[rank].append(bins[k])
    longest = max(len(o) for o in owned)
    mine = [torch.tensor(b, dtype=torch.long) for b in sorted(owned[shard.rank])]
    return mine + [None] * (longest - len(mine))


def micro_batches(batch: TrainBatch, shard: Shard, size: int, tokens: int) -> list[slice | torch.Tensor | None]:
    """This rank's micro-batches of `batch`: `tokens` > 0 a token budget (`rank_bins`), else `size`
    rows each over this rank's consecutive share (`Shard.micro_batches`)."""
    if tokens > 0:
        return rank_bins(batch, tokens, shard)
    return shard.micro_batches(len(batch), size)


def rows_of(chunks: list[slice | torch.Tensor | None], count: int) -> torch.Tensor:
    """The rows `chunks` cover, in chunk order (a slice as its row indices)."""
    parts = [torch.arange(count)[c] if isinstance(c, slice) else c for c in chunks if c is not None]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)


def gather_rows(shard: Shard, parts: dict[str, torch.Tensor], rows: torch.Tensor,
                count: int) -> dict[str, torch.Tensor]:
    """{key: (count, ...)}: this rank's outputs for `rows` (in that order) placed at their rows,
    the other ranks' added (rows are disjoint: a sum of zero-filled tensors), on every rank."""
    out = {}
    for key in sorted(parts):
        value = parts[key]
        full = value.new_zeros((count, *value.shape[1:]))
        full[rows.to(value.device)] = value
        if shard.size > 1:
            torch.distributed.all_reduce(full, group=shard.group)
        out[key] = full
    return out


def layout_metrics(batch: TrainBatch, forwards: int) -> dict[str, float]:
    """What padding-free forwards save on `batch`: `perf/padding_share`, the share of a padded
    forward's positions (every row at the batch's prompt + completion width) that are padding;
    `perf/shared_prompt_share`, the share of the real tokens that are repeated prompts (computed
    once per group by the shared-prompt forward); `perf/tokens_per_micro_batch`, real tokens per
    forward (over `forwards` forwards, all ranks). Logged every step (`trainer.sync.rl_step`)."""
    prompt, completion = _lengths(batch)
    real = float(prompt.sum() + completion.sum())
    width = batch.prompt_ids.shape[1] + batch.completion_ids.shape[1]
    repeated = real - sum(float(prompt[g[0]] + completion[g].sum()) for g in _groups(batch))
    return {"perf/padding_share": 1.0 - real / max(len(batch) * width, 1),
            "perf/shared_prompt_share": repeated / max(real, 1.0),
            "perf/tokens_per_micro_batch": real / max(forwards, 1)}
