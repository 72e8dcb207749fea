"""Config checks of `model.block_size` (block diffusion) and of the diffusion sampler's step schedule, kept
beside the loader's own checks."""

from __future__ import annotations

from rlvr.config.schema import Config


def block_checks(config: Config) -> list[tuple[bool, str, str]]:
    """(ok, field, fix) for a block diffusion model: a masked-diffusion model whose window is whole
    blocks, sampled in blocks of its own size."""
    m, r = config.model, config.rollout
    if not m.block_size:
        return []
    return [
        (m.kind == "diffusion", "model.block_size", "block diffusion needs model.kind=diffusion; or set 0"),
        (r.max_new_tokens % m.block_size == 0, "model.block_size",
         f"must divide rollout.max_new_tokens ({r.max_new_tokens}): the window is whole blocks"),
        (r.block_length in (0, m.block_size), "rollout.block_length",
         f"a block model samples blocks of model.block_size ({m.block_size}); set 0 or {m.block_size}"),
    ]


def schedule_checks(config: Config) -> list[tuple[bool, str, str]]:
    """(ok, field, fix) for CJ-GRPO's decoding scheduler (`rollout.step_schedule`, `rollout.eoser_gamma`) and its
    per-step aggregation, which read the diffusion sampler's fixed per-step commits."""
    m, r, a = config.model, config.rollout, config.algo
    ascending, eoser = r.step_schedule == "ascending", r.eoser_gamma is not None
    diffusion = m.kind == "diffusion"
    block = r.block_length or m.block_size or r.max_new_tokens
    blocks = max(r.max_new_tokens // block, 1)
    per_block = (r.diffusion_steps or r.max_new_tokens) // blocks
    return [
        (diffusion or not (ascending or eoser), "rollout.step_schedule",
         "ascending steps and rollout.eoser_gamma schedule the diffusion sampler; set model.kind=diffusion"),
        (r.threshold is None or not (ascending or eoser), "rollout.threshold",
         "decodes by confidence, without a step schedule; set null for rollout.step_schedule=ascending or eoser_gamma"),
        (not eoser or r.remasking == "low_confidence", "rollout.eoser_gamma",
         f"scales a probability: set rollout.remasking=low_confidence (not {r.remasking!r}) or eoser_gamma=null"),
        (not ascending or block >= 2 ** per_block, "rollout.diffusion_steps",
         f"ascending steps double: a block of {block} tokens fits at most {block.bit_length() - 1} steps, "
         f"not {per_block}"),
        (a.aggregation != "step_mean" or diffusion, "algo.aggregation",
         "step_mean averages over the diffusion sampler's steps; set model.kind=diffusion or use seq_mean_token_mean"),
    ]
