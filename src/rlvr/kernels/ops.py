"""The Python side of the `torch.ops.rlvr` ops defined in `csrc/training.cpp`: fake (shape-only)
kernels, so the ops trace under FakeTensor / `torch.compile`, and the autograd formulas, which
call the hand-written backward ops. `register()` runs once, right after `native.load()` has
loaded the library (the ops must exist before Python can register on them).

`layer_forward`'s autograd kernel is in C++ (`LayerFunction` in csrc/training.cpp): it runs once
per layer and micro-batch, and the Python wrapper of `register_autograd` would add ≈ 150 µs per
call there. rms_norm's saved rstd comes back as an extra output; it is marked non-differentiable
and gradients are not materialised, so no zero tensor is made for it in the backward pass.
"""

from __future__ import annotations

import torch

_REGISTERED: list[bool] = []


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """F.rms_norm over the last dim as one C++ pass each way (eager autograd runs ≈ 8 ops
    backward); the weight gradient is summed in a fixed order, whatever the thread count."""
    return torch.ops.rlvr.rms_norm(x, weight, eps)[0]


def layer(x, layer_weights, plan, heads: int, kv_heads: int, eps: float) -> torch.Tensor:
    """One decoder layer over the training rows, forward and backward one C++ call each.
    `layer_weights`: (ln1, wqkv, bqkv, wo, bo, ln2, wgu, wd), biases may be None; `plan`: (mask,
    owner, start, pos, cos, sin) as built by `training._layers_cpp`."""
    return torch.ops.rlvr.layer_forward(x, *layer_weights, *plan, heads, kv_heads, eps)[0]


def register() -> None:
    """Fake kernels and autograd formulas for the ops; idempotent."""
    if _REGISTERED:
        return
    lib = "rlvr::"
    torch.library.register_fake(lib + "swiglu", _swiglu_fake)
    torch.library.register_fake(lib + "swiglu_backward", lambda grad, fused: torch.empty_like(fused))
    torch.library.register_fake(lib + "rms_norm", _rms_norm_fake)
    torch.library.register_fake(lib + "rms_norm_backward",
                                lambda grad, x, weight, rstd: (torch.empty_like(x), torch.empty_like(weight)))
    torch.library.register_fake(lib + "layer_forward", _layer_forward_fake)
    torch.library.register_fake(lib + "layer_backward", _layer_backward_fake)
    torch.library.register_autograd(lib + "swiglu", _swiglu_backward, setup_context=_swiglu_setup)
    torch.library.register_autograd(lib + "rms_norm", _rms_norm_backward, setup_context=_rms_norm_setup)
    _REGISTERED.append(True)


# -- fake kernels ---------------------------------------------------------------------------------

def _swiglu_fake(fused):
    return fused.new_empty((*fused.shape[:-1], fused.shape[-1] // 2))


def _rms_norm_fake(x, weight, eps):
    return torch.empty_like(x), x.new_empty(x.shape[:-1])


def _layer_forward_fake(x, ln1, wqkv, bqkv, wo, bo, ln2, wgu, wd, mask, owner, start, pos, cos, sin,
                        heads, kv_heads, eps):
    rows = x.shape[0]
    hidden = x.new_empty(rows, x.shape[1])
    return (torch.empty_like(hidden), torch.empty_like(hidden), x.new_empty(rows), x.new_empty(rows, wqkv.shape[0]),
            x.new_empty(rows, wo.shape[1]), torch.empty_like(hidden), torch.empty_like(hidden), x.new_empty(rows),
            x.new_empty(rows, wgu.shape[0]), x.new_empty(rows, wd.shape[1]))


def _layer_backward_fake(dy, x, xn1, rstd1, qkv, attn, x1, xn2, rstd2, gu, act, ln1, wqkv, has_bqkv, wo, has_bo,
                         ln2, wgu, wd, mask, owner, start, pos, cos, sin, heads, kv_heads):
    def bias(has, weight):
        return x.new_empty(weight.shape[0] if has else 0)

    return (torch.empty_like(x), torch.empty_like(ln1), torch.empty_like(wqkv), bias(has_bqkv, wqkv),
            torch.empty_like(wo), bias(has_bo, wo), torch.empty_like(ln2), torch.empty_like(wgu), torch.empty_like(wd))


# -- autograd -------------------------------------------------------------------------------------

def _swiglu_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])


def _swiglu_backward(ctx, grad):
    return torch.ops.rlvr.swiglu_backward(grad, ctx.saved_tensors[0])


def _rms_norm_setup(ctx, inputs, output):
    x, weight, _ = inputs
    ctx.save_for_backward(x, weight, output[1])
    ctx.mark_non_differentiable(output[1])
    ctx.set_materialize_grads(False)


def _rms_norm_backward(ctx, grad, _grad_rstd):
    if grad is None:
        return None, None, None
    x, weight, rstd = ctx.saved_tensors
    dx, dw = torch.ops.rlvr.rms_norm_backward(grad, x, weight, rstd)
    return dx, dw, None
