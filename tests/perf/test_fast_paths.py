"""Equivalence tests for the speed work: every fast path against the plain one.

The fast paths (`rlvr.kernels`, used by `rollout.torch_ar.generate` and `CausalPolicy`)
must give the same samples, log-probs and gradients as the straightforward `transformers`
forward, within float tolerance. No timings here: speed is measured by bench/.
"""

import functools

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from rlvr.batch import TrainBatch
from rlvr.codec import encode_prompts
from rlvr.engines import torch_ar
from rlvr.engines.torch_ar import generate
from rlvr.kernels.decoder import Decoder
from rlvr.kernels.weights import supports
from rlvr.models.causal_lm import load_causal_lm
from rlvr.models.policy import CausalPolicy

PROMPTS = ["3 5 2>13:", "1 2 3>6:", "9 9 9>729:", "4 4>16:", "7>7:"]


def _config_kwargs(vocab):
    return {"vocab_size": vocab, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
            "max_position_embeddings": 64, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}


def _gqa_llama(vocab):
    torch.manual_seed(1)
    return LlamaForCausalLM(LlamaConfig(num_attention_heads=4, num_key_value_heads=2, attention_bias=True,
                                        tie_word_embeddings=False, **_config_kwargs(vocab)))


def _qwen2(vocab):
    torch.manual_seed(2)
    return Qwen2ForCausalLM(Qwen2Config(num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True,
                                        **_config_kwargs(vocab)))


@pytest.fixture(params=["tiny", "gqa_bias", "qwen2", "warmstart"])
def model(request, tiny_model, tokenizer):
    if request.param == "tiny":
        return tiny_model
    if request.param == "gqa_bias":
        return _gqa_llama(len(tokenizer))
    if request.param == "qwen2":
        return _qwen2(len(tokenizer))
    return load_causal_lm("rlvr:countdown-warmstart", seed=0)[0]


def _batch(tokenizer, group=4):
    prompts = [p for p in PROMPTS for _ in range(group)]  # groups of identical prompts, ragged lengths
    ids, mask = encode_prompts(tokenizer, prompts)
    return ids, mask, torch.arange(len(prompts)) * 7 + 3


def _both(model, tokenizer, ids, mask, seeds, **kw):
    kw = {"max_new_tokens": 12, "eos_id": tokenizer.eos_token_id, "pad_id": tokenizer.pad_token_id, **kw}
    return generate(model, ids, mask, seeds, fast=False, **kw), generate(model, ids, mask, seeds, **kw)


def _assert_same_rollouts(ref, fast):
    assert torch.equal(ref.completion_ids, fast.completion_ids)
    assert torch.equal(ref.completion_mask, fast.completion_mask)
    assert torch.equal(ref.truncated, fast.truncated)
    assert torch.allclose(ref.logprobs, fast.logprobs, atol=2e-5)


def test_supported_models_take_the_fast_path(model):
    assert supports(model)


@pytest.mark.parametrize("kw", [{}, {"temperature": 0.7, "top_p": 0.9}, {"temperature": 0.0}])
def test_fast_sampler_gives_the_same_samples(model, tokenizer, kw):
    ids, mask, seeds = _batch(tokenizer)
    _assert_same_rollouts(*_both(model, tokenizer, ids, mask, seeds, **kw))


def test_same_samples_with_and_without_dropping_finished_rows(model, tokenizer, monkeypatch):
    ids, mask, seeds = _batch(tokenizer, group=8)
    outs = []
    for fraction in (0.0, 2.0):  # compact as soon as one row finishes / never
        monkeypatch.setattr(torch_ar, "COMPACT_FRACTION", fraction)
        outs.append(generate(model, ids, mask, seeds, max_new_tokens=16, eos_id=tokenizer.eos_token_id,
                             pad_id=tokenizer.pad_token_id))
    _assert_same_rollouts(*outs)


def test_long_generation_crosses_the_span_padding(tokenizer, tiny_model):
    # 40 new tokens cross several 16-column attention spans; the tiny random model rarely stops.
    ids, mask, seeds = _batch(tokenizer, group=2)
    _assert_same_rollouts(*_both(tiny_model, tokenizer, ids, mask, seeds, max_new_tokens=40))


def test_pooled_cache_is_reused_safely(tiny_model, tokenizer):
    ids, mask, seeds = _batch(tokenizer)
    kw = {"max_new_tokens": 12, "eos_id": tokenizer.eos_token_id, "pad_id": tokenizer.pad_token_id}
    first = generate(tiny_model, ids, mask, seeds, **kw)
    small = generate(tiny_model, ids[:3], mask[:3], seeds[:3], **kw)   # reuses (part of) the pool
    again = generate(tiny_model, ids, mask, seeds, **kw)
    _assert_same_rollouts(first, again)
    # A decoder still open in this thread makes the next one allocate its own buffers.
    held = Decoder(tiny_model, ids, mask, 12)
    nested = generate(tiny_model, ids[:3], mask[:3], seeds[:3], **kw)
    held.close()
    _assert_same_rollouts(small, nested)


