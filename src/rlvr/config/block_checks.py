"""Config checks of `model.block_size` (block diffusion), kept beside the loader's own checks."""

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
