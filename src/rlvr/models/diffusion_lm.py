"""Masked-diffusion LM: a bidirectional transformer with a reserved mask token.

Architecture (LLaDA / Dream family): token embedding, `num_layers`
pre-norm blocks of [RMSNorm -> multi-head attention with RoPE, no causal mask -> residual,
RMSNorm -> SwiGLU MLP -> residual], final RMSNorm, linear head. No time input (RADD: the
optimal absorbing-diffusion denoiser is time-independent). The mask token is an ordinary
vocabulary id that is never a target; samplers exclude it.

`forward(input_ids, attention_mask, position_ids)` returns logits ALIGNED TO POSITIONS: the
logit at position i is the prediction for token i. Dream-style models (AR heritage) compute the
prediction for token i at position i-1; with `shift_logits=True` the model shifts them back
(first logit duplicated, as Dream does), so no caller ever branches on the convention.

Formats:
- our own directory (`save_pretrained` / `from_pretrained`): `config.json` with
  `"model_type": "rlvr_diffusion"` and the `DiffusionConfig` fields, plus `model.safetensors`
  (plus the tokenizer files when the trainer saves one).
- `load_diffusion_lm(path)` also reads LLaDA (`"model_type": "llada"`: keys
  `model.transformer.{wte, blocks.i.{attn_norm, q_proj, k_proj, v_proj, attn_out, ff_norm,
  ff_proj (gate), up_proj, ff_out (down)}, ln_f, ff_out}`) and Dream (`"model_type": "Dream"`,
  Qwen2 keys `model.{embed_tokens, layers.i.{input_layernorm, self_attn.{q,k,v,o}_proj,
  post_attention_layernorm, mlp.{gate,up,down}_proj}, norm}`, `lm_head`, q/k/v biases, shifted
  logits) checkpoints on disk, single-file or sharded safetensors; Fast-dLLM v2 (`"model_type":
  "Fast_dLLM_Qwen"`, Dream's keys; its `bd_size` is read by `rlvr.models.block_diffusion`).

Speed (same math, float rounding apart; tests/dllm/test_forward_fast.py checks it against the plain
formulas): RoPE is one complex multiply on q/k rows reordered at run time (`pair_adjacent`), its
table and the key mask are built once per forward, short sequences use explicit attention, and
without autograd (sampling) the MLP and residual adds work in place. Parameters and checkpoint
keys are unchanged.

Deviations: no dropout, no KV cache (a full-attention dLLM has none exactly), no LLaDA
`input_emb_norm` / `scale_logits` / biases outside q/k/v (the loader refuses such configs).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

MODEL_TYPE = "rlvr_diffusion"


@dataclass(frozen=True)
class DiffusionConfig:
    vocab_size: int  # V, including the mask token
    mask_token_id: int  # reserved id that marks a corrupted position; never a target
    eos_token_id: int  # end of text; the fixed generation window is padded with it
    pad_token_id: int  # left padding of prompts (distinct from EOS; attention-masked)
    hidden_size: int = 128  # model width
    num_layers: int = 4  # transformer blocks
    num_heads: int = 4  # attention heads
    num_kv_heads: int | None = None  # grouped-query heads, None = num_heads
    intermediate_size: int = 512  # SwiGLU width
    max_seq_len: int = 128  # longest prompt + window (informational; RoPE has no table)
    rope_theta: float = 10_000.0  # RoPE base
    rms_norm_eps: float = 1e-5  # RMSNorm epsilon
    tie_word_embeddings: bool = True  # head shares the embedding matrix
    qkv_bias: bool = False  # biases on q/k/v (Dream/Qwen2: True)
    shift_logits: bool = False  # Dream convention: raw logit i predicts token i+1

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        if x.dtype == torch.float32:  # one fused kernel, same formula x * rsqrt(mean(x^2) + eps) * w
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        var = x.float().pow(2).mean(-1, keepdim=True)  # low precision: normalise in float32 first
        return (x.float() * torch.rsqrt(var + self.eps)).to(x.dtype) * self.weight


def rope_table(positions: torch.Tensor, head_dim: int, theta: float) -> torch.Tensor:
    """(B, S, 1, D/2) complex e^{i pos theta^(-2j/D)} for `apply_rope`. Computed once per forward:
    every layer, q and k share the positions."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device) / head_dim)
    angles = positions[..., None].float() * inv_freq  # (B, S, D/2)
    return torch.polar(torch.ones_like(angles), angles)[:, :, None]


