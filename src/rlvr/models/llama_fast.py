"""A minimal Llama forward that reads the weights of a `transformers` Llama/Qwen2 model.

At rlvr's home scale (a 1M-parameter model on two CPU cores) a step costs more in framework
overhead and redundant work than in FLOPs. This module removes three of those costs; it is the
same math as `LlamaForCausalLM.forward` (tests/perf check samples, log-probs and gradients
against it), only arranged differently:

1. **Shared prompt prefix.** The G completions of a group share their prompt, so the prompt's
   hidden states and keys/values are computed once per distinct prompt and indexed into each
   row (prefill in the sampler, and the training forward: gradients from all G rows add up in
   the one copy). Rows are matched by value (`torch.unique`), so any row order works.
2. **Static KV cache.** The sampler writes keys/values into a preallocated (b, kv_heads, S, d)
   buffer instead of concatenating a new cache every token, and drops finished rows from the
   batch (`Decoder.keep`) once enough of them have finished to pay for the copy.
3. **Fewer, larger ops.** q/k/v and gate/up projections are fused into one matmul each, RoPE
   is applied to q and k in one call, RMSNorm is `F.rms_norm`.

Anything this module does not model (non-default RoPE, sliding windows, MLP biases, dropout in
training, PEFT wrappers, other architectures) makes `supports()` return False, and callers use
the plain `transformers` forward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

_ARCHITECTURES = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2"}


def supports(model) -> bool:
    """True when `model` is a plain Llama/Qwen2 causal LM this module computes exactly."""
    cfg = getattr(model, "config", None)
    if _ARCHITECTURES.get(type(model).__name__) != getattr(cfg, "model_type", None):
        return False
    rope = getattr(cfg, "rope_parameters", None) or {}
    return (rope.get("rope_type", "default") == "default" and "rope_theta" in rope
            and getattr(cfg, "hidden_act", "silu") == "silu"
            and not getattr(cfg, "mlp_bias", False)
            and not getattr(cfg, "use_sliding_window", False)
            and getattr(cfg, "pretraining_tp", 1) == 1
            and not (model.training and getattr(cfg, "attention_dropout", 0.0)))


@dataclass
class _Layer:
    ln1: torch.Tensor
    wqkv: torch.Tensor
    bqkv: torch.Tensor | None
    wo: torch.Tensor
    bo: torch.Tensor | None
    ln2: torch.Tensor
    wgu: torch.Tensor
    wd: torch.Tensor


def _cat_bias(*linears):
    biases = [lin.bias for lin in linears]
    if all(b is None for b in biases):
        return None
    return torch.cat([b if b is not None else lin.weight.new_zeros(lin.out_features)
                      for b, lin in zip(biases, linears)])


class LlamaWeights:
    """The model's parameters, fused where that saves ops. Differentiable: the fused tensors are
    `torch.cat`s of the parameters, so gradients land on the model's own `.grad`s."""

    def __init__(self, model):
        cfg = model.config
        self.heads = cfg.num_attention_heads
        self.kv_heads = getattr(cfg, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
        self.hidden = cfg.hidden_size
        self.eps = cfg.rms_norm_eps
        theta = cfg.rope_parameters["rope_theta"]
        # Same expression as transformers' compute_default_rope_parameters.
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.float) / self.head_dim))
        base = model.model
        self.embed = base.embed_tokens.weight
        self.norm = base.norm.weight
        self.lm_head = model.lm_head.weight
        self.lm_bias = getattr(model.lm_head, "bias", None)
        self.layers = []
        for layer in base.layers:
            a, m = layer.self_attn, layer.mlp
            self.layers.append(_Layer(
                ln1=layer.input_layernorm.weight,
                wqkv=torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]),
                bqkv=_cat_bias(a.q_proj, a.k_proj, a.v_proj),
                wo=a.o_proj.weight, bo=a.o_proj.bias,
                ln2=layer.post_attention_layernorm.weight,
                wgu=torch.cat([m.gate_proj.weight, m.up_proj.weight]),
                wd=m.down_proj.weight,
            ))

    # -- pieces ---------------------------------------------------------------------------------
    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin (N, T, 1, d) for integer positions (N, T)."""
        freqs = positions[..., None].float() * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)[:, :, None, :]
        return emb.cos(), emb.sin()

    def qkv(self, layer: _Layer, x, cos, sin):
        """x (N, T, H) -> q (N, h, T, d), k and v (N, kv, T, d), RoPE applied."""
        n, t, _ = x.shape
        h, kv, d = self.heads, self.kv_heads, self.head_dim
        fused = F.linear(F.rms_norm(x, (self.hidden,), layer.ln1, self.eps), layer.wqkv, layer.bqkv)
        fused = fused.view(n, t, h + 2 * kv, d)
        qk = fused[:, :, :h + kv]
        rotated = torch.cat((-qk[..., d // 2:], qk[..., :d // 2]), dim=-1)
        qk = qk * cos + rotated * sin
        return qk[:, :, :h].transpose(1, 2), qk[:, :, h:].transpose(1, 2), fused[:, :, h + kv:].transpose(1, 2)

    def attend(self, q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.kv_heads != self.heads)

    def finish(self, layer: _Layer, x, attn):
        """Residual + output projection, then the SwiGLU MLP block. attn (N, h, T, d)."""
        n, _, t, _ = attn.shape
        x = x + F.linear(attn.transpose(1, 2).reshape(n, t, -1), layer.wo, layer.bo)
        gate, up = F.linear(F.rms_norm(x, (self.hidden,), layer.ln2, self.eps), layer.wgu).chunk(2, dim=-1)
        return x + F.linear(F.silu(gate) * up, layer.wd)

    def logits(self, x):
        return F.linear(F.rms_norm(x, (self.hidden,), self.norm, self.eps), self.lm_head, self.lm_bias)


def unique_prompts(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor):
    """(distinct prompt ids (U, Tp), their masks (U, Tp), row -> distinct index (B,))."""
    keys = torch.cat([prompt_ids, prompt_mask.to(prompt_ids.dtype)], dim=1)
    distinct, inverse = torch.unique(keys, dim=0, return_inverse=True)
    width = prompt_ids.shape[1]
    return distinct[:, :width], distinct[:, width:].to(prompt_mask.dtype), inverse


def _prompt_masks(prompt_mask: torch.Tensor) -> torch.Tensor:
    """(U, 1, Tp, Tp) bool: causal over real prompt tokens; a padding query sees only itself
    (its output is never read, and a fully masked row would give NaN)."""
    tp = prompt_mask.shape[1]
    causal = torch.ones(tp, tp, dtype=torch.bool).tril()
    eye = torch.eye(tp, dtype=torch.bool)
    return ((causal & prompt_mask.bool()[:, None, :]) | eye)[:, None]


def completion_hidden(w: LlamaWeights, prompt_ids, prompt_mask, completion_ids) -> torch.Tensor:
    """Hidden states (B, Tc, H), before the final norm, at the positions that predict each
    completion token: the last prompt position, then completion positions 0..Tc-2.

    Same as the HF forward over cat([prompt, completion]) with attention cat([prompt_mask, 1])
    and positions cumsum-1, but each distinct prompt is run once (DESIGN §2's PolicyModel).
    """
    ids_u, mask_u, row = unique_prompts(prompt_ids, prompt_mask)
    b, tc = completion_ids.shape
    tp = ids_u.shape[1]
    pos_p = (mask_u.cumsum(-1) - 1).clamp(min=0)                          # (U, Tp)
    pos_c = mask_u.sum(-1)[row][:, None] + torch.arange(tc)                # (B, Tc)
    cos_p, sin_p = w.rope(pos_p)
    cos_c, sin_c = w.rope(pos_c)
    mask_p = _prompt_masks(mask_u)                                          # (U, 1, Tp, Tp)
    causal = torch.ones(tc, tc, dtype=torch.bool).tril()
    mask_c = torch.cat([mask_u.bool()[row][:, None, None, :].expand(b, 1, tc, tp),
                        causal.expand(b, 1, tc, tc)], dim=-1)               # (B, 1, Tc, Tp+Tc)
    xp = w.embed[ids_u]                                                     # (U, Tp, H)
    xc = w.embed[completion_ids]                                            # (B, Tc, H)
    for layer in w.layers:
        qp, kp, vp = w.qkv(layer, xp, cos_p, sin_p)
        qc, kc, vc = w.qkv(layer, xc, cos_c, sin_c)
        keys = torch.cat([kp[row], kc], dim=2)
        values = torch.cat([vp[row], vc], dim=2)
        xc = w.finish(layer, xc, w.attend(qc, keys, values, mask_c))
        xp = w.finish(layer, xp, w.attend(qp, kp, vp, mask_p))
    return torch.cat([xp[row, -1:], xc[:, :-1]], dim=1)


class Decoder:
    """Prefill once per distinct prompt, then one token per live row per `step`, into a static
    KV cache of width Tp + max_new_tokens. Rows are slots; `keep` drops finished slots."""

    def __init__(self, model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, max_new_tokens: int):
        w = self.w = LlamaWeights(model)
        ids_u, mask_u, row = unique_prompts(prompt_ids, prompt_mask)
        b, tp = prompt_ids.shape
        cos, sin = w.rope((mask_u.cumsum(-1) - 1).clamp(min=0))
        attn_mask = _prompt_masks(mask_u)
        x = w.embed[ids_u]
        self.k, self.v = [], []
        for layer in w.layers:
            q, k, v = w.qkv(layer, x, cos, sin)
            x = w.finish(layer, x, w.attend(q, k, v, attn_mask))
            k_cache = k.new_empty(b, w.kv_heads, tp + max_new_tokens, w.head_dim)
            v_cache = torch.empty_like(k_cache)
            k_cache[:, :, :tp] = k[row]
            v_cache[:, :, :tp] = v[row]
            self.k.append(k_cache)
            self.v.append(v_cache)
        self.key_mask = torch.ones(b, tp + max_new_tokens, dtype=torch.bool)
        self.key_mask[:, :tp] = mask_u.bool()[row]
        self.width = tp
        self.pos = mask_u.sum(-1)[row]                   # (b,) position of the next token
        self.logits = w.logits(x[:, -1])[row]            # (b, V) next-token logits

    def keep(self, slots: torch.Tensor) -> None:
        """Keep only `slots` (indices into the current rows), copying the filled cache columns."""
        filled = self.width
        for cache in (self.k, self.v):
            for i, old in enumerate(cache):
                new = old.new_empty((len(slots),) + old.shape[1:])
                new[:, :, :filled] = old[slots, :, :filled]
                cache[i] = new
        self.key_mask = self.key_mask[slots]
        self.pos = self.pos[slots]

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed one token per row (b,); returns next-token logits (b, V)."""
        w, col = self.w, self.width
        x = w.embed[tokens][:, None]                     # (b, 1, H)
        cos, sin = w.rope(self.pos[:, None])
        mask = self.key_mask[:, None, None, :col + 1]
        for layer, k_cache, v_cache in zip(w.layers, self.k, self.v):
            q, k, v = w.qkv(layer, x, cos, sin)
            k_cache[:, :, col] = k[:, :, 0]
            v_cache[:, :, col] = v[:, :, 0]
            x = w.finish(layer, x, w.attend(q, k_cache[:, :, :col + 1], v_cache[:, :, :col + 1], mask))
        self.width += 1
        self.pos = self.pos + 1
        return w.logits(x[:, 0])
