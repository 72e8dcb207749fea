"""A minimal Llama forward that reads the weights of a `transformers` Llama/Qwen2 model.

At rlvr's home scale (a 1M-parameter model on two CPU cores) a step costs more in framework
overhead and redundant work than in FLOPs. This module removes several of those costs; it is the
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
   `F.rms_norm`; decode attention is two batched matmuls on the static cache. In a decode step
   RoPE is applied in place, so k|v are one block written into the cache with one copy.
5. **Fewer copies in the backward pass** (training forward). Attention is two explicit matmuls
   (`attend_explicit`, ≈ 30% cheaper forward + backward than SDPA's CPU kernel at these shapes);
   RoPE runs on the packed rows; q/k/v go straight into head-major grids (`_ToGrid`), keys and
   values are built with the prompt rows in one buffer (`_KeysGrid`, whose backward sums each
   prompt's rows with one matmul), and SwiGLU's backward writes the fused gate|up gradient
   directly (`_SwiGLU`); tensors are divided with `split`, never several slices (each slice's
   backward is a full-size zero tensor plus a copy).

`decode_step` is the decode step as a pure function over the whole static cache width, for
`torch.compile` (opt-in, `Decoder(engine="compile")`); measured on a 2-core CPU it compiles in
30–70 s and runs no faster than the eager step (bench/README.md), so nothing uses it by default.
`Decoder(engine="cpp")` runs the prefill and each decode step as one call into a small C++
extension (`_decode_cpp`: the same math with the per-op framework overhead gone, ≈ 1.5–1.9× the
eager sampler at batch 64; the trainer default, `rollout.decode_engine=cpp`, eager fallback without a compiler).

Anything this module does not model (non-default RoPE, sliding windows, MLP biases, dropout in
training, PEFT wrappers, other architectures) makes `supports()` return False, and callers use
the plain `transformers` forward.
"""

from __future__ import annotations

