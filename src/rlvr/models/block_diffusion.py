"""Block diffusion LM: the masked-diffusion transformer under a block-causal attention mask.

Papers: BD3-LM (Arriola et al. 2025, "Block Diffusion: Interpolating Between Autoregressive and
Diffusion Language Models"), SDAR (2025), Fast-dLLM v2 (Wu et al. 2025). The completion window is
cut into blocks of `block_size` tokens; a query sees every key of its own block (full attention
inside a block) and of every earlier block (causal across blocks). The prompt is block 0: it sees
itself only, so its keys and values never change and the sampler caches them, and each finished
block's keys and values are appended to the cache (`forward_cached`).

Training (BD3-LM's vectorised "x_t ⊕ x_0" forward): the model reads [prompt; noisy window; clean
window] in one pass; a noisy block sees the prompt, its own noisy tokens and the CLEAN copies of
the earlier blocks; a clean block sees the prompt and clean blocks up to itself. The logits of the
noisy half are, for every block at once, those of a separate forward of (prompt, clean earlier
blocks, this noisy block) (tests/dllm/test_block_diffusion.py checks it against that loop).

Why the estimators of `rlvr.models.likelihood` carry over unchanged (`BlockCorruptor` swaps the
forward only): every one scores ℓ_k(M) = log p(y_k | corrupted input). Under the block mask ℓ_k
depends on the mask inside y_k's block only, earlier blocks being clean context. The any-order
identity E_{m~U{1..L}} (L/m) E_{|M|=m} Σ_{k∈M} g(k, M) = E_σ Σ_k g(σ_k, {σ_k, σ_k+1, ...}) holds for
any g, and a uniform order of the window is a uniform order inside each block, so the same ELBO
draws are unbiased for the block ELBO Σ_b ELBO_b(y_b | y_<b) ≤ Σ_b log π_b(y_b | y_<b) = log π(y)
(checked by exact enumeration in the test). `ar_order` stays the exact left-to-right
factorisation, `trace` replays the block sampler's real states (finished blocks clean).

Deviations:
1. Blocks are aligned to the completion window, with the whole prompt one fully attended block;
   SDAR and Fast-dLLM v2 align blocks to absolute positions (the prompt's last partial block is
   decoded together with the first generated tokens). Ours lets left-padded prompts of different
   lengths share one block layout in a batch and one cache.
2. Shifted logits (`shift_logits`, Fast-dLLM v2's token shift): the first token of a block is
   predicted from the last position of the CLEAN previous block in training as in sampling;
   Fast-dLLM v2 does not decode that token by diffusion but greedily from the previous block.
3. No sub-block cache (Fast-dLLM v2's second level), no BD3-LM clipped noise schedule.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from rlvr.errors import ConfigError
from rlvr.model_files import read_json
from rlvr.models.diffusion_lm import (
    DiffusionConfig,
    DiffusionLM,
    _additive_key_mask,
    attention,
    load_diffusion_lm,
    rope_table,
)
from rlvr.models.likelihood import Corruptor, distinct_forward

# Checkpoint formats whose config names a block size: ours (`block_size`) and Fast-dLLM v2 (`bd_size`).
BLOCK_SIZE_KEYS = ("block_size", "bd_size")


@dataclass(frozen=True)
class BlockDiffusionConfig(DiffusionConfig):
    block_size: int = 4  # window tokens per block (full attention inside, causal across)


def block_layout(prefix_len: int, window: int, block_size: int, *, with_clean: bool):
    """(block id (S,), noisy flag (S,)) per column of [prompt; window] or [prompt; noisy; clean].
    The prompt is block 0 and counts as clean; window column j is in block 1 + j // block_size."""
    window_blocks = 1 + torch.arange(window) // block_size
    blocks = torch.cat([torch.zeros(prefix_len, dtype=torch.long), window_blocks])
    noisy = torch.zeros(prefix_len + window, dtype=torch.bool)
    if with_clean:
        noisy[prefix_len:] = True
        blocks = torch.cat([blocks, window_blocks])
        noisy = torch.cat([noisy, torch.zeros(window, dtype=torch.bool)])
    return blocks, noisy


def block_visibility(blocks: torch.Tensor, noisy: torch.Tensor, prefix_len: int) -> torch.Tensor:
    """(S, S) bool, query row sees key column. Prompt keys: everyone. A noisy query: noisy keys of
    its own block and clean keys of earlier blocks. A clean query: clean keys of blocks <= its own."""
    bq, bk = blocks[:, None], blocks[None, :]
    nq, nk = noisy[:, None], noisy[None, :]
    prompt_key = (torch.arange(blocks.numel()) < prefix_len)[None, :]
    from_noisy = torch.where(nk, bk == bq, bk < bq)
    from_clean = ~nk & (bk <= bq)
    return prompt_key | torch.where(nq, from_noisy, from_clean)