def _loss_and_grads(policy, model, out, **kw):
    model.zero_grad()
    logp, entropy = policy.token_logprobs(out.prompt_ids, out.prompt_mask, out.completion_ids, with_entropy=True,
                                          **kw)
    mask = out.completion_mask
    # A loss touching log-probs and entropy with row-dependent weights, so every path gets gradient.
    weights = torch.linspace(-1.0, 1.0, mask.shape[0])[:, None]
    ((logp * weights * mask).sum() + 0.1 * (entropy * mask).sum()).backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return logp * mask, entropy * mask, grads


@pytest.mark.parametrize("packed", [False, True])
def test_fast_logprobs_and_gradients_match_the_plain_forward(model, tokenizer, packed):
    ids, mask, seeds = _batch(tokenizer)
    out = generate(model, ids, mask, seeds, max_new_tokens=12, eos_id=tokenizer.eos_token_id,
                   pad_id=tokenizer.pad_token_id, temperature=0.8)
    kw = {"completion_mask": out.completion_mask} if packed else {}
    ref_logp, ref_ent, ref_grads = _loss_and_grads(CausalPolicy(model, temperature=0.8, fast=False), model, out)
    logp, ent, grads = _loss_and_grads(CausalPolicy(model, temperature=0.8), model, out, **kw)
    assert torch.allclose(logp, ref_logp, atol=2e-5)
    assert torch.allclose(ent, ref_ent, atol=2e-5)
    assert torch.allclose(logp, out.logprobs, atol=2e-5)  # and the sampler's behaviour log-probs
    assert grads.keys() == ref_grads.keys()
    for name, g in grads.items():  # float32 sums in a different order: relative to the tensor's scale
        scale = ref_grads[name].abs().max()
        assert (g - ref_grads[name]).abs().max() <= 1e-4 * scale + 1e-7, name


def test_packed_logprobs_are_zero_after_the_mask_and_estimator_inputs_are_ignored(tiny_model, tokenizer):
    ids, mask, seeds = _batch(tokenizer)
    out = generate(tiny_model, ids, mask, seeds, max_new_tokens=12, eos_id=tokenizer.eos_token_id,
                   pad_id=tokenizer.pad_token_id)
    policy = CausalPolicy(tiny_model)
    cmask = out.completion_mask.clone()
    cmask[0] = 0.0                      # a row dropped entirely (e.g. overlong filtering)
    with torch.no_grad():
        batch = TrainBatch(out.prompt_ids, out.prompt_mask, out.completion_ids, cmask,
                           advantages=torch.ones_like(cmask), trace=torch.zeros_like(out.completion_ids))
        logp, _ = policy.batch_logprobs(batch)
        full, _ = policy.token_logprobs(out.prompt_ids, out.prompt_mask, out.completion_ids)
    assert torch.all(logp[0] == 0)
    assert torch.all(logp[cmask == 0] == 0)
    assert torch.allclose(logp * cmask, full * cmask, atol=1e-6)


def test_prefix_sharing_does_not_depend_on_row_order(tiny_model, tokenizer):
    ids, mask, seeds = _batch(tokenizer)
    out = generate(tiny_model, ids, mask, seeds, max_new_tokens=12, eos_id=tokenizer.eos_token_id,
                   pad_id=tokenizer.pad_token_id)
    perm = torch.randperm(len(ids), generator=torch.Generator().manual_seed(0))
    policy = CausalPolicy(tiny_model)
    with torch.no_grad():
        logp, _ = policy.token_logprobs(out.prompt_ids, out.prompt_mask, out.completion_ids)
        permuted, _ = policy.token_logprobs(out.prompt_ids[perm], out.prompt_mask[perm], out.completion_ids[perm])
    assert torch.allclose(permuted, logp[perm], atol=1e-6)
    again = generate(tiny_model, ids[perm], mask[perm], seeds[perm], max_new_tokens=12,
                     eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id)
    assert torch.equal(again.completion_ids[:, :out.completion_ids.shape[1]], out.completion_ids[perm])


def test_unsupported_models_fall_back_to_the_plain_forward(tokenizer):
    torch.manual_seed(3)
    cfg = LlamaConfig(num_attention_heads=2, rope_parameters={"rope_type": "linear", "factor": 2.0,
                                                              "rope_theta": 10000.0}, **_config_kwargs(len(tokenizer)))
    model = LlamaForCausalLM(cfg)
    assert not supports(model)
    ids, mask, seeds = _batch(tokenizer, group=1)
    _assert_same_rollouts(*_both(model, tokenizer, ids, mask, seeds))


