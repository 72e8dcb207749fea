"""The machine's limit for a Llama-shaped model: float32 matmul GFLOP/s at the model's own shapes.

Used by bench/vs_trl.py and bench/rollout.py. FLOPs per token are 2N for a forward (N = parameter
count: every parameter is one multiply-add per token; the tied embedding is counted once, as the
LM-head matmul) plus attention 4·layers·hidden·context (QKᵀ and AV).
"""

from __future__ import annotations

import time

import torch


def param_count(model) -> int:
    return sum(p.numel() for p in model.parameters())


def attention_flops_per_token(cfg, context: float) -> float:
    """Forward FLOPs of QKᵀ and AV for one token attending to `context` positions."""
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    return 4 * cfg.num_hidden_layers * heads * head_dim * context


def layer_shapes(cfg) -> list[tuple[int, int, int]]:
    """(in, out, count) of each weight matmul in one forward: q,k,v,o, gate, up, down, LM head."""
    h, i = cfg.hidden_size, cfg.intermediate_size
    heads = cfg.num_attention_heads
    kv = getattr(cfg, "num_key_value_heads", None) or heads
    d = getattr(cfg, "head_dim", None) or h // heads
    layers = cfg.num_hidden_layers
    return [(h, heads * d, layers), (h, kv * d, 2 * layers), (heads * d, h, layers),
            (h, i, 2 * layers), (i, h, layers), (h, cfg.vocab_size, 1)]


def _rate(m: int, k: int, n: int, *, min_time: float = 0.05) -> float:
    a, b = torch.randn(m, k), torch.randn(k, n)
    for _ in range(3):
        a @ b
    reps, elapsed = 0, 0.0
    t0 = time.perf_counter()
    while elapsed < min_time:
        a @ b
        reps += 1
        elapsed = time.perf_counter() - t0
    return 2 * m * k * n * reps / elapsed / 1e9


def matmul_gflops(cfg, rows: int, *, repeats: int = 3) -> float:
    """GFLOP/s of one forward's weight matmuls at `rows` tokens (FLOP-weighted: total FLOPs over
    total time), best of `repeats` so a moment of contention does not count as the machine."""
    best = 0.0
    for _ in range(repeats):
        flops = seconds = 0.0
        for k, n, count in layer_shapes(cfg):
            f = 2 * rows * k * n * count
            flops += f
            seconds += f / (_rate(rows, k, n) * 1e9)
        best = max(best, flops / seconds / 1e9)
    return best
