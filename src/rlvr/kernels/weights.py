"""The fused parameters of a Llama/Qwen2 model (`LlamaWeights`) and the layer pieces that the
decoder and the training forward share, plus `supports(model)`: which models this package
computes exactly.

Fewer, larger ops: q/k/v and gate/up projections are fused into one matmul each; RoPE is one
complex multiply on q and k together (the q/k weight rows are permuted per head so each rotated
pair (i, i+d/2) is adjacent — dot products q·k are unchanged); RMSNorm is `F.rms_norm` (or the
C++ op when the training kernels are on).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rlvr.kernels import ops

_ARCHITECTURES = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2"}


def supports(model) -> bool:
    """True when `model` is a plain float32 CPU Llama/Qwen2 causal LM this package computes exactly."""
    cfg = getattr(model, "config", None)
    if _ARCHITECTURES.get(type(model).__name__) != getattr(cfg, "model_type", None):
        return False
    # The fused path's ops and the C++ kernels are written (and tested) for float32 on CPU; other
    # dtypes and devices run the plain `transformers` forward.
    weight = model.get_input_embeddings().weight
    if weight.dtype != torch.float32 or weight.device.type != "cpu":
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

    def __init__(self, model, kernels: bool = False):
        cfg = model.config
        # True: the training forward's layers and final RMSNorm run as the C++ ops
        # (`torch.ops.rlvr`, `trainer.kernels=cpp`; the caller has loaded them); False: ATen ops.
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
        if self.kernels and torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
            return ops.rms_norm(x, weight, self.eps)
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


def prompt_masks(prompt_mask: torch.Tensor) -> torch.Tensor:
    """(U, 1, Tp, Tp) bool: causal over real prompt tokens; a padding query sees only itself
    (its output is never read, and a fully masked row would give NaN)."""
    tp = prompt_mask.shape[1]
    causal = torch.ones(tp, tp, dtype=torch.bool).tril()
    eye = torch.eye(tp, dtype=torch.bool)
    return ((causal & prompt_mask.bool()[:, None, :]) | eye)[:, None]


def additive(mask: torch.Tensor) -> torch.Tensor:
    """Boolean attention mask -> float bias: 0 where attended, -inf elsewhere."""
    return torch.zeros(mask.shape).masked_fill_(~mask, float("-inf"))


