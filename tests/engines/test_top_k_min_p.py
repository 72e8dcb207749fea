"""rollout.top_k / rollout.min_p: the truncations by hand, greedy at k = 1 on every sampling path,
sampled tokens inside the top k, passed to vLLM, and their config checks."""

from __future__ import annotations

import pytest
import torch

from rlvr.config import load_config
from rlvr.engines.torch_ar import generate, min_p_filter, top_k_filter
from rlvr.errors import ConfigError

INF = float("-inf")


def test_filters_by_hand():
    logits = torch.tensor([[3.0, 1.0, 2.0, 0.0], [0.0, 5.0, 5.0, 4.0]])
    assert top_k_filter(logits, 2).tolist() == [[3.0, INF, 2.0, INF], [INF, 5.0, 5.0, INF]]
    assert torch.equal(top_k_filter(logits, 0), logits) and torch.equal(top_k_filter(logits, 4), logits)
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    # min_p 0.4: keep p >= 0.4 * 0.5 = 0.2, i.e. 0.5 and 0.3
    kept = min_p_filter(probs.log(), 0.4).exp()
    assert torch.allclose(kept, torch.tensor([[0.5, 0.3, 0.0, 0.0]]))
    assert torch.equal(min_p_filter(probs.log(), 0.0), probs.log())


@pytest.mark.parametrize("path", [dict(fast=False), dict(engine="eager"), dict(engine="cpp")])
def test_top_k_1_and_a_tight_min_p_are_greedy_on_every_path(model_and_prompts, path):
    model, tok, prompt, mask, seeds = model_and_prompts
    common = dict(max_new_tokens=10, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, **path)
    greedy = generate(model, prompt, mask, seeds, temperature=0.0, **common).completion_ids
    plain = generate(model, prompt, mask, seeds, temperature=1.0, **common).completion_ids
    assert not torch.equal(plain, greedy)  # a sampled run differs: the truncation below is what makes them equal
    for option in (dict(top_k=1), dict(min_p=0.999)):
        out = generate(model, prompt, mask, seeds, temperature=1.0, **common, **option)
        assert torch.equal(out.completion_ids, greedy), option


def test_sampled_tokens_stay_in_the_top_k(model_and_prompts):
    model, tok, prompt, mask, seeds = model_and_prompts
    out = generate(model, prompt, mask, seeds, temperature=1.5, top_k=3, max_new_tokens=12,
                   eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, fast=False)
    ids = torch.cat([prompt, out.completion_ids], dim=1)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[:, prompt.shape[1] - 1:-1]  # (B, T, V): the step's distribution
    rank = (logits > logits.gather(-1, out.completion_ids[..., None])).sum(-1)  # tokens strictly above the chosen
    assert int(rank[out.completion_mask.bool()].max()) <= 2
    logp = logits.float().div(1.5).log_softmax(-1).gather(-1, out.completion_ids[..., None]).squeeze(-1)
    torch.testing.assert_close(out.logprobs[out.completion_mask.bool()], logp[out.completion_mask.bool()],
                               rtol=0, atol=1e-4)  # recorded before the truncation, as the trainer recomputes


def test_vllm_gets_top_k_and_min_p():
    from rlvr.engines.vllm import VLLMEngine

    engine = VLLMEngine.__new__(VLLMEngine)  # the sampling parameters only: no vLLM started
    engine._sampling_params = dict
    engine.top_p, engine.top_k, engine.min_p, engine.max_new_tokens, engine.eos_id = 0.9, 5, 0.05, 8, 2
    engine.repetition_penalty = 1.0
    sampled, greedy = engine._params(1.0, seed=3), engine._params(0.0, seed=3)
    assert (sampled["top_k"], sampled["min_p"], sampled["top_p"]) == (5, 0.05, 0.9)
    assert (greedy["top_k"], greedy["min_p"], greedy["top_p"]) == (0, 0.0, 1.0)


BAD = {("rollout.top_k=-1",): "rollout.top_k: must be >= 0",
       ("rollout.min_p=1.5",): "rollout.min_p: must be in [0, 1)",
       ("model.kind=diffusion", "rollout.top_k=5"): "rollout.top_k: top_k and min_p truncate the causal samplers"}


def test_bad_values_are_one_line_errors():
    for overrides, message in BAD.items():
        try:
            load_config(overrides=list(overrides))
        except ConfigError as err:
            assert str(err).startswith(message) and "\n" not in str(err), overrides
        else:
            raise AssertionError(f"{overrides} loaded")


def test_the_builder_hands_them_to_the_engine(model_and_prompts):
    from rlvr.builder.build import build_engine

    model, tok, *_ = model_and_prompts
    engine = build_engine(load_config(overrides=["rollout.top_k=5", "rollout.min_p=0.1"]), model, tok)
    assert (engine.keywords["top_k"], engine.keywords["min_p"]) == (5, 0.1)
