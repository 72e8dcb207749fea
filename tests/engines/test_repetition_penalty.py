"""rollout.repetition_penalty: the penalty by hand and against `transformers`' processor, each
sampled token re-derived from the penalised logits, the recorded log-probs unpenalised, the same
samples on every sampling path, greedy untouched, passed to vLLM, and its config checks."""

from __future__ import annotations

import pytest
import torch

from rlvr.config import load_config
from rlvr.engines.torch_ar import generate, repetition_penalized, seen_tokens
from rlvr.errors import ConfigError
from rlvr.noise import gumbel_noise


def test_penalty_by_hand():
    logits = torch.tensor([[2.0, -1.0, 0.5, -3.0, 0.0]])
    seen = torch.tensor([[True, True, False, False, True]])
    # seen: 2 / 2 = 1, -1 * 2 = -2, 0 stays 0; unseen 0.5 and -3 unchanged
    assert repetition_penalized(logits, seen, 2.0).tolist() == [[1.0, -2.0, 0.5, -3.0, 0.0]]
    # below 1 it rewards repeats: 2 / 0.5 = 4, -1 * 0.5 = -0.5
    assert repetition_penalized(logits, seen, 0.5).tolist() == [[4.0, -0.5, 0.5, -3.0, 0.0]]
    assert torch.equal(repetition_penalized(logits, seen, 1.0), logits)


def test_seen_tokens_ignore_padding():
    ids = torch.tensor([[0, 0, 3, 1], [2, 2, 2, 4]])
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    assert seen_tokens(ids, mask, 6).tolist() == [[False, True, False, True, False, False],
                                                 [False, False, True, False, True, False]]


@pytest.mark.parametrize("penalty", [1.3, 0.7])
def test_matches_transformers_processor(penalty):
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

    generator = torch.Generator().manual_seed(0)
    scores = torch.randn(5, 40, generator=generator) * 3
    ids = torch.randint(0, 40, (5, 12), generator=generator)  # repeats within a row included
    expected = RepetitionPenaltyLogitsProcessor(penalty)(ids, scores.clone())
    got = repetition_penalized(scores, seen_tokens(ids, torch.ones_like(ids), 40), penalty)
    assert torch.equal(got, expected)


@pytest.fixture(scope="module")
def padded(model_and_prompts):
    model, tokenizer, prompt, mask, seeds = model_and_prompts
    mask = mask.clone()
    mask[0, :2] = 0  # one left-padded row: its pads are not seen
    return model, tokenizer, prompt, mask, seeds


def _sample(model, tok, prompt, mask, seeds, **options):
    return generate(model, prompt, mask, seeds, max_new_tokens=12, eos_id=tok.eos_token_id,
                    pad_id=tok.pad_token_id, **options)


def test_each_token_is_the_penalised_choice_and_logprobs_are_unpenalised(padded):
    model, tok, prompt, mask, seeds = padded
    penalty, temperature = 1.8, 1.2
    out = _sample(model, tok, prompt, mask, seeds, temperature=temperature, repetition_penalty=penalty, fast=False)
    plain = _sample(model, tok, prompt, mask, seeds, temperature=temperature, fast=False)
    assert not torch.equal(out.completion_ids, plain.completion_ids)  # the penalty changed some sample
    ids = torch.cat([prompt, out.completion_ids], dim=1)
    positions = (torch.cat([mask, out.completion_mask.long()], 1).cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():  # (B, T, V): the distribution of each completion step, by teacher forcing
        logits = model(input_ids=ids, attention_mask=torch.cat([mask, torch.ones_like(out.completion_ids)], 1),
                       position_ids=positions).logits[:, prompt.shape[1] - 1:-1].float()
    live = out.completion_mask.bool()
    for step in range(out.completion_ids.shape[1]):
        seen = seen_tokens(ids[:, :prompt.shape[1] + step], torch.cat([mask, live[:, :step].long()], 1),
                           logits.shape[-1])
        choice = (repetition_penalized(logits[:, step], seen, penalty) / temperature).double()
        expected = (choice + gumbel_noise(seeds, step, logits.shape[-1])).argmax(-1)
        assert torch.equal(out.completion_ids[live[:, step], step], expected[live[:, step]]), step
    logp = (logits / temperature).log_softmax(-1).gather(-1, out.completion_ids[..., None]).squeeze(-1)
    torch.testing.assert_close(out.logprobs[live], logp[live], rtol=0, atol=1e-4)  # what the trainer recomputes


@pytest.mark.parametrize("path", [dict(engine="eager"), dict(engine="cpp")])
def test_every_path_samples_the_same(padded, path):
    model, tok, prompt, mask, seeds = padded
    options = dict(temperature=1.0, repetition_penalty=1.5, top_k=20)
    reference = _sample(model, tok, prompt, mask, seeds, fast=False, **options)
    fast = _sample(model, tok, prompt, mask, seeds, **path, **options)
    assert torch.equal(fast.completion_ids, reference.completion_ids)
    torch.testing.assert_close(fast.logprobs, reference.logprobs, rtol=0, atol=1e-4)


def test_greedy_is_the_models_argmax(model_and_prompts):
    model, tok, prompt, mask, seeds = model_and_prompts
    greedy = _sample(model, tok, prompt, mask, seeds, temperature=0.0, fast=False).completion_ids
    penalised = _sample(model, tok, prompt, mask, seeds, temperature=0.0, repetition_penalty=3.0, fast=False)
    assert torch.equal(penalised.completion_ids, greedy)


def test_vllm_gets_the_penalty():
    from rlvr.engines.vllm import VLLMEngine

    engine = VLLMEngine.__new__(VLLMEngine)  # the sampling parameters only: no vLLM started
    engine._sampling_params = dict
    engine.top_p, engine.top_k, engine.min_p, engine.max_new_tokens, engine.eos_id = 1.0, 0, 0.0, 8, 2
    engine.repetition_penalty = 1.2
    assert engine._params(1.0, seed=3)["repetition_penalty"] == 1.2
    assert engine._params(0.0, seed=3)["repetition_penalty"] == 1.0


def test_config_trl_name_and_builder(model_and_prompts):
    from rlvr.builder.build import build_engine

    for overrides, message in {("rollout.repetition_penalty=0",): "rollout.repetition_penalty: ",
                               ("model.kind=diffusion", "rollout.repetition_penalty=1.2"):
                                   "rollout.repetition_penalty: the causal samplers only"}.items():
        with pytest.raises(ConfigError) as err:
            load_config(overrides=list(overrides))
        assert str(err.value).startswith(message) and "\n" not in str(err.value), overrides
    assert load_config(overrides=["repetition_penalty=1.1"]).rollout.repetition_penalty == 1.1  # TRL's name
    model, tok, *_ = model_and_prompts
    engine = build_engine(load_config(overrides=["rollout.repetition_penalty=1.3"]), model, tok)
    assert engine.keywords["repetition_penalty"] == 1.3
