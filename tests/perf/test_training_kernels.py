"""The fused C++ training kernels (`trainer.kernels=cpp`) against the eager ops they replace.

RMSNorm and SwiGLU, forward and backward, on 2-D and 3-D inputs; the weight gradient does not
depend on the thread count; and the whole training forward + backward of `CausalPolicy` (each
layer one C++ call each way) on three model shapes and ragged completions (log-probs and
parameter gradients to float rounding). Skips only without a C++
toolchain. No timings here: bench/vs_trl.py --kernels cpp measures speed.
"""

import shutil

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from rlvr.codec import encode_prompts
from rlvr.config import load_config
from rlvr.engines.torch_ar import generate
from rlvr.errors import ConfigError
from rlvr.kernels import native, ops, training, weights
from rlvr.models.policy import CausalPolicy

PROMPTS = ["3 5 2>13:", "1 2 3>6:", "9 9 9>729:", "4 4>16:", "7>7:"] * 2


@pytest.fixture(scope="module")
def kernels():
    from torch.utils.cpp_extension import is_ninja_available
    if not (shutil.which("c++") or shutil.which("g++")) or not is_ninja_available():
        pytest.skip("no C++ compiler or ninja: the C++ kernels cannot be built here")
    module = native.load()
    assert module is not None, "a toolchain is present but the extension failed to build (see stderr)"
    return module


@pytest.fixture(autouse=True)
def _restore_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("shape", [(70, 32), (3, 11, 32)])
def test_rms_norm_forward_and_backward(kernels, shape):
    torch.manual_seed(0)
    x = torch.randn(shape, requires_grad=True)
    w = (1 + 0.1 * torch.randn(shape[-1])).requires_grad_()
    g = torch.randn(shape)
    F.rms_norm(x, (shape[-1],), w, 1e-6).backward(g)
    ref = (F.rms_norm(x, (shape[-1],), w, 1e-6).detach(), x.grad.clone(), w.grad.clone())
    x.grad = w.grad = None
    out = ops.rms_norm(x, w, 1e-6)
    out.backward(g)
    torch.testing.assert_close(out.detach(), ref[0], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(x.grad, ref[1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(w.grad, ref[2], atol=1e-4, rtol=1e-5)


def test_rms_norm_weight_gradient_is_the_same_for_any_thread_count(kernels):
    torch.manual_seed(1)
    x, g, w = torch.randn(300, 64), torch.randn(300, 64), torch.randn(64)
    rstd = torch.ops.rlvr.rms_norm(x, w, 1e-6)[1]
    torch.set_num_threads(1)
    one = torch.ops.rlvr.rms_norm_backward(g, x, w, rstd)
    torch.set_num_threads(2)
    two = torch.ops.rlvr.rms_norm_backward(g, x, w, rstd)
    assert torch.equal(one[0], two[0]) and torch.equal(one[1], two[1])


@pytest.mark.parametrize("rows", [70, 3])
def test_swiglu_forward_and_backward(kernels, rows):
    """The C++ SwiGLU pair the training layer uses, against `_SwiGLU` (eager)."""
    torch.manual_seed(2)
    fused = (3 * torch.randn(rows, 2 * 48)).requires_grad_()  # gates well into both tails of the sigmoid
    g = torch.randn(rows, 48)
    ref_out = weights._SwiGLU.apply(fused)
    ref_out.backward(g)
    torch.testing.assert_close(torch.ops.rlvr.swiglu(fused.detach()), ref_out.detach(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch.ops.rlvr.swiglu_backward(g, fused.detach()), fused.grad, atol=1e-5, rtol=1e-5)


def _small(vocab):
    return {"vocab_size": vocab, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
            "max_position_embeddings": 64, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}


def _models(vocab):
    torch.manual_seed(3)
    yield "tiny llama", LlamaForCausalLM(LlamaConfig(num_attention_heads=4, **_small(vocab)))
    yield "gqa llama + biases", LlamaForCausalLM(LlamaConfig(num_attention_heads=4, num_key_value_heads=2,
                                                             attention_bias=True, tie_word_embeddings=False,
                                                             **_small(vocab)))
    yield "qwen2", Qwen2ForCausalLM(Qwen2Config(num_attention_heads=4, num_key_value_heads=2,
                                                tie_word_embeddings=True, **_small(vocab)))


def _logprobs_and_grads(model, kernels, ids, mask, out):
    model.zero_grad()
    policy = CausalPolicy(model, kernels=kernels)
    logp, entropy = policy.token_logprobs(ids, mask, out.completion_ids, with_entropy=True,
                                          completion_mask=out.completion_mask)
    weights = torch.linspace(-1, 1, logp.numel()).view_as(logp)
    ((logp * weights).sum() + entropy.sum()).backward()
    return logp.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_policy_forward_backward_matches_eager(kernels, tokenizer):
    ids, mask = encode_prompts(tokenizer, PROMPTS)
    for name, model in _models(len(tokenizer)):
        out = generate(model, ids, mask, torch.arange(len(PROMPTS)), max_new_tokens=8,
                       eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id)
        eager_logp, eager_grads = _logprobs_and_grads(model, "eager", ids, mask, out)
        cpp_logp, cpp_grads = _logprobs_and_grads(model, "cpp", ids, mask, out)
        torch.testing.assert_close(cpp_logp, eager_logp, atol=2e-5, rtol=0, msg=name)
        assert cpp_grads.keys() == eager_grads.keys()
        for key, grad in eager_grads.items():
            assert (cpp_grads[key] - grad).norm() <= 1e-5 * grad.norm() + 1e-7, (name, key)


def test_fused_layers_on_ragged_completions(kernels, tokenizer, monkeypatch):
    """kernels=cpp runs every layer as one C++ call each way (`ops.layer`, never the eager layers),
    with completions of lengths 0, 1, ... full sharing prompts: same log-probs and gradients."""
    ids, mask = encode_prompts(tokenizer, PROMPTS)
    gen = torch.Generator().manual_seed(4)
    completion_ids = torch.randint(3, len(tokenizer), (len(PROMPTS), 9), generator=gen)
    lengths = torch.tensor([0, 1, 2, 9, 5, 9, 3, 1, 7, 4])
    out = type("Out", (), {"completion_ids": completion_ids,
                           "completion_mask": (torch.arange(9)[None, :] < lengths[:, None]).float()})
    for name, model in _models(len(tokenizer)):
        eager_logp, eager_grads = _logprobs_and_grads(model, "eager", ids, mask, out)
        with monkeypatch.context() as m:
            m.setattr(training, "_layers_eager", lambda *a: pytest.fail("eager layers under kernels=cpp"))
            cpp_logp, cpp_grads = _logprobs_and_grads(model, "cpp", ids, mask, out)
        torch.testing.assert_close(cpp_logp, eager_logp, atol=2e-5, rtol=0, msg=name)
        for key, grad in eager_grads.items():
            assert (cpp_grads[key] - grad).norm() <= 1e-5 * grad.norm() + 1e-7, (name, key)


def test_non_float32_model_falls_back_with_one_line(kernels, tokenizer, capsys):
    model = next(_models(len(tokenizer)))[1].to(torch.bfloat16)
    policy = CausalPolicy(model, kernels="cpp")
    assert policy._kernels() is None and policy._kernels() is None
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [("rlvr: C++ training kernels unavailable (torch.bfloat16 on cpu: they take float32 on CPU); "
                    "using eager ops")]


def test_kernels_config_error():
    with pytest.raises(ConfigError, match="trainer.kernels: must be one of 'eager', 'cpp', got 'fast'"):
        load_config(None, ["trainer.kernels=fast"])
