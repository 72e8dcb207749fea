"""The `torch.ops.rlvr` training ops as operators: `torch.library.opcheck` (schema, fake kernels,
autograd registration, AOT dispatch) and `torch.autograd.gradcheck` of the hand-written backward
kernels in float64 (the kernels instantiate the same code for float64, with std::exp in place of
the float32 polynomial). Equivalence with the eager model in float32 is in tests/perf. Skips
only without a C++ toolchain.
"""

import shutil

import pytest
import torch

from rlvr.kernels import native, ops

OPCHECK_TESTS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


@pytest.fixture(scope="module", autouse=True)
def _built():
    from torch.utils.cpp_extension import is_ninja_available
    if not (shutil.which("c++") or shutil.which("g++")) or not is_ninja_available():
        pytest.skip("no C++ compiler or ninja: the C++ kernels cannot be built here")
    assert native.load() is not None, "a toolchain is present but the extension failed to build (see stderr)"


def _layer_inputs(dtype, *, biases=True, seed=0):
    """One small layer over 2 left-padded prompts (Tp = 3) and 4 packed completion rows (two
    sequences on prompt 0, one on prompt 1), 4 query heads on 2 kv heads of size 4, GQA."""
    gen = torch.Generator().manual_seed(seed)
    heads, kv, d, hidden, inter = 4, 2, 4, 8, 6

    def rand(*shape, scale=0.5):
        return (scale * torch.randn(*shape, generator=gen, dtype=torch.float64)).to(dtype)

    mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    owner = torch.tensor([0, 0, 0, 1])             # the prompt of each packed row
    start = torch.tensor([0, 0, 2, 3])             # packed index of each row's first completion row
    in_col = torch.arange(4) - start
    pos = torch.cat([(mask.cumsum(-1) - 1).clamp(min=0).flatten(), mask.sum(-1)[owner] + in_col])
    angles = torch.arange(int(pos.max()) + 1, dtype=torch.float64)[:, None] * torch.tensor([1.0, 0.1])
    rows = mask.numel() + len(owner)
    weights = [1 + rand(hidden, scale=0.1), rand((heads + 2 * kv) * d, hidden), rand((heads + 2 * kv) * d),
               rand(hidden, heads * d), rand(hidden), 1 + rand(hidden, scale=0.1), rand(2 * inter, hidden),
               rand(hidden, inter)]
    if not biases:
        weights[2] = weights[4] = None
    tensors = [rand(rows, hidden, scale=1.0), *weights]
    for t in tensors:
        if t is not None:
            t.requires_grad_()
    plan = [mask, owner, start, pos, angles.cos().to(dtype), angles.sin().to(dtype)]
    return tensors, plan, (heads, kv, 1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("biases", [True, False])
def test_layer_forward_opcheck(dtype, biases):
    tensors, plan, scalars = _layer_inputs(dtype, biases=biases)
    torch.library.opcheck(torch.ops.rlvr.layer_forward.default, (*tensors, *plan, *scalars), test_utils=OPCHECK_TESTS)


def test_layer_backward_opcheck():
    tensors, plan, (heads, kv, eps) = _layer_inputs(torch.float32)
    x, ln1, wqkv, bqkv, wo, bo, ln2, wgu, wd = (t.detach() for t in tensors)
    out = torch.ops.rlvr.layer_forward(x, ln1, wqkv, bqkv, wo, bo, ln2, wgu, wd, *plan, heads, kv, eps)
    dy = torch.randn_like(out[0])
    args = (dy, x, *out[1:], ln1, wqkv, True, wo, True, ln2, wgu, wd, *plan, heads, kv)
    torch.library.opcheck(torch.ops.rlvr.layer_backward.default, args, test_utils=OPCHECK_TESTS)


@pytest.mark.parametrize("biases", [True, False])
def test_layer_gradients_match_finite_differences(biases):
    tensors, plan, scalars = _layer_inputs(torch.float64, biases=biases)
    inputs = [t for t in tensors if t is not None]

    def layer(*given):
        it = iter(given)
        full = [next(it) if t is not None else None for t in tensors]
        return ops.layer(full[0], full[1:], plan, *scalars)

    assert torch.autograd.gradcheck(layer, inputs, eps=1e-6, atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(70, 32), (3, 11, 32)])
def test_rms_norm_opcheck(dtype, shape):
    x = torch.randn(shape, dtype=dtype, requires_grad=True)
    w = (1 + 0.1 * torch.randn(shape[-1], dtype=dtype)).requires_grad_()
    torch.library.opcheck(torch.ops.rlvr.rms_norm.default, (x, w, 1e-6), test_utils=OPCHECK_TESTS)
    rstd = torch.ops.rlvr.rms_norm(x.detach(), w.detach(), 1e-6)[1]
    torch.library.opcheck(torch.ops.rlvr.rms_norm_backward.default,
                          (torch.randn(shape, dtype=dtype), x.detach(), w.detach(), rstd), test_utils=OPCHECK_TESTS)


@pytest.mark.parametrize("shape", [(70, 16), (3, 5, 16)])
def test_rms_norm_gradients_match_finite_differences(shape):
    x = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    w = (1 + 0.1 * torch.randn(shape[-1], dtype=torch.float64)).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: ops.rms_norm(a, b, 1e-6), (x, w), eps=1e-6, atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(70, 24), (3, 5, 24)])
def test_swiglu_opcheck(dtype, shape):
    fused = (3 * torch.randn(shape, dtype=dtype)).requires_grad_()
    torch.library.opcheck(torch.ops.rlvr.swiglu.default, (fused,), test_utils=OPCHECK_TESTS)
    grad = torch.randn(*shape[:-1], shape[-1] // 2, dtype=dtype)
    torch.library.opcheck(torch.ops.rlvr.swiglu_backward.default, (grad, fused.detach()), test_utils=OPCHECK_TESTS)


def test_swiglu_gradients_match_finite_differences():
    fused = (3 * torch.randn(9, 2 * 12, dtype=torch.float64)).requires_grad_()  # both tails of the sigmoid
    assert torch.autograd.gradcheck(torch.ops.rlvr.swiglu, (fused,), eps=1e-6, atol=1e-7, rtol=1e-5)


def test_unused_outputs_cost_no_gradient():
    """Only y of the layer is differentiable; the saved activations come back marked otherwise."""
    tensors, plan, scalars = _layer_inputs(torch.float32)
    out = torch.ops.rlvr.layer_forward(*tensors, *plan, *scalars)
    assert out[0].requires_grad and not any(t.requires_grad for t in out[1:])
    y, rstd = torch.ops.rlvr.rms_norm(tensors[0], tensors[1], 1e-6)
    assert y.requires_grad and not rstd.requires_grad


def test_bad_plans_raise():
    tensors, plan, scalars = _layer_inputs(torch.float32)
    mask, owner, start, pos, cos, sin = plan
    with pytest.raises(RuntimeError, match="out of the RoPE table"):
        ops.layer(tensors[0], tensors[1:], [mask, owner, start, pos + len(cos), cos, sin], *scalars)
    with pytest.raises(RuntimeError, match="bad attention plan"):
        ops.layer(tensors[0], tensors[1:], [mask, owner + 5, start, pos, cos, sin], *scalars)