def test_chunked_head_logprobs_match_the_plain_computation():
    torch.manual_seed(4)
    hidden = torch.randn(37, 16, requires_grad=True)
    weight = torch.randn(300, 16, requires_grad=True)
    tokens = torch.randint(0, 300, (37,))
    from rlvr.models.policy import chunked_head_logprobs, token_entropy

    def head(h):
        return torch.nn.functional.linear(h, weight)
    grads = []
    for chunked in (False, True):
        hidden.grad = weight.grad = None
        if chunked:
            logp, ent = chunked_head_logprobs(head, hidden, tokens, temperature=0.7, with_entropy=True, chunk_rows=5)
        else:
            logits = head(hidden) / 0.7
            logp, ent = logits.log_softmax(-1).gather(-1, tokens[:, None])[:, 0], token_entropy(logits)
        (logp * torch.linspace(-1, 1, 37)).sum().add(0.3 * ent.sum()).backward()
        grads.append((logp.detach(), ent.detach(), hidden.grad.clone(), weight.grad.clone()))
    for plain, chunked in zip(*grads):
        assert torch.allclose(plain, chunked, atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        logp, ent = chunked_head_logprobs(head, hidden, tokens, temperature=0.7, chunk_rows=5)
    assert ent is None and torch.allclose(logp, grads[0][0], atol=1e-5)


def test_policy_uses_the_chunked_head_past_the_threshold_with_the_same_gradients(model, tokenizer, monkeypatch):
    from rlvr.models import policy as policy_module
    ids, mask, seeds = _batch(tokenizer)
    out = generate(model, ids, mask, seeds, max_new_tokens=12, eos_id=tokenizer.eos_token_id,
                   pad_id=tokenizer.pad_token_id, temperature=0.8)
    kw = {"completion_mask": out.completion_mask}
    ref = _loss_and_grads(CausalPolicy(model, temperature=0.8), model, out, **kw)
    monkeypatch.setattr(policy_module, "CHUNK_ELEMENTS", 4 * len(tokenizer) * 7)  # 7-row chunks
    calls = []
    real = policy_module.chunked_head_logprobs
    monkeypatch.setattr(policy_module, "chunked_head_logprobs", lambda *a, **k: calls.append(1) or real(*a, **k))
    logp, ent, grads = _loss_and_grads(CausalPolicy(model, temperature=0.8), model, out, **kw)
    assert calls
    assert torch.allclose(logp, ref[0], atol=1e-6) and torch.allclose(ent, ref[1], atol=1e-6)
    for name, g in grads.items():
        assert (g - ref[2][name]).abs().max() <= 1e-5 * ref[2][name].abs().max() + 1e-7, name


def test_on_policy_step_reuses_the_training_forward_for_old_logprobs(tiny_model, tokenizer, monkeypatch):
    """With one epoch and one minibatch the trainer skips the old-log-prob forward
    (old = detached current log-probs, ratio 1) and gets the same gradients as recomputing them."""
    from rlvr.algos.aggregate import AGGREGATIONS
    from rlvr.algos.objectives import ppo_clip
    from rlvr.batch import TrainBatch
    from rlvr.trainer import logit_stats, sync
    from rlvr.trainer.logit_stats import no_grad_outputs
    from rlvr.trainer.step import LossSpec, micro_batch_loss

    ids, mask, seeds = _batch(tokenizer)
    out = generate(tiny_model, ids, mask, seeds, max_new_tokens=12, eos_id=tokenizer.eos_token_id,
                   pad_id=tokenizer.pad_token_id)
    adv = torch.randn(len(ids), 1, generator=torch.Generator().manual_seed(0)) * out.completion_mask
    policy = CausalPolicy(tiny_model)
    spec = LossSpec(objective=functools.partial(ppo_clip, clip_low=0.2, clip_high=0.2),
                    aggregation=AGGREGATIONS["seq_mean_token_mean"], kl_estimator=None, entropy_coef=0.01)
    grads = []
    for reuse in (True, False):
        batch = TrainBatch(ids, mask, out.completion_ids, out.completion_mask, adv, rollout_logp=out.logprobs)
        if not reuse:
            batch.old_logp = no_grad_outputs(policy, batch, len(batch))["logp"]
        tiny_model.zero_grad()
        loss, _ = micro_batch_loss(policy, batch, spec, num_tokens=float(out.completion_mask.sum()),
                                   num_seqs=float(len(batch)))
        loss.backward()
        grads.append(torch.cat([p.grad.flatten() for p in tiny_model.parameters() if p.grad is not None]))
    assert (grads[0] - grads[1]).norm() <= 1e-6 * grads[1].norm()

    # And rl_step makes no separate no-grad log-prob pass when on-policy.
    from rlvr.builder.components import build_components
    from rlvr.config import load_config
    c = build_components(load_config(None, ["model.path=", "rollout.prompts_per_step=2",
                                                 "rollout.group_size=4", "rollout.max_new_tokens=6"]))
    calls = []
    monkeypatch.setattr(logit_stats, "no_grad_outputs", lambda *a, **k: calls.append(1))
    sync.rl_step(c, 1)
    assert calls == []
