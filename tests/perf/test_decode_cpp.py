"""The fused C++ decode engine (`Decoder(engine="cpp")`) against the eager `Decoder.step`.

Same sampled tokens, masks and finish flags; log-probs and logits equal to float rounding (the
kernel sums in another order and uses its own exp). Models: the tiny Llama, a GQA Llama with
q/k/v/o biases and an untied head, a Qwen2 (q/k/v bias, GQA 2:1, tied head) and the packaged warm
start; prompts are ragged (left padding) and finished rows are dropped mid-decode (`keep`).
The extension is built once per machine (cached in torch's extension directory; the first build
takes ≈ 25 s); these tests skip only when there is no C++ compiler or ninja to build it with.
No timings here: bench/rollout.py measures speed.
"""

import shutil

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from rlvr.codec import encode_prompts
from rlvr.config import load_config
from rlvr.engines import torch_ar
from rlvr.engines.torch_ar import generate
from rlvr.errors import ConfigError
from rlvr.kernels import native
from rlvr.kernels.decoder import Decoder
from rlvr.models.causal_lm import load_causal_lm

PROMPTS = ["3 5 2>13:", "1 2 3>6:", "9 9 9>729:", "4 4>16:", "7>7:"]  # ragged: left padding
LOGPROB_ATOL = 2e-5  # measured max |Δ log p| ≈ 5e-6 on these models (|log p| up to ≈ 10)
LOGIT_ATOL = 2e-5


def _toolchain_missing() -> str | None:
    from torch.utils.cpp_extension import is_ninja_available
    if not (shutil.which("c++") or shutil.which("g++")):
        return "no C++ compiler (c++/g++) on PATH: the C++ decode engine cannot be built here"
    if not is_ninja_available():
        return "ninja is not installed: torch cannot build the C++ decode engine here"
    return None


@pytest.fixture(scope="module")
def cpp():
    missing = _toolchain_missing()
    if missing:
        pytest.skip(missing)
    module = native.load()
    assert module is not None, "a compiler is present but the C++ decode engine failed to build (see stderr)"
    return module


def _small(vocab):
    return {"vocab_size": vocab, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
            "max_position_embeddings": 64, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}


def _gqa_llama(vocab):  # 4 query heads on 2 kv heads, biases on q/k/v and o, untied LM head
    torch.manual_seed(1)
    return LlamaForCausalLM(LlamaConfig(num_attention_heads=4, num_key_value_heads=2, attention_bias=True,
                                        tie_word_embeddings=False, **_small(vocab)))


def _qwen2(vocab):  # q/k/v biases (no o bias), 2 query heads on 1 kv head, tied head
    torch.manual_seed(2)
    return Qwen2ForCausalLM(Qwen2Config(num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True,
                                        **_small(vocab)))


def _batch(tokenizer, group):
    ids, mask = encode_prompts(tokenizer, [p for p in PROMPTS for _ in range(group)])
    return ids, mask, torch.arange(len(ids)) * 7 + 3


@pytest.fixture(params=["tiny", "gqa_bias", "qwen2", "warmstart"])
def model(request, tiny_model, tokenizer):
    return {"tiny": lambda: tiny_model, "gqa_bias": lambda: _gqa_llama(len(tokenizer)),
            "qwen2": lambda: _qwen2(len(tokenizer)),
            "warmstart": lambda: load_causal_lm("rlvr:countdown-warmstart", seed=0)[0]}[request.param]()


def _rollouts(model, tokenizer, engine, group=8, **kw):
    ids, mask, seeds = _batch(tokenizer, group=group)
    kw = {"max_new_tokens": 16, "eos_id": tokenizer.eos_token_id, "pad_id": tokenizer.pad_token_id, **kw}
    return generate(model, ids, mask, seeds, engine=engine, **kw)


def _assert_same(ref, out):
    assert torch.equal(ref.completion_ids, out.completion_ids)
    assert torch.equal(ref.completion_mask, out.completion_mask)
    assert torch.equal(ref.truncated, out.truncated)
    assert torch.allclose(ref.logprobs, out.logprobs, atol=LOGPROB_ATOL, rtol=0)


@pytest.mark.parametrize("kw", [{}, {"temperature": 0.7, "top_p": 0.9}, {"temperature": 0.0}])
def test_cpp_engine_gives_the_same_samples(cpp, model, tokenizer, kw):
    _assert_same(_rollouts(model, tokenizer, "eager", **kw), _rollouts(model, tokenizer, "cpp", **kw))


@pytest.mark.parametrize("kw", [{}, {"temperature": 0.7}, {"temperature": 0.0}, {"max_new_tokens": 24}])
def test_cpp_sampling_loop_is_one_call_with_the_same_samples(cpp, model, tokenizer, monkeypatch, kw):
    """With top_p = 1 the whole loop (noise, choice, EOS, dropping finished rows) runs in C++:
    no decode step is driven from Python, and the samples are the eager loop's."""
    ref = _rollouts(model, tokenizer, "eager", **kw)
    monkeypatch.setattr(Decoder, "step", lambda *a: pytest.fail("a decode step driven from Python"))
    _assert_same(ref, _rollouts(model, tokenizer, "cpp", **kw))


