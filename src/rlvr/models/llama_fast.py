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
3. **No padding through the weights.** In the training forward the completion tokens are packed
   (only positions that predict a scored token are computed: given `lengths`, a row of length n
   feeds n-1 tokens); they are scattered into a (B, T) grid only for attention.
4. **Fewer, larger ops.** q/k/v and gate/up projections are fused into one matmul each; RoPE is
   one complex multiply on q and k together (the q/k weight rows are permuted per head so each
   rotated pair (i, i+d/2) is adjacent — dot products q·k are unchanged); RMSNorm is
   `F.rms_norm`; decode attention is two batched matmuls on the static cache.

`decode_step` is the decode step as a pure function over the whole static cache width, for
`torch.compile` (opt-in, `generate(compile=True)`); measured on a 2-core CPU it compiles in
30–70 s and runs no faster than the eager step (bench/README.md), so nothing uses it by default.

Anything this module does not model (non-default RoPE, sliding windows, MLP biases, dropout in
training, PEFT wrappers, other architectures) makes `supports()` return False, and callers use
the plain `transformers` forward.
"""

from __future__ import annotations

import threading
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
    built from the parameters (cat/index), so gradients land on the model's own `.grad`s."""

    def __init__(self, model):
        cfg = model.config
        self.heads = h = cfg.num_attention_heads
        self.kv_heads = kv = getattr(cfg, "num_key_value_heads", None) or h
        self.head_dim = d = getattr(cfg, "head_dim", None) or cfg.hidden_size // h
        self.hidden = cfg.hidden_size
        self.eps = cfg.rms_norm_eps
        theta = cfg.rope_parameters["rope_theta"]
        # Same expression as transformers' compute_default_rope_parameters.
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float) / d))
        # Row order of the fused q|k|v weight: within each q and k head, dims (0, d/2, 1, d/2+1, ...)
        # so that view_as_complex pairs (x_i, x_{i+d/2}), the pair HF's rotate_half rotates.
        pairs = torch.stack([torch.arange(d // 2), torch.arange(d // 2) + d // 2], dim=1).flatten()
        qk_rows = (torch.arange(h + kv)[:, None] * d + pairs[None, :]).flatten()
        self.qkv_order = torch.cat([qk_rows, torch.arange((h + kv) * d, (h + 2 * kv) * d)])
        base = model.model
        self.embed = base.embed_tokens.weight
        # nn.Embedding(padding_idx=pad) gives the pad row no gradient from lookups; keep that.
        self.padding_idx = base.embed_tokens.padding_idx
        self.norm = base.norm.weight
        self.lm_head = model.lm_head.weight
        self.lm_bias = getattr(model.lm_head, "bias", None)
        self.layers = []
        for layer in base.layers:
            a, m = layer.self_attn, layer.mlp
            bias = _cat_bias(a.q_proj, a.k_proj, a.v_proj)
            self.layers.append(_Layer(
                ln1=layer.input_layernorm.weight,
                wqkv=torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight])[self.qkv_order],
                bqkv=None if bias is None else bias[self.qkv_order],
                wo=a.o_proj.weight, bo=a.o_proj.bias,
                ln2=layer.post_attention_layernorm.weight,
                wgu=torch.cat([m.gate_proj.weight, m.up_proj.weight]),
                wd=m.down_proj.weight,
            ))

    # -- pieces ---------------------------------------------------------------------------------
    def rope(self, positions: torch.Tensor) -> torch.Tensor:
        """Complex rotations (..., 1, d/2) for integer positions (...)."""
        angles = positions[..., None].float() * self.inv_freq
        return torch.polar(torch.ones_like(angles), angles)[..., None, :]

    def fused_qkv(self, layer: _Layer, x):
        """x (..., H) -> q|k|v (..., h+2kv, d), before RoPE."""
        fused = F.linear(F.rms_norm(x, (self.hidden,), layer.ln1, self.eps), layer.wqkv, layer.bqkv)
        return fused.unflatten(-1, (self.heads + 2 * self.kv_heads, self.head_dim))

    def project(self, layer: _Layer, x, rot):
        """x (..., H) -> (q|k with RoPE (..., h+kv, d), v (..., kv, d)); rot from `rope`."""
        qk, v = self.fused_qkv(layer, x).split([self.heads + self.kv_heads, self.kv_heads], dim=-2)
        return self.rotate(qk, rot), v

    def rotate(self, qk, rot):
        """RoPE on (..., heads, d) in the permuted layout: one complex multiply."""
        d = self.head_dim
        return torch.view_as_real(torch.view_as_complex(qk.unflatten(-1, (d // 2, 2))) * rot).flatten(-2)

    def attend(self, q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.kv_heads != self.heads)

    def finish(self, layer: _Layer, x, attn):
        """Residual + output projection, then the SwiGLU MLP block. x (..., H), attn (..., h·d)."""
        x = _add_linear(x, attn, layer.wo, layer.bo)
        gate, up = F.linear(F.rms_norm(x, (self.hidden,), layer.ln2, self.eps), layer.wgu).chunk(2, dim=-1)
        return _add_linear(x, F.silu(gate) * up, layer.wd, None)

    def lookup(self, ids):
        return F.embedding(ids, self.embed, self.padding_idx)

    def logits(self, x):
        return F.linear(F.rms_norm(x, (self.hidden,), self.norm, self.eps), self.lm_head, self.lm_bias)

    def prompt_layer(self, layer: _Layer, x, rot, mask):
        """One layer over left-padded prompts x (U, Tp, H); also returns its k, v (U, kv, Tp, d)."""
        u, tp, _ = x.shape
        qk, v = self.project(layer, x, rot)
        q, k, v = qk[:, :, :self.heads].transpose(1, 2), qk[:, :, self.heads:].transpose(1, 2), v.transpose(1, 2)
        attn = self.attend(q, k, v, mask).transpose(1, 2).reshape(u, tp, -1)
        return self.finish(layer, x, attn), k, v


def _add_linear(x, inputs, weight, bias):
    """x + inputs @ weight.T (+ bias): one addmm for flat (N, H) residual streams."""
    if x.dim() == 2 and bias is None:
        return torch.addmm(x, inputs, weight.t())
    return x + F.linear(inputs, weight, bias)


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


def completion_hidden(w: LlamaWeights, prompt_ids, prompt_mask, completion_ids, lengths=None):
    """Hidden states, before the final norm, at the positions that predict completion tokens.

    Returns (hidden (M, H), index (M,)): row r's token t (flat index r·Tc + t) is predicted by
    hidden[i] where index[i] == r·Tc + t, for every t < lengths[r] (all Tc when `lengths` is
    None). Same as the HF forward over cat([prompt, completion]) with attention
    cat([prompt_mask, 1]) and positions cumsum-1, but each distinct prompt is run once and only
    the completion tokens that feed a scored prediction go through the weights.
    """
    ids_u, mask_u, row = unique_prompts(prompt_ids, prompt_mask)
    b, tc = completion_ids.shape
    tp = ids_u.shape[1]
    if lengths is None:
        lengths = torch.full((b,), tc, dtype=torch.long)
    lengths = lengths.long().clamp(0, tc)
    fed = (lengths - 1).clamp(min=0)                                      # completion tokens fed per row
    t_in = int(fed.max()) if b else 0
    flat = (torch.arange(t_in)[None, :] < fed[:, None]).flatten().nonzero().squeeze(-1)  # into (B·t_in)
    in_row, in_col = flat // max(t_in, 1), flat % max(t_in, 1)
    rot_p = w.rope((mask_u.cumsum(-1) - 1).clamp(min=0))                 # (U, Tp, 1, d/2)
    # RoPE for the completion grid (B, t_in); grid cells past a row's end get harmless positions.
    rot_c = w.rope(mask_u.sum(-1)[row][:, None] + torch.arange(t_in))     # (B, t_in, 1, d/2)
    mask_p = _prompt_masks(mask_u)
    causal = torch.ones(t_in, t_in, dtype=torch.bool).tril()
    mask_c = torch.cat([mask_u.bool()[row][:, None, None, :].expand(b, 1, t_in, tp),
                        causal.expand(b, 1, t_in, t_in)], dim=-1)          # (B, 1, t_in, Tp+t_in)
    xp = w.lookup(ids_u)                                                   # (U, Tp, H)
    xc = w.lookup(completion_ids[in_row, in_col])                          # (N, H) packed
    h, kv, d = w.heads, w.kv_heads, w.head_dim
    for layer in w.layers:
        if len(flat):
            packed = w.fused_qkv(layer, xc)                                # (N, h+2kv, d)
            grid = packed.new_zeros(b * t_in, h + 2 * kv, d).index_copy(0, flat, packed).view(b, t_in, h + 2 * kv, d)
            qk = w.rotate(grid[:, :, :h + kv], rot_c).transpose(1, 2)      # (B, h+kv, t_in, d)
            q, k = qk.split([h, kv], dim=1)
            v = grid[:, :, h + kv:].transpose(1, 2)
        xp, kp, vp = w.prompt_layer(layer, xp, rot_p, mask_p)
        if len(flat):
            attn = w.attend(q, torch.cat([kp[row], k], dim=2), torch.cat([vp[row], v], dim=2), mask_c)
            xc = w.finish(layer, xc, attn.transpose(1, 2).reshape(b * t_in, h * d)[flat])
    scored = (lengths > 0).nonzero().squeeze(-1)
    hidden = torch.cat([xp[row[scored], -1], xc])
    index = torch.cat([scored * tc, in_row * tc + in_col + 1])
    return hidden, index


SPAN_MULTIPLE = 16

_LOCAL = threading.local()


def _cache_buffers(shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """Two zeroed (layers, 2, b, kv, S, d) buffers, reused across calls in this thread.

    A fresh multi-megabyte tensor is a fresh mmap, and first-touch page faults cost more than a
    whole decode step at this scale; keeping the memory warm avoids them. Two buffers so that
    `Decoder.keep` can gather the surviving rows from one into the other.
    """
    numel = 1
    for n in shape:
        numel *= n
    pool = getattr(_LOCAL, "pool", None)
    if getattr(_LOCAL, "busy", False):  # a decoder in this thread still holds the pool
        pool = (torch.empty(numel), torch.empty(numel))
    elif pool is None or pool[0].numel() < numel:
        pool = _LOCAL.pool = (torch.empty(numel), torch.empty(numel))
        _LOCAL.busy = True
    else:
        _LOCAL.busy = True
    return pool[0][:numel].view(shape).zero_(), pool[1][:numel].view(shape)


def decode_step(tokens, cos, sin, cache, key_bias, embed, norm, lm_head, lm_bias, layers, heads: int, kv: int,
                eps: float):
    """One decode step as a pure function, for `torch.compile` (shapes: b rows, S cache columns).

    tokens (b,); cos/sin (b, 1, d/2) RoPE at each row's position; cache (L, 2, b, kv, S, d) holds
    the earlier keys/values; key_bias (b, kv, 1, S) is 0 on readable columns and -inf elsewhere
    (including this step's column, which is not written yet); layers: (ln1, wqkv, bqkv, wo, bo,
    ln2, wgu, wd) per layer, as in `LlamaWeights`. Returns (next-token logits (b, V), this step's
    keys/values (L, 2, b, kv, d)), which the caller writes into the cache: the same math as
    `Decoder.step`, but over all S columns (the new key is scored separately and joined in the
    softmax) so that every shape stays fixed while the cache fills.
    """
    b = tokens.shape[0]
    d = cache.shape[-1]
    hidden = embed.shape[1]
    x = F.embedding(tokens, embed)
    scale = d ** -0.5
    new = []
    for i, (ln1, wqkv, bqkv, wo, bo, ln2, wgu, wd) in enumerate(layers):
        fused = F.linear(F.rms_norm(x, (hidden,), ln1, eps), wqkv, bqkv).unflatten(-1, (heads + 2 * kv, d // 2, 2))
        re, im = fused[:, :heads + kv, :, 0], fused[:, :heads + kv, :, 1]
        qk = torch.stack([re * cos - im * sin, re * sin + im * cos], dim=-1).flatten(-2)  # RoPE, permuted layout
        v = fused[:, heads + kv:].flatten(-2)                                               # (b, kv, d)
        q = qk[:, :heads].reshape(b, kv, heads // kv, d)
        k = qk[:, heads:]
        scores = torch.cat([torch.matmul(q, cache[i, 0].transpose(-1, -2)) * scale + key_bias,
                            (q * k[:, :, None, :]).sum(-1, keepdim=True) * scale], dim=-1)  # (b, kv, h/kv, S+1)
        p = scores.softmax(-1)
        attn = torch.matmul(p[..., :-1], cache[i, 1]) + p[..., -1:] * v[:, :, None, :]
        x = x + F.linear(attn.reshape(b, heads * d), wo, bo)
        gate, up = F.linear(F.rms_norm(x, (hidden,), ln2, eps), wgu).chunk(2, dim=-1)
        x = x + F.linear(F.silu(gate) * up, wd)
        new.append(torch.stack([k, v]))
    logits = F.linear(F.rms_norm(x, (hidden,), norm, eps), lm_head, lm_bias)
    return logits, torch.stack(new)


_COMPILED: dict = {}


def compiled_decode_step():
    """`decode_step` through `torch.compile` (inductor), built once per process; dynamic shapes so
    that the batch (rows dropped by `Decoder.keep`) and the cache width do not recompile."""
    if "step" not in _COMPILED:
        _COMPILED["step"] = torch.compile(decode_step, dynamic=True, fullgraph=True)
    return _COMPILED["step"]


class Decoder:
    """Prefill once per distinct prompt, then one token per live row per `step`, into a static
    KV cache of width Tp + max_new_tokens. Rows are slots; `keep` drops finished slots.

    `compiled=True` runs each step through `compiled_decode_step()` (same samples, log-probs
    within float rounding; tests/perf), which pays only when enough decode steps follow the
    one-off compile (tens of seconds on a small CPU; bench/README.md)."""

    def __init__(self, model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, max_new_tokens: int, *,
                 compiled: bool = False):
        self.compiled = compiled
        # Fewest live slots `keep` may leave: the compiled step specialises batch size 1, so stay
        # at 2 rather than recompile.
        self.min_live = 2 if compiled else 1
        w = self.w = LlamaWeights(model)
        ids_u, mask_u, row = unique_prompts(prompt_ids, prompt_mask)
        b, tp = prompt_ids.shape
        rot = w.rope((mask_u.cumsum(-1) - 1).clamp(min=0))
        attn_mask = _prompt_masks(mask_u)
        x = w.lookup(ids_u)
        # Zeroed: unwritten columns are read (with weight 0) by the padded span in `step`.
        shape = (len(w.layers), 2, b, w.kv_heads, tp + max_new_tokens, w.head_dim)
        self.cache, self.spare = _cache_buffers(shape)
        for i, layer in enumerate(w.layers):
            x, k, v = w.prompt_layer(layer, x, rot, attn_mask)
            self.cache[i, 0, :, :, :tp] = k[row]
            self.cache[i, 1, :, :, :tp] = v[row]
        # Additive mask over cache columns, per kv head so it views as (b·kv, 1, S): -inf on the
        # prompt's left padding and on columns not yet written (`step` opens one per token).
        self.key_bias = torch.full((b, w.kv_heads, 1, tp + max_new_tokens), float("-inf"))
        self.key_bias[:, :, 0, :tp].masked_fill_(mask_u.bool()[row][:, None, :], 0.0)
        self.rot_table = w.rope(torch.arange(tp + max_new_tokens + 1))     # (S+1, 1, d/2)
        if compiled:  # the pure step's arguments: weight tuples and RoPE as cos/sin tables
            self._layers = [(l.ln1, l.wqkv, l.bqkv, l.wo, l.bo, l.ln2, l.wgu, l.wd) for l in w.layers]
            self._cos, self._sin = self.rot_table.real.contiguous(), self.rot_table.imag.contiguous()
        self.width = tp
        self.pos = mask_u.sum(-1)[row]                   # (b,) position of the next token
        self.logits = w.logits(x[:, -1])[row]            # (b, V) next-token logits

    def close(self) -> None:
        """Hand the cache buffers back to this thread's pool (the decoder is unusable after)."""
        if getattr(_LOCAL, "pool", None) is not None and self.cache is not None:
            pooled = {_LOCAL.pool[0].data_ptr(), _LOCAL.pool[1].data_ptr()}
            if self.cache.data_ptr() in pooled or self.spare.data_ptr() in pooled:
                _LOCAL.busy = False
        self.cache = self.spare = None

    def keep(self, slots: torch.Tensor) -> None:
        """Keep only `slots` (indices into the current rows), copying the filled cache columns."""
        n = len(slots)
        layers, two, _, kv, width, d = self.cache.shape
        spare = self.spare.flatten()[:layers * two * n * kv * width * d].view(layers, two, n, kv, width, d)
        for i in range(layers):
            for j in range(two):
                torch.index_select(self.cache[i, j], 0, slots, out=spare[i, j])
        self.cache, self.spare = spare, self.cache
        self.key_bias = self.key_bias[slots]
        self.pos = self.pos[slots]

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed one token per row (b,); returns next-token logits (b, V)."""
        if self.compiled:
            return self._compiled_step(tokens)
        w, col = self.w, self.width
        b = tokens.shape[0]
        h, kv, d = w.heads, w.kv_heads, w.head_dim
        x = w.lookup(tokens)                             # (b, H)
        rot = self.rot_table[self.pos]                   # (b, 1, d/2)
        # Attend over a span rounded up to a multiple of 16 columns: masked columns cost little, and
        # CPU softmax/bmm kernels are several times slower on rows shorter than a vector register.
        span = min(self.key_bias.shape[-1], -(-(col + 1) // SPAN_MULTIPLE) * SPAN_MULTIPLE)
        self.key_bias[..., col] = 0.0
        bias = self.key_bias[..., :span].reshape(b * kv, 1, span)
        scale = d ** -0.5
        for layer, (k_cache, v_cache) in zip(w.layers, self.cache):
            qk, v = w.project(layer, x, rot)             # (b, h+kv, d), (b, kv, d)
            k_cache[:, :, col] = qk[:, h:]
            v_cache[:, :, col] = v
            # One query per row: explicit attention beats SDPA's kernel here, and grouping the
            # query heads by their kv head handles GQA without repeating the cache.
            q = qk[:, :h].reshape(b * kv, h // kv, d)
            keys = k_cache[:, :, :span].reshape(b * kv, span, d)
            scores = torch.baddbmm(bias, q, keys.transpose(1, 2), alpha=scale)     # (b·kv, h/kv, span)
            attn = torch.bmm(scores.softmax(-1), v_cache[:, :, :span].reshape(b * kv, span, d))
            x = w.finish(layer, x, attn.reshape(b, h * d))
        self.width += 1
        self.pos = self.pos + 1
        return w.logits(x)

    def _compiled_step(self, tokens: torch.Tensor) -> torch.Tensor:
        w, col = self.w, self.width
        logits, new = compiled_decode_step()(tokens, self._cos[self.pos], self._sin[self.pos], self.cache,
                                             self.key_bias, w.embed, w.norm, w.lm_head, w.lm_bias, self._layers,
                                             w.heads, w.kv_heads, w.eps)
        self.cache[:, :, :, :, col] = new
        self.key_bias[..., col] = 0.0
        self.width += 1
        self.pos = self.pos + 1
        return logits
