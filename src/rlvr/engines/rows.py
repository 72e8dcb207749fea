"""A rollout engine across the row pool's workers: each samples its share of a batch's rows."""

from __future__ import annotations

import contextlib

from rlvr.batch import Rollouts, concat_rollouts
from rlvr.kernels.decoder import shared_weights
from rlvr.runtime.rows import RowPool


def split_engine(engine, pool: RowPool, pad_id: int, model=None):
    """A rollout engine that samples each worker's share of the rows and stacks the results
    (same samples as the whole batch: every row has its own seed). With `model` the workers'
    decoders prepare its weights once per batch (`kernels.decoder.shared_weights`)."""

    def run(prompt_ids, prompt_mask, seeds, **kwargs) -> Rollouts:
        with shared_weights(model) if model is not None else contextlib.nullcontext():
            parts = pool.map(lambda rows: engine(prompt_ids[rows], prompt_mask[rows], seeds[rows], **kwargs),
                             len(seeds))
        return concat_rollouts(parts, pad_id) if parts else engine(prompt_ids, prompt_mask, seeds, **kwargs)

    return run