def test_cpp_engine_with_and_without_dropping_rows(cpp, tiny_model, tokenizer, monkeypatch):
    """The Python loop over the C++ step (top_p < 1), compacting finished rows or not."""
    outs = []
    for fraction in (0.0, 2.0):  # drop finished rows as soon as any finish / never
        monkeypatch.setattr(torch_ar, "COMPACT_FRACTION", fraction)
        outs.append(_rollouts(tiny_model, tokenizer, "cpp", max_new_tokens=24, top_p=0.95))
    assert outs[0].completion_mask.sum(-1).unique().numel() > 1  # rows did finish at different steps
    _assert_same(*outs)


@torch.no_grad()
def test_cpp_step_logits_match_the_eager_step(cpp, model, tokenizer):
    """Step by step on forced tokens, with a `keep` of every other row after the third step."""
    ids, mask, _ = _batch(tokenizer, group=2)
    eager = Decoder(model, ids, mask, 8)
    fused = Decoder(model, ids, mask, 8, engine="cpp")
    try:
        assert fused.engine == "cpp"
        torch.testing.assert_close(fused.logits, eager.logits, rtol=0, atol=LOGIT_ATOL)  # the C++ prefill
        gen = torch.Generator().manual_seed(0)
        tokens = torch.randint(3, len(tokenizer), (len(ids), 7), generator=gen)
        live = torch.arange(len(ids))
        for t in range(7):
            if t == 3:
                live = live[::2]
                for d in (eager, fused):
                    d.keep(torch.arange(0, len(ids), 2))
            ref, out = eager.step(tokens[live, t]), fused.step(tokens[live, t])
            torch.testing.assert_close(out, ref, rtol=0, atol=LOGIT_ATOL)
    finally:
        eager.close()
        fused.close()


@torch.no_grad()
def test_cpp_step_rejects_out_of_range_token_ids(cpp, tiny_model, tokenizer):
    ids, mask, _ = _batch(tokenizer, group=1)
    decoder = Decoder(tiny_model, ids, mask, 4, engine="cpp")
    try:
        with pytest.raises(RuntimeError, match="out of range"):
            decoder.step(torch.full((len(ids),), len(tokenizer)))
    finally:
        decoder.close()


def test_without_a_build_the_cpp_engine_falls_back_to_eager(tiny_model, tokenizer, monkeypatch, capsys):
    def fail(**kw):
        raise RuntimeError("Ninja is required to load C++ extensions")
    monkeypatch.setattr("torch.utils.cpp_extension.load", fail)
    monkeypatch.setattr(native, "_STATE", {})
    assert native.load() is None
    assert native.load() is None  # one attempt, one line, per process
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == ("rlvr: C++ decode engine unavailable (Ninja is required to load C++ extensions); "
                       "using the eager decode step")
    assert len(err) <= 2  # at most the one-line build notice before it
    assert native.fallbacks() == ["Ninja is required to load C++ extensions"]  # for run.json
    ids, mask, _ = _batch(tokenizer, group=2)
    decoder = Decoder(tiny_model, ids, mask, 4, engine="cpp")
    assert decoder.engine == "eager"
    decoder.close()
    _assert_same(_rollouts(tiny_model, tokenizer, "eager"), _rollouts(tiny_model, tokenizer, "cpp"))


def test_non_float32_weights_fall_back_to_eager(tiny_model, monkeypatch, capsys):
    monkeypatch.setattr(native, "_STATE", {})
    monkeypatch.setattr(native, "load", lambda: pytest.fail("must not build for bfloat16 weights"))
    assert native.load_for(tiny_model.to(torch.bfloat16)) is None
    assert capsys.readouterr().err.strip() == ("rlvr: C++ decode engine unavailable (torch.bfloat16 on cpu: the C++ "
                                               "decode engine takes float32 on CPU); using the eager decode step")


def test_engine_names_are_checked(tiny_model, tokenizer):
    ids, mask, _ = _batch(tokenizer, group=1)
    with pytest.raises(ValueError, match="engine must be one of eager, cpp, got 'fast'"):
        Decoder(tiny_model, ids, mask, 4, engine="fast")
    assert load_config(None, ["rollout.decode_engine=cpp"]).rollout.decode_engine == "cpp"
    for name in ("fast", "compile"):
        expected = rf"^rollout\.decode_engine: must be one of 'eager', 'cpp', got '{name}'; "
        with pytest.raises(ConfigError, match=expected):
            load_config(None, [f"rollout.decode_engine={name}"])