def pair_adjacent(rows: torch.Tensor, head_dim: int) -> torch.Tensor:
    """A q or k projection's weight (or bias) with each head's rotate-half RoPE pair (j, j + D/2)
    moved to rows (2j, 2j + 1). The same order for q and k leaves every q.k product unchanged and
    turns RoPE into one complex multiply (`apply_rope`). A copy whose backward is a copy too."""
    return rows.unflatten(0, (-1, 2, head_dim // 2)).transpose(1, 2).flatten(0, 2)


def apply_rope(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE (Llama/LLaDA/Qwen), x1' = x1 cos - x2 sin, x2' = x2 cos + x1 sin, on x
    (B, S, heads, D) whose pairs are adjacent (`pair_adjacent`): (x1 + i x2) e^{i angle}."""
    pairs = torch.view_as_complex(x.float().unflatten(-1, (-1, 2)))
    return torch.view_as_real(pairs * table).flatten(-2).to(x.dtype)


# Up to this many keys, attention as two batched matmuls beats the fused SDPA kernel on CPU
# (measured 1.6x faster at 27 keys, even at 48; SDPA 1.1x at 96 and 3x at 128).
_EXPLICIT_ATTENTION_MAX_KEYS = 48


def attention(q, k, v, additive_mask):
    """softmax(q k^T / sqrt(D) + mask) v. q (B, H, S, D); k, v (B, KV, S, D) with H a multiple of
    KV (query head h reads kv head h // (H / KV)); k, v may have more rows than q (a cache);
    additive_mask (B, 1, 1, S) or per query (B, 1, Sq, S) of 0 / -inf, or None."""
    b, h, s, d = q.shape
    kv = k.shape[1]
    if s > _EXPLICIT_ATTENTION_MAX_KEYS or (additive_mask is not None and additive_mask.shape[-2] > 1 and kv != h):
        # long rows, or a per-query mask (block models) with grouped heads, which the fold below cannot broadcast
        return F.scaled_dot_product_attention(q, k, v, attn_mask=additive_mask, enable_gqa=kv != h)
    # Query heads of one kv group are adjacent: fold them into the query rows, so k/v are not repeated.
    scores = q.reshape(b, kv, (h // kv) * s, d) @ k.transpose(-1, -2)  # (B, KV, G*S, S)
    # In place (autograd-safe: matmul keeps its inputs, not its output): two fewer allocations.
    scores.mul_(d ** -0.5)
    if additive_mask is not None:
        scores.add_(additive_mask)
    return (scores.softmax(-1) @ v).view(b, h, s, d)


class Attention(nn.Module):
    def __init__(self, c: DiffusionConfig):
        super().__init__()
        kv = c.num_kv_heads or c.num_heads
        self.c, self.kv = c, kv
        self.q_proj = nn.Linear(c.hidden_size, c.num_heads * c.head_dim, bias=c.qkv_bias)
        self.k_proj = nn.Linear(c.hidden_size, kv * c.head_dim, bias=c.qkv_bias)
        self.v_proj = nn.Linear(c.hidden_size, kv * c.head_dim, bias=c.qkv_bias)
        self.o_proj = nn.Linear(c.num_heads * c.head_dim, c.hidden_size, bias=False)

    def _rotated(self, proj: nn.Linear, x, rope) -> torch.Tensor:
        """RoPE'd q or k heads (B, heads, S, D), dims in pair-adjacent order. Separate q and k matmuls:
        a fused q|k|v one measured no faster forward and slower backward (slice/cat gradients)."""
        d = self.c.head_dim
        bias = None if proj.bias is None else pair_adjacent(proj.bias, d)
        y = F.linear(x, pair_adjacent(proj.weight, d), bias)
        return apply_rope(y.unflatten(-1, (-1, d)), rope).transpose(1, 2)

    def forward(self, x, rope, additive_mask):
        b, s, _ = x.shape
        q, k = self._rotated(self.q_proj, x, rope), self._rotated(self.k_proj, x, rope)
        v = self.v_proj(x).view(b, s, self.kv, self.c.head_dim).transpose(1, 2)
        # Bidirectional: every query sees every non-padding key.
        out = attention(q, k, v, additive_mask)  # (B, H, S, D)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    def __init__(self, c: DiffusionConfig):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x):
        # Separate gate and up matmuls: a fused gate|up one measured slower (forward and backward).
        gate, up = self.gate_proj(x), self.up_proj(x)
        if torch.is_grad_enabled():  # autograd needs silu's input
            return self.down_proj(F.silu(gate) * up)
        # Sampling: reuse the gate buffer (two fewer (B, S, I) allocations; measured ~10% of this MLP).
        return self.down_proj(F.silu(gate, inplace=True).mul_(up))


class Block(nn.Module):
    def __init__(self, c: DiffusionConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = MLP(c)

    def forward(self, x, rope, additive_mask):
        # Without autograd (sampling) the residual adds go in place: fresh (B, S, hidden) buffers
        # cost page faults, measured ~8% of a forward. With autograd the norms keep x for backward.
        add = torch.add if torch.is_grad_enabled() else torch.Tensor.add_
        x = add(x, self.self_attn(self.input_layernorm(x), rope, additive_mask))
        return add(x, self.mlp(self.post_attention_layernorm(x)))


class DiffusionLM(nn.Module):
    """Bidirectional mask predictor p_θ(x_0^i | z) for every position i. See the module doc."""

    def __init__(self, config: DiffusionConfig):
        super().__init__()
        c = self.config = config
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(Block(c) for _ in range(c.num_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        self.apply(self._init)
        if c.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    @staticmethod
    def _init(module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)

    @property
    def mask_token_id(self) -> int:
        return self.config.mask_token_id

    def forward(self, input_ids, attention_mask=None, position_ids=None) -> torch.Tensor:
        """Logits (B, S, V) aligned to positions. input_ids (B, S); attention_mask (B, S) 1 = real
        token (keys with 0 are invisible); position_ids (B, S), default from the attention mask."""
        logits = self.lm_head(self.norm(self.hidden_states(input_ids, attention_mask, position_ids)))
        if self.config.shift_logits:  # raw logit i predicts token i+1 -> align (Dream duplicates the first)
            logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
        return logits

    def hidden_states(self, input_ids, attention_mask=None, position_ids=None) -> torch.Tensor:
        """(B, S, hidden) after the last block, before the final norm; arguments as in `forward`."""
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if position_ids is None:
            position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        c = self.config
        x = self.embed_tokens(input_ids)
        rope = rope_table(position_ids, c.head_dim, c.rope_theta)
        additive_mask = _additive_key_mask(attention_mask, x.dtype)
        for layer in self.layers:
            x = layer(x, rope, additive_mask)
        return x

    # ------------------------------------------------------------------ our directory format

    def save_pretrained(self, directory: str | Path) -> None:
        from safetensors.torch import save_file

        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        config = {"model_type": MODEL_TYPE, **dataclasses.asdict(self.config)}
        (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        state = {k: v.detach().contiguous() for k, v in self.state_dict().items()}
        if self.config.tie_word_embeddings:
            state.pop("lm_head.weight")
        save_file(state, str(out / "model.safetensors"))

    @classmethod
    def from_pretrained(cls, directory: str | Path) -> DiffusionLM:
        return load_diffusion_model(directory)


def _additive_key_mask(attention_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
    """(B, 1, 1, S): 0 on real keys, -inf on padding; None when nothing is padded (adding zeros
    would change nothing). Built once per forward instead of SDPA converting a bool mask per layer."""
    visible = attention_mask.bool()
    if bool(visible.all()):
        return None
    mask = torch.zeros(visible.shape, dtype=dtype, device=visible.device).masked_fill_(~visible, float("-inf"))
    return mask[:, None, None, :]


def tiny_diffusion_lm(config: DiffusionConfig, *, seed: int) -> DiffusionLM:
    """A model built from a config with a deterministic init (no download)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return DiffusionLM(config)


# ---------------------------------------------------------------------------- loading


def _read_weights(directory: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    index = directory / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        state = {}
        for name in files:
            state.update(load_file(str(directory / name)))
        return state
    single = directory / "model.safetensors"
    if not single.is_file():
        raise FileNotFoundError(f"no model.safetensors (or index) in {directory}")
    return load_file(str(single))


def _llada_config(raw: dict) -> DiffusionConfig:
    unsupported = {"input_emb_norm": True, "scale_logits": True, "include_bias": True, "alibi": True}
    for key, bad in unsupported.items():
        if raw.get(key) == bad:
            raise ValueError(f"LLaDA config: {key}={bad} is not supported by rlvr's DiffusionLM")
    if raw.get("block_type", "llama") != "llama" or raw.get("layer_norm_type", "rms") != "rms":
        raise ValueError("LLaDA config: only block_type=llama with layer_norm_type=rms is supported")
    n_heads = raw["n_heads"]
    hidden = raw.get("mlp_hidden_size") or raw.get("mlp_ratio", 4) * raw["d_model"]
    return DiffusionConfig(
        vocab_size=raw.get("embedding_size") or raw["vocab_size"], mask_token_id=raw["mask_token_id"],
        eos_token_id=raw["eos_token_id"], pad_token_id=raw.get("pad_token_id", raw["eos_token_id"]),
        hidden_size=raw["d_model"], num_layers=raw["n_layers"], num_heads=n_heads,
        num_kv_heads=raw.get("n_kv_heads") or n_heads, intermediate_size=hidden,
        max_seq_len=raw.get("max_sequence_length", 4096), rope_theta=raw.get("rope_theta", 10_000.0),
        rms_norm_eps=raw.get("rms_norm_eps", 1e-5), tie_word_embeddings=bool(raw.get("weight_tying", False)),
        qkv_bias=bool(raw.get("include_qkv_bias", False)), shift_logits=False)


LLADA_BLOCK_KEYS = {  # LLaDA name -> ours, inside blocks.i / layers.i
    "attn_norm.weight": "input_layernorm.weight", "ff_norm.weight": "post_attention_layernorm.weight",
    "q_proj": "self_attn.q_proj", "k_proj": "self_attn.k_proj", "v_proj": "self_attn.v_proj",
    "attn_out": "self_attn.o_proj", "ff_proj": "mlp.gate_proj", "up_proj": "mlp.up_proj", "ff_out": "mlp.down_proj",
}


def llada_key(ours: str) -> str:
    """Our parameter name -> the LLaDA checkpoint key (used by the loader and its test)."""
    top = {"embed_tokens.weight": "model.transformer.wte.weight", "norm.weight": "model.transformer.ln_f.weight",
           "lm_head.weight": "model.transformer.ff_out.weight"}
    if ours in top:
        return top[ours]
    _, index, rest = ours.split(".", 2)
    for theirs, mine in LLADA_BLOCK_KEYS.items():
        if rest.startswith(mine):
            return f"model.transformer.blocks.{index}.{theirs}{rest[len(mine):]}"
    raise KeyError(ours)


def _dream_config(raw: dict) -> DiffusionConfig:
    heads = raw["num_attention_heads"]
    return DiffusionConfig(
        vocab_size=raw["vocab_size"], mask_token_id=raw["mask_token_id"], eos_token_id=raw["eos_token_id"],
        pad_token_id=raw.get("pad_token_id", raw["eos_token_id"]), hidden_size=raw["hidden_size"],
        num_layers=raw["num_hidden_layers"], num_heads=heads, num_kv_heads=raw.get("num_key_value_heads") or heads,
        intermediate_size=raw["intermediate_size"], max_seq_len=raw.get("max_position_embeddings", 2048),
        rope_theta=raw.get("rope_theta", 10_000.0), rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)), qkv_bias=True, shift_logits=True)


FAST_DLLM_MASK_ID = 151665  # Fast-dLLM v2's mask id: the released generate()'s default (its config has none)


def _fast_dllm_config(raw: dict) -> DiffusionConfig:
    """Fast-dLLM v2 (`"model_type": "Fast_dLLM_Qwen"`): Qwen2 with q/k/v biases and token shift, as
    Dream; its `bd_size` makes the model a block model (`rlvr.models.block_diffusion`)."""
    if raw.get("use_sliding_window"):
        raise ValueError("Fast-dLLM config: use_sliding_window=true is not supported by rlvr's DiffusionLM")
    return _dream_config({**raw, "mask_token_id": raw.get("mask_token_id", FAST_DLLM_MASK_ID)})


def dream_key(ours: str) -> str:
    return "lm_head.weight" if ours == "lm_head.weight" else f"model.{ours}"


def load_diffusion_model(directory: str | Path) -> DiffusionLM:
    """Our format, LLaDA, Dream or Fast-dLLM v2, from `config.json` + safetensors in `directory`."""
    directory = Path(directory)
    raw = json.loads((directory / "config.json").read_text())
    kind = str(raw.get("model_type", "")).lower()
    if kind == MODEL_TYPE:
        fields = {f.name for f in dataclasses.fields(DiffusionConfig)}
        config, to_theirs = DiffusionConfig(**{k: v for k, v in raw.items() if k in fields}), (lambda k: k)
    elif kind == "llada":
        config, to_theirs = _llada_config(raw), llada_key
    elif kind == "dream":
        config, to_theirs = _dream_config(raw), dream_key
    elif kind == "fast_dllm_qwen":  # same keys as Dream (Qwen2)
        config, to_theirs = _fast_dllm_config(raw), dream_key
    else:
        raise ValueError(f"{directory}/config.json: model_type {raw.get('model_type')!r} is not a masked-diffusion "
                         f"LM rlvr can read (valid: {MODEL_TYPE}, llada, Dream, Fast_dLLM_Qwen)")
    weights = _read_weights(directory)
    model = DiffusionLM(config)
    state = {}
    for name in model.state_dict():
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        key = to_theirs(name)
        if key not in weights:
            raise KeyError(f"{directory}: checkpoint has no {key!r} (for {name})")
        state[name] = weights[key].float()
    model.load_state_dict(state, strict=not config.tie_word_embeddings)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    return model


def diffusion_tokenizer():
    """The character tokenizer plus a `<mask>` special token (id = last)."""
    from rlvr.models.tokenizer import char_tokenizer

    tokenizer = char_tokenizer()
    tokenizer.add_special_tokens({"mask_token": "<mask>"})
    return tokenizer


def _quiet_auto_tokenizer(auto_tokenizer, path):
    """`AutoTokenizer.from_pretrained` without its warning that our `config.json` (model_type
    `rlvr_diffusion`, not a transformers architecture) is not the model it expected: only the
    tokenizer files are read, so the warning would be noise on every dLLM run."""
    from transformers.utils import logging as hf_logging

    previous = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        return auto_tokenizer.from_pretrained(path)
    finally:
        hf_logging.set_verbosity(previous)


def load_diffusion_lm(path: str | None, *, seed: int, hidden_size: int = 128, num_layers: int = 4,
                      num_heads: int = 4, intermediate_size: int = 512, max_seq_len: int = 128,
                      shift_logits: bool = False):
    """(model, tokenizer): a local directory (ours, LLaDA or Dream), or a fresh tiny model."""
    if not path:
        tokenizer = diffusion_tokenizer()
        config = DiffusionConfig(
            vocab_size=len(tokenizer), mask_token_id=tokenizer.mask_token_id, eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id, hidden_size=hidden_size, num_layers=num_layers,
            num_heads=num_heads, intermediate_size=intermediate_size, max_seq_len=max_seq_len,
            shift_logits=shift_logits)
        return tiny_diffusion_lm(config, seed=seed), tokenizer
    from safetensors import SafetensorError
    from transformers import AutoTokenizer

    from rlvr.errors import ConfigError
    from rlvr.models.causal_lm import resolve_model_path

    shown, path = path, resolve_model_path(path)  # `rlvr:NAME` = a checkpoint shipped in the package
    try:
        model = load_diffusion_model(path)
        tokenizer = _quiet_auto_tokenizer(AutoTokenizer, path)
    except (OSError, ValueError, KeyError, TypeError, SafetensorError) as err:  # a causal checkpoint: ValueError
        reason = (str(err).strip().splitlines() or [""])[0][:200]
        raise ConfigError(f"model.path: '{shown}' is not a loadable masked-diffusion LM ({type(err).__name__}: "
                          f"{reason}); for a causal checkpoint set model.kind=causal") from None
    tokenizer.padding_side = "left"
    if tokenizer.mask_token_id is None or tokenizer.mask_token_id != model.mask_token_id:
        tokenizer.add_special_tokens({"mask_token": tokenizer.convert_ids_to_tokens(model.mask_token_id)})
    return model, tokenizer


def num_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


__all__ = ["DiffusionConfig", "DiffusionLM", "diffusion_tokenizer", "dream_key", "llada_key",
           "load_diffusion_lm", "load_diffusion_model", "tiny_diffusion_lm", "num_parameters"]