def _shift_sources(prefix_len: int, window: int, block_size: int, with_clean: bool) -> torch.Tensor:
    """(prefix_len + window,) column whose raw logit predicts each output column (shift_logits):
    the previous column, except that a block's first token reads the clean previous block's last
    column (the prompt's last for block 1); column 0 duplicates itself as Dream does."""
    n = prefix_len + window
    src = (torch.arange(n) - 1).clamp(min=0)
    if with_clean:
        j = torch.arange(window)
        starts = (j % block_size == 0) & (j > 0)  # first token of blocks 2, 3, ...
        src[prefix_len:][starts] = n + j[starts] - 1  # the clean copy of the column before
    return src


class BlockDiffusionLM(DiffusionLM):
    """A `DiffusionLM` (same parameters and checkpoint keys) under the block-causal mask."""

    config: BlockDiffusionConfig

    def forward(self, input_ids, attention_mask=None, position_ids=None, *, prefix_len: int = 0,
                clean_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (B, prefix_len + W, V) aligned to positions. input_ids (B, prefix_len + W) = prompt
        then window; clean_ids (B, W): the clean window appended for the x_t ⊕ x_0 pass (its logits
        are not returned); without it earlier blocks of input_ids are the context as given."""
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if position_ids is None:
            position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        n, window = input_ids.shape[1], input_ids.shape[1] - prefix_len
        with_clean = clean_ids is not None
        if with_clean:
            input_ids = torch.cat([input_ids, clean_ids], dim=1)
            attention_mask = torch.cat([attention_mask, torch.ones_like(clean_ids)], dim=1)
            position_ids = torch.cat([position_ids, position_ids[:, prefix_len:]], dim=1)
        c = self.config
        blocks, noisy = block_layout(prefix_len, window, c.block_size, with_clean=with_clean)
        visible = block_visibility(blocks, noisy, prefix_len).to(input_ids.device)
        x = self.embed_tokens(input_ids)
        keys = attention_mask.bool()[:, None, :] & visible[None]  # (B, S, S)
        additive = torch.zeros(keys.shape, dtype=x.dtype, device=x.device).masked_fill_(~keys, float("-inf"))[:, None]
        rope = rope_table(position_ids, c.head_dim, c.rope_theta)
        for layer in self.layers:
            x = layer(x, rope, additive)
        raw = self.lm_head(self.norm(x))  # (B, S, V)
        if not c.shift_logits:
            return raw[:, :n]
        return raw[:, _shift_sources(prefix_len, window, c.block_size, with_clean).to(raw.device)]

    def forward_cached(self, input_ids, position_ids, cache: list | None, key_mask: torch.Tensor):
        """(raw logits (B, S, V), [(k, v)] of these S columns per layer): S columns (one block) that see
        the K cached keys and each other wherever key_mask (B, K + S) is 1 (padding is 0). Raw =
        unshifted; a sampler of a shift_logits model shifts them itself."""
        c = self.config
        b, s = input_ids.shape
        x = self.embed_tokens(input_ids)
        rope = rope_table(position_ids, c.head_dim, c.rope_theta)
        additive = _additive_key_mask(key_mask, x.dtype)
        fresh = []
        for i, layer in enumerate(self.layers):
            attn, h = layer.self_attn, layer.input_layernorm(x)
            q, k = attn._rotated(attn.q_proj, h, rope), attn._rotated(attn.k_proj, h, rope)
            v = attn.v_proj(h).view(b, s, attn.kv, c.head_dim).transpose(1, 2)
            fresh.append((k, v))
            if cache is not None:
                k, v = torch.cat([cache[i][0], k], dim=2), torch.cat([cache[i][1], v], dim=2)
            out = attention(q, k, v, additive)  # (B, H, S, D)
            x = x + attn.o_proj(out.transpose(1, 2).reshape(b, s, -1))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return self.lm_head(self.norm(x)), fresh


def as_block_model(model: DiffusionLM, block_size: int) -> BlockDiffusionLM:
    """`model`'s weights under the block mask (a bidirectional checkpoint becomes a block model, as
    SDAR and Fast-dLLM v2 start from pretrained weights)."""
    config = BlockDiffusionConfig(**{**dataclasses.asdict(model.config), "block_size": int(block_size)})
    block = BlockDiffusionLM(config)
    block.load_state_dict(model.state_dict())
    if config.tie_word_embeddings:
        block.lm_head.weight = block.embed_tokens.weight
    return block.train(model.training)


def checkpoint_block_size(path: str | Path) -> int:
    """The block size a checkpoint's config.json names (ours or Fast-dLLM v2), 0 if none; a config.json
    that is not a JSON object, or a block size that is not a whole number >= 0 ("eight", 8.5), is one line."""
    if not (Path(path) / "config.json").is_file():
        return 0
    fix = "fix the file, or name a checkpoint saved by save_pretrained or `rlvr export`"
    raw = read_json(Path(path) / "config.json", "model.path", fix)
    key = next((k for k in BLOCK_SIZE_KEYS if raw.get(k)), None)
    if key is None:
        return 0
    value = raw[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"model.path: {Path(path) / 'config.json'} names {key} {value!r}; a block size is a whole "
                          f"number of tokens (e.g. 8), or 0 for a bidirectional model: fix the file")
    return value


def load_diffusion_or_block_lm(path: str | None, *, seed: int, block_size: int = 0, **size):
    """(model, tokenizer): `load_diffusion_lm`, as a block model when the checkpoint names a block
    size or `block_size` > 0 (a checkpoint's own size wins; a different non-zero `block_size` is a
    ConfigError)."""
    from rlvr.models.causal_lm import resolve_model_path

    own = checkpoint_block_size(resolve_model_path(path)) if path else 0
    if own and block_size and own != block_size:
        raise ConfigError(f"model.block_size: the checkpoint '{path}' was trained with blocks of {own}; "
                          f"set model.block_size={own} or 0 (the checkpoint's)")
    model, tokenizer = load_diffusion_lm(path, seed=seed, **size)
    chosen = own or block_size
    return (as_block_model(model, chosen) if chosen else model), tokenizer


@dataclass
class BlockCorruptor(Corruptor):
    """`Corruptor` whose denoiser is the x_t ⊕ x_0 forward of a `BlockDiffusionLM`: each block of
    the corrupted window is scored with the clean earlier blocks as context."""

    def logits(self, ids, attention, positions) -> torch.Tensor:
        tp, tc = self.prompt_ids.shape[1], self.completion_ids.shape[1]
        clean = self.completion_ids
        # The clean window rides in the key of distinct_forward: rows dedupe only if it agrees too.
        wide = (torch.cat([ids, clean], 1), torch.cat([attention, torch.ones_like(clean)], 1),
                torch.cat([positions, positions[:, tp:]], 1))

        def model(i, a, p):
            return self.model(i[:, :tp + tc], a[:, :tp + tc], p[:, :tp + tc], prefix_len=tp, clean_ids=i[:, tp + tc:])

        return distinct_forward(model, *wide)[:, tp:]


def block_diffusion_loss(model, prompt_ids, prompt_mask, window_ids, *, mask_id: int, eps: float = 1e-3,
                         generator: torch.Generator | None = None) -> torch.Tensor:
    """Scalar block ELBO loss (BD3-LM): per (row, block) t = (1 − ε)u + ε, each window token of that
    block masked w.p. t, loss = Σ_masked CE / t over the window (all blocks in one x_t ⊕ x_0
    forward), divided by the window length, averaged over rows. Choices as `masked_diffusion_loss`."""
    batch, length = window_ids.shape
    block = model.config.block_size
    num_blocks = -(-length // block)
    t = (1 - eps) * torch.rand(batch, num_blocks, generator=generator) + eps  # (B, K)
    t = t.repeat_interleave(block, dim=1)[:, :length]  # (B, L): each token's block's t
    masked = torch.rand(batch, length, generator=generator) < t
    noisy = torch.where(masked, torch.full_like(window_ids, mask_id), window_ids)
    ids = torch.cat([prompt_ids, noisy], dim=1)
    attention_mask = torch.cat([prompt_mask, torch.ones_like(window_ids)], dim=1)
    positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    tp = prompt_ids.shape[1]
    logits = model(ids, attention_mask, positions, prefix_len=tp, clean_ids=window_ids)[:, tp:].float()
    ce = F.cross_entropy(logits.transpose(1, 2), window_ids, reduction="none")  # (B, L)
    return ((ce * masked / t).sum(-1) / length).mean()


__all__ = ["BlockCorruptor", "BlockDiffusionConfig", "BlockDiffusionLM", "as_block_model", "block_diffusion_loss",
           "block_layout", "block_visibility", "checkpoint_block_size", "load_diffusion_or_block_lm"]