import contextlib
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

    def __init__(self, model, kernels=None):
        cfg = model.config
        # The C++ extension (`_decode_cpp`) that runs the training forward's layers (`_LayerCpp`)
        # and final RMSNorm (`trainer.kernels=cpp`); None = ATen ops.
        self.kernels = kernels
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
                wqkv=torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]).index_select(0, self.qkv_order),
                bqkv=None if bias is None else bias.index_select(0, self.qkv_order),
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
        fused = F.linear(self.rms_norm(x, layer.ln1), layer.wqkv, layer.bqkv)
        return fused.unflatten(-1, (self.heads + 2 * self.kv_heads, self.head_dim))

    def project(self, layer: _Layer, x, rot):
        """x (..., H) -> (q|k with RoPE (..., h+kv, d), v (..., kv, d)); rot from `rope`."""
        qk, v = self.fused_qkv(layer, x).split([self.heads + self.kv_heads, self.kv_heads], dim=-2)
        return self.rotate(qk, rot), v

    def rotate(self, qk, rot):
        """RoPE on (..., heads, d) in the permuted layout: one complex multiply."""
        d = self.head_dim
        return torch.view_as_real(torch.view_as_complex(qk.unflatten(-1, (d // 2, 2))) * rot).flatten(-2)

    def rotate_(self, qk, rot):
        """`rotate` in place (no autograd): qk (..., heads, d) is overwritten with its rotation."""
        d = self.head_dim
        torch.view_as_complex(qk.unflatten(-1, (d // 2, 2))).mul_(rot)
        return qk

    def attend(self, q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.kv_heads != self.heads)

    def attend_explicit(self, q, k, v, bias):
        """softmax(q·kᵀ/√d + bias)·v as two matmuls: q (N, h, T, d), k/v (N, kv, S, d), bias (N, 1, T, S)
        additive (0 / -inf). For autograd at the training forward's small shapes this is ≈ 30% cheaper
        (forward + backward) than SDPA's CPU flash kernel with a boolean mask; same values to float
        rounding. Every query must see at least one key (a fully masked row gives NaN)."""
        if self.kv_heads != self.heads:  # group query heads by their kv head; no repeated keys
            g = self.heads // self.kv_heads
            q, k, v, bias = q.unflatten(1, (self.kv_heads, g)), k[:, :, None], v[:, :, None], bias[:, :, None]
        scores = torch.matmul(q, k.transpose(-1, -2)).mul_(self.head_dim ** -0.5).add_(bias)
        out = torch.matmul(scores.softmax(-1), v)
        return out.flatten(1, 2) if out.dim() == 5 else out

    def finish(self, layer: _Layer, x, attn):
        """Residual + output projection, then the SwiGLU MLP block. x (..., H), attn (..., h·d)."""
        x = _add_linear(x, attn, layer.wo, layer.bo)
        return _add_linear(x, swiglu(F.linear(self.rms_norm(x, layer.ln2), layer.wgu)), layer.wd, None)

    def lookup(self, ids):
        return F.embedding(ids, self.embed, self.padding_idx)

    def logits(self, x):
        return F.linear(self.rms_norm(x, self.norm), self.lm_head, self.lm_bias)

    def rms_norm(self, x, weight):
        """F.rms_norm over the hidden size; the fused C++ kernels when they are on and autograd records."""
        if self.kernels is not None and torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
            return _RMSNormCpp.apply(x, weight, self.eps, self.kernels)
        return F.rms_norm(x, (self.hidden,), weight, self.eps)

    def prompt_layer(self, layer: _Layer, x, rot, mask, bias=None):
        """One layer over left-padded prompts x (U, Tp, H); also returns its k, v (U, kv, Tp, d).
        With `bias` (the additive form of `mask`) attention is `attend_explicit` instead of SDPA."""
        u, tp, _ = x.shape
        qk, v = self.project(layer, x, rot)
        q, k = qk.transpose(1, 2).split([self.heads, self.kv_heads], dim=1)
        v = v.transpose(1, 2)
        attn = self.attend(q, k, v, mask) if bias is None else self.attend_explicit(q, k, v, bias)
        return self.finish(layer, x, attn.transpose(1, 2).reshape(u, tp, -1)), k, v


class _SwiGLU(torch.autograd.Function):
    """silu(gate) · up over the fused gate|up projection (..., 2I) -> (..., I).

    Autograd of `chunk`, `silu` and `*` would build the gate and up gradients separately and then
    concatenate them into the fused gradient (one more (tokens, 2I) copy per layer); this backward
    writes both halves straight into it. The same ops in the same order: identical values."""

    @staticmethod
    def forward(ctx, fused):
        gate, up = fused.chunk(2, dim=-1)
        act = F.silu(gate)
        ctx.save_for_backward(fused, act)
        return act * up

    @staticmethod
    def backward(ctx, grad):
        fused, act = ctx.saved_tensors
        gate, up = fused.chunk(2, dim=-1)
        grad_fused = torch.empty_like(fused)
        grad_gate, grad_up = grad_fused.chunk(2, dim=-1)
        torch.mul(grad, act, out=grad_up)
        torch.ops.aten.silu_backward.grad_input(grad * up, gate, grad_input=grad_gate)
        return grad_fused


class _ToGrid(torch.autograd.Function):
    """Packed rows (N, heads, d) -> head-major grid (B, heads, T, d), zero where no row lands: row n
    goes to cell (in_row[n], :, in_col[n]). The grid comes out contiguous in the layout attention's
    matmuls read, and the backward reads the gradient back at those cells in one gather (instead of a
    contiguous copy of the transposed gradient and an index_select). Pure copies: exact."""

    @staticmethod
    def forward(ctx, packed, in_row, in_col, rows: int, width: int):
        ctx.save_for_backward(in_row, in_col)
        grid = packed.new_zeros(rows, packed.shape[1], width, packed.shape[2])
        grid[in_row, :, in_col] = packed
        return grid

    @staticmethod
    def backward(ctx, grad):
        in_row, in_col = ctx.saved_tensors
        return grad[in_row, :, in_col], None, None, None, None


class _KeysGrid(torch.autograd.Function):
    """Keys (or values) for the completion queries, built in one buffer: the distinct prompts' rows
    fanned out to the B rows (prompt (U, kv, Tp, d), `rows` (B,)) in columns [0, Tp), and the packed
    completion rows (N, kv, d) at (in_row, :, Tp + in_col), zero elsewhere -> (B, kv, Tp + T, d).
    Replaces a row gather, a zero grid, a scatter and a concatenation (each a full copy). The
    backward sums each prompt's G row gradients with one matmul (one-hot (U, B) @ grad (B, ·)),
    several times faster than `index_add_`'s scatter at these shapes, and gathers the completion
    cells. Same values; gradients equal up to float summation order."""

    @staticmethod
    def forward(ctx, prompt, packed, rows, in_row, in_col, width: int):
        ctx.save_for_backward(rows, in_row, in_col)
        ctx.count, _, tp, _ = prompt.shape
        ctx.tp = tp
        kv, d = prompt.shape[1], prompt.shape[3]
        out = packed.new_empty(rows.shape[0], kv, tp + width, d)
        out[:, :, :tp] = prompt.index_select(0, rows)
        out[:, :, tp:] = 0.0
        out[in_row, :, tp + in_col] = packed
        return out

    @staticmethod
    def backward(ctx, grad):
        rows, in_row, in_col = ctx.saved_tensors
        b, kv, _, d = grad.shape
        tp = ctx.tp
        grad_prompt = grad_packed = None
        if ctx.needs_input_grad[0]:
            onehot = torch.zeros(ctx.count, b, dtype=grad.dtype)
            onehot[rows, torch.arange(b)] = 1.0
            grad_prompt = (onehot @ grad[:, :, :tp].reshape(b, -1)).view(ctx.count, kv, tp, d)
        if ctx.needs_input_grad[1]:
            grad_packed = grad[in_row, :, tp + in_col]
        return grad_prompt, grad_packed, None, None, None, None


class _FromGrid(torch.autograd.Function):
    """The inverse gather: grid (B, heads, T, d) -> packed rows (N, heads·d) at (in_row, :, in_col);
    the backward scatters into a zero grid without accumulation (cells are distinct). Exact."""

    @staticmethod
    def forward(ctx, grid, in_row, in_col):
        ctx.save_for_backward(in_row, in_col)
        ctx.shape = grid.shape
        return grid[in_row, :, in_col].flatten(1)

    @staticmethod
    def backward(ctx, grad):
        in_row, in_col = ctx.saved_tensors
        out = grad.new_zeros(ctx.shape)
        out[in_row, :, in_col] = grad.view(len(in_row), ctx.shape[1], ctx.shape[3])
        return out, None, None


class _RMSNormCpp(torch.autograd.Function):
    """F.rms_norm over the last dim as one C++ pass each way (eager autograd runs ≈ 8 ops
    backward); the weight gradient is summed in a fixed order, whatever the thread count."""

    @staticmethod
    def forward(ctx, x, weight, eps: float, kernels):
        flat = x.reshape(-1, x.shape[-1]).contiguous()
        out, rstd = kernels.rms_norm_forward(flat, weight.contiguous(), eps)
        ctx.save_for_backward(flat, weight, rstd)
        ctx.kernels, ctx.shape = kernels, x.shape
        return out.view(x.shape)

    @staticmethod
    def backward(ctx, grad):
        flat, weight, rstd = ctx.saved_tensors
        dx, dw = ctx.kernels.rms_norm_backward(grad.reshape(flat.shape).contiguous(), flat, weight.contiguous(), rstd)
        return dx.view(ctx.shape), dw, None, None


class _LayerCpp(torch.autograd.Function):
    """One decoder layer forward and backward as single C++ calls (`_decode_cpp.layer_forward` /
    `layer_backward`): no per-op dispatch or Python between the ops, and the GIL released for the
    whole layer (row-parallel workers run at once). Same math as the eager layer; float rounding."""

    @staticmethod
    def forward(ctx, x, ln1, wqkv, bqkv, wo, bo, ln2, wgu, wd, plan, w):
        none = torch.empty(0)
        out = w.kernels.layer_forward(x.contiguous(), ln1, wqkv, none if bqkv is None else bqkv, wo,
                                      none if bo is None else bo, ln2, wgu, wd, *plan, w.heads, w.kv_heads, w.eps)
        ctx.save_for_backward(x, *out[1:], ln1, wqkv, wo, ln2, wgu, wd)
        ctx.plan, ctx.w, ctx.biases = plan, w, (bqkv is not None, bo is not None)
        return out[0]

    @staticmethod
    def backward(ctx, dy):
        x, xn1, rstd1, qkv, attn, x1, xn2, rstd2, gu, act, ln1, wqkv, wo, ln2, wgu, wd = ctx.saved_tensors
        w, (has_bqkv, has_bo) = ctx.w, ctx.biases
        dx, dln1, dwqkv, dbqkv, dwo, dbo, dln2, dwgu, dwd = w.kernels.layer_backward(
            dy.contiguous(), x, xn1, rstd1, qkv, attn, x1, xn2, rstd2, gu, act, ln1, wqkv, has_bqkv, wo, has_bo,
            ln2, wgu, wd, *ctx.plan, w.heads, w.kv_heads)
        return (dx, dln1, dwqkv, dbqkv if has_bqkv else None, dwo, dbo if has_bo else None, dln2, dwgu, dwd,
                None, None)


def swiglu(fused: torch.Tensor) -> torch.Tensor:
    """silu(fused[..., :I]) · fused[..., I:]; without autograd, the silu is done in place."""
    if torch.is_grad_enabled() and fused.requires_grad:
        return _SwiGLU.apply(fused)
    gate, up = fused.chunk(2, dim=-1)
    return F.silu(gate, inplace=True) * up


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


def _additive(mask: torch.Tensor) -> torch.Tensor:
    """Boolean attention mask -> float bias: 0 where attended, -inf elsewhere."""
    return torch.zeros(mask.shape).masked_fill_(~mask, float("-inf"))


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
    if w.kernels is not None:
        xp, xc = _layers_cpp(w, ids_u, mask_u, row, completion_ids[in_row, in_col], in_row, in_col)
    else:
        xp, xc = _layers_eager(w, ids_u, mask_u, row, completion_ids, flat, in_row, in_col, t_in)
    scored = (lengths > 0).nonzero().squeeze(-1)
    hidden = torch.cat([xp[row[scored], -1], xc])
    index = torch.cat([scored * tc, in_row * tc + in_col + 1])
    return hidden, index


def _layers_eager(w: LlamaWeights, ids_u, mask_u, row, completion_ids, flat, in_row, in_col, t_in):
    """The layers of `completion_hidden` as ATen ops: (prompt rows (U, Tp, H), packed rows (N, H))."""
    b, tp = completion_ids.shape[0], ids_u.shape[1]
    rot_p = w.rope((mask_u.cumsum(-1) - 1).clamp(min=0))                 # (U, Tp, 1, d/2)
    rot_c = w.rope(mask_u.sum(-1)[row][in_row] + in_col)                  # (N, 1, d/2): packed tokens
    mask_p = _prompt_masks(mask_u)
    bias_p = _additive(mask_p)                                            # (U, 1, Tp, Tp)
    causal = torch.ones(t_in, t_in, dtype=torch.bool).tril()
    bias_c = _additive(torch.cat([mask_u.bool()[row][:, None, None, :].expand(b, 1, t_in, tp),
                                  causal.expand(b, 1, t_in, t_in)], dim=-1))  # (B, 1, t_in, Tp+t_in)
    xp = w.lookup(ids_u)                                                   # (U, Tp, H)
    xc = w.lookup(completion_ids[in_row, in_col])                          # (N, H) packed
    h, kv = w.heads, w.kv_heads
    for layer in w.layers:
        if len(flat):
            # Parts of one tensor are taken with split, never with slices: the backward of a slice
            # is a zero tensor of the whole input plus a copy, per slice; split's is one cat.
            qk, v = w.fused_qkv(layer, xc).split([h + kv, kv], dim=1)     # (N, h+kv, d), (N, kv, d)
            q, k = w.rotate(qk, rot_c).split([h, kv], dim=1)               # RoPE on the packed rows only
            q = _ToGrid.apply(q, in_row, in_col, b, t_in)                  # (B, h, t_in, d)
        xp, kp, vp = w.prompt_layer(layer, xp, rot_p, mask_p, bias_p)
        if len(flat):
            keys = _KeysGrid.apply(kp, k, row, in_row, in_col, t_in)       # (B, kv, Tp+t_in, d)
            values = _KeysGrid.apply(vp, v, row, in_row, in_col, t_in)
            attn = w.attend_explicit(q, keys, values, bias_c)
            xc = w.finish(layer, xc, _FromGrid.apply(attn, in_row, in_col))
    return xp, xc


def _layers_cpp(w: LlamaWeights, ids_u, mask_u, row, fed_ids, in_row, in_col):
    """The layers of `completion_hidden` as one C++ call per layer each way (`trainer.kernels=cpp`):
    prompt rows and packed completion rows go through one (U·Tp + N, H) matrix, attention follows
    the same masks as `_layers_eager`. Returns (prompt rows (U, Tp, H), packed rows (N, H))."""
    u, tp = ids_u.shape
    mask_u = mask_u.long().contiguous()
    pos = torch.cat([((mask_u.cumsum(-1) - 1).clamp(min=0)).flatten(), mask_u.sum(-1)[row][in_row] + in_col])
    table = w.rope(torch.arange(int(pos.max()) + 1))[:, 0]                # (S, d/2) complex
    # Packed rows are row-major, so a sequence's first packed row is `in_col` rows back.
    plan = (mask_u, row[in_row].contiguous(), (torch.arange(len(in_row)) - in_col).contiguous(), pos.contiguous(),
            table.real.contiguous(), table.imag.contiguous())
    x = torch.cat([w.lookup(ids_u).flatten(0, 1), w.lookup(fed_ids)])
    for layer in w.layers:
        x = _LayerCpp.apply(x, layer.ln1, layer.wqkv, layer.bqkv, layer.wo, layer.bo, layer.ln2, layer.wgu, layer.wd,
                            plan, w)
    return x[:u * tp].view(u, tp, -1), x[u * tp:]


SPAN_MULTIPLE = 16

_LOCAL = threading.local()


def _cache_buffers(shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """Two (layers, 2, b, kv, S, d) buffers, reused across calls in this thread (not zeroed).

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
    return pool[0][:numel].view(shape), pool[1][:numel].view(shape)


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


ENGINES = ("eager", "cpp", "compile")
"""Decode-step engines: the eager ATen ops of `Decoder.step`, the fused C++ step of
`_decode_cpp` (built on first use; falls back to eager if it cannot be built), or `decode_step`
through `torch.compile`."""


class Decoder:
    """Prefill once per distinct prompt, then one token per live row per `step`, into a static
    KV cache of width Tp + max_new_tokens. Rows are slots; `keep` drops finished slots.

    `engine` picks how a step runs (`ENGINES`); all give the same samples, with log-probs equal
    to float rounding (tests/perf). `compile` pays only when enough decode steps follow its
    one-off compile (tens of seconds on a small CPU); `cpp` needs a C++ compiler once per
    machine (the build is cached). `compiled=True` is the older spelling of `engine="compile"`."""

    def __init__(self, model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, max_new_tokens: int, *,
                 compiled: bool = False, engine: str = "eager"):
        if engine not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
        engine = "compile" if compiled else engine
        self._cpp = _load_cpp(model) if engine == "cpp" else None
        self.engine = "eager" if engine == "cpp" and self._cpp is None else engine
        self.compiled = compiled = self.engine == "compile"
        # Fewest live slots `keep` may leave: the compiled step specialises batch size 1, so stay
        # at 2 rather than recompile.
        self.min_live = 2 if compiled else 1
        shared = _SHARED.get(id(model))
        w = self.w = LlamaWeights(model) if shared is None else shared.weights(model)
        ids_u, mask_u, row = unique_prompts(prompt_ids, prompt_mask)
        b, tp = prompt_ids.shape
        shape = (len(w.layers), 2, b, w.kv_heads, tp + max_new_tokens, w.head_dim)
        self.cache, self.spare = _cache_buffers(shape)
        # The padded span in `step` reads columns not written yet (with weight 0, so they must be
        # finite, and the pool holds stale data): `step` zeroes each new span block as it comes into
        # view, over the rows still live then. The prompt columns are all written below; the compiled
        # step reads every column, so it gets them all zeroed now. (The C++ step needs neither.)
        self.zeroed = tp + max_new_tokens if compiled else tp    # columns [0, zeroed) are finite
        if compiled:
            self.cache[..., tp:, :].zero_()
        self.rot_table = w.rope(torch.arange(tp + max_new_tokens + 1))     # (S+1, 1, d/2)
        if self.engine == "cpp":  # prefill in C++ too: it writes the cache in the layout its step reads
            self._fused = _cpp_engine(self._cpp, w, self.rot_table, b, shared)
            self.logits = self._fused.prefill(ids_u.contiguous(), mask_u.long().contiguous(), row.contiguous(),
                                              self.cache)
        else:
            self.logits = self._prefill(ids_u, mask_u, row)   # (b, V) next-token logits
        # Additive mask over cache columns, per kv head so it views as (b·kv, 1, S): -inf on the
        # prompt's left padding and on columns not yet written (`step` opens one per token).
        self.key_bias = torch.full((b, w.kv_heads, 1, tp + max_new_tokens), float("-inf"))
        self.key_bias[:, :, 0, :tp].masked_fill_(mask_u.bool()[row][:, None, :], 0.0)
        if compiled:  # the pure step's arguments: weight tuples and RoPE as cos/sin tables
            self._layers = [(l.ln1, l.wqkv, l.bqkv, l.wo, l.bo, l.ln2, l.wgu, l.wd) for l in w.layers]
            self._cos, self._sin = self.rot_table.real.contiguous(), self.rot_table.imag.contiguous()
        self.width = tp
        self.pos = mask_u.sum(-1)[row]                   # (b,) position of the next token

    def _prefill(self, ids_u, mask_u, row) -> torch.Tensor:
        """Eager prefill of the distinct prompts into the cache rows; returns each row's logits."""
        w, tp = self.w, ids_u.shape[1]
        rot = w.rope((mask_u.cumsum(-1) - 1).clamp(min=0))
        attn_mask = _prompt_masks(mask_u)
        x = w.lookup(ids_u)
        for i, layer in enumerate(w.layers):
            x, k, v = w.prompt_layer(layer, x, rot, attn_mask)
            # One gather of the distinct prompts' k|v into the rows, from a contiguous copy (gathering
            # from the transposed view directly is several times slower).
            kv_u = torch.stack([k, v])                                     # (2, U, kv, Tp, d)
            self.cache[i, :, :, :, :tp] = kv_u.index_select(1, row)
        return w.logits(x[:, -1])[row]

    def close(self) -> None:
        """Hand the cache buffers back to this thread's pool (the decoder is unusable after)."""
        if getattr(_LOCAL, "pool", None) is not None and self.cache is not None:
            pooled = {_LOCAL.pool[0].data_ptr(), _LOCAL.pool[1].data_ptr()}
            if self.cache.data_ptr() in pooled or self.spare.data_ptr() in pooled:
                _LOCAL.busy = False
        self.cache = self.spare = None

    def keep(self, slots: torch.Tensor) -> None:
        """Keep only `slots` (indices into the current rows), copying their cache rows (one gather)."""
        n = len(slots)
        layers, two, _, kv, width, d = self.cache.shape
        spare = self.spare.flatten()[:layers * two * n * kv * width * d].view(layers, two, n, kv, width, d)
        torch.index_select(self.cache, 2, slots, out=spare)
        self.cache, self.spare = spare, self.cache
        self.key_bias = self.key_bias[slots]
        self.pos = self.pos[slots]

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed one token per row (b,); returns next-token logits (b, V)."""
        if self.compiled:
            return self._compiled_step(tokens)
        if self.engine == "cpp":
            return self._cpp_step(tokens)
        w, col = self.w, self.width
        b = tokens.shape[0]
        h, kv, d = w.heads, w.kv_heads, w.head_dim
        x = w.lookup(tokens)                             # (b, H)
        rot = self.rot_table[self.pos]                   # (b, 1, d/2)
        # Attend over a span rounded up to a multiple of 16 columns: masked columns cost little, and
        # CPU softmax/bmm kernels are several times slower on rows shorter than a vector register.
        span = min(self.key_bias.shape[-1], -(-(col + 1) // SPAN_MULTIPLE) * SPAN_MULTIPLE)
        if span > self.zeroed:
            self.cache[..., self.zeroed:span, :].zero_()
            self.zeroed = span
        self.key_bias[..., col] = 0.0
        bias = self.key_bias[..., :span].reshape(b * kv, 1, span)
        scale = d ** -0.5
        for layer, layer_cache in zip(w.layers, self.cache):             # (2, b, kv, S, d)
            fused = w.fused_qkv(layer, x)                # (b, h+2kv, d)
            w.rotate_(fused[:, :h + kv], rot)            # RoPE in place: k|v are now one contiguous block
            layer_cache[:, :, :, col] = fused[:, h:].unflatten(1, (2, kv)).transpose(0, 1)  # one write
            k_cache, v_cache = layer_cache
            # One query per row: explicit attention beats SDPA's kernel here, and grouping the
            # query heads by their kv head handles GQA without repeating the cache.
            q = fused[:, :h].reshape(b * kv, h // kv, d)
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

    def sample_all(self, seeds: torch.Tensor, max_new_tokens: int, *, temperature: float, eos_id: int,
                   pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The cpp engine's whole sampling loop in one call (top_p = 1 only): the same tokens as
        `torch_ar._decode` over `step`, with finished rows leaving at once instead of in batches.
        Returns (tokens (b, n) long, log-probs (b, n), done (b,) bool); the decoder is spent after."""
        if self.engine != "cpp":
            raise ValueError("sample_all needs the cpp engine")
        return self._fused.generate(self.logits.contiguous(), seeds.long().contiguous(), self.pos.contiguous(),
                                    self.cache, self.key_bias, self.width, max_new_tokens, float(temperature),
                                    eos_id, pad_id)

    def _cpp_step(self, tokens: torch.Tensor) -> torch.Tensor:
        # The fused step gives columns whose bias is -inf probability 0 whatever they hold, so it needs
        # no zeroed cache span.
        col = self.width
        self.key_bias[..., col] = 0.0
        logits = self._fused.step(tokens.contiguous(), self.pos, self.cache, self.key_bias, col)
        self.width += 1
        self.pos = self.pos + 1
        return logits


def _load_cpp(model, what: str = ""):
    """The C++ extension, or None (eager fallback, after one stderr line): it is built for float32
    CPU weights only. `what` names the user in that line when it is not the decode step."""
    from rlvr.models import _decode_cpp
    weight = model.get_input_embeddings().weight
    if weight.dtype != torch.float32 or weight.device.type != "cpu":
        needs = "they take" if what else "the C++ decode engine takes"
        _decode_cpp.warn_once(f"{weight.dtype} on {weight.device.type}: {needs} float32 on CPU", what=what)
        return None
    module = _decode_cpp.load()
    if module is None and what:  # the build failure itself was reported once, for the decode step
        _decode_cpp.warn_once("the extension could not be built", what=what)
    return module


def training_kernels(model):
    """The C++ extension for `LlamaWeights(model, kernels=...)`, or None (eager ops)."""
    return _load_cpp(model, what="training kernels")


def _cpp_engine(module, w: LlamaWeights, rot_table: torch.Tensor, rows: int, shared: "_Shared | None" = None):
    """The C++ step for these weights (which it copies, transposed), absent biases as empty
    tensors, RoPE as cos/sin tables (S+1, d/2), workspaces for up to `rows` rows. Inside a
    `shared_weights` block the weights are prepared once and each call forks that engine."""
    def plain(t):
        return torch.empty(0) if t is None else t.detach().contiguous()

    table = rot_table[:, 0]
    cos, sin = table.real.contiguous(), table.imag.contiguous()

    def build():
        flat = [plain(getattr(l, f)) for l in w.layers for f in ("ln1", "wqkv", "bqkv", "wo", "bo", "ln2", "wgu", "wd")]
        return module.Engine(plain(w.embed), plain(w.norm), plain(w.lm_head), plain(w.lm_bias), flat,
                             cos, sin, w.heads, w.kv_heads, w.eps, rows)

    if shared is None:
        return build()
    with shared.lock:
        if shared.engine is None:
            shared.engine = build()
    return shared.engine.fork(cos, sin, rows)


class _Shared:
    """One preparation of a model's weights for the Decoders of a `shared_weights` block."""

    def __init__(self):
        self.lock = threading.Lock()
        self.prepared: LlamaWeights | None = None
        self.engine = None  # the C++ engine built first; later Decoders fork it

    def weights(self, model) -> LlamaWeights:
        with self.lock:
            if self.prepared is None:
                self.prepared = LlamaWeights(model)
            return self.prepared


_SHARED: dict[int, _Shared] = {}


@contextlib.contextmanager
def shared_weights(model):
    """Within this block, Decoders of `model` (from any thread) share one `LlamaWeights` and one
    set of the C++ engine's transposed weights, made by the first of them; row-parallel workers
    sampling one batch then prepare the weights once instead of once each. The model's weights
    must not change inside the block."""
    _SHARED[id(model)] = _Shared()
    try:
        yield
    finally:
        _SHARED.pop(id(model), None)
