"""The vLLM rollout engine (`rollout.engine=vllm`) against the trainer's own log-probs, on a tiny
Llama built locally (fp32, so vLLM and transformers agree to float rounding).

One engine serves the module (starting one costs ~20 s); the weight-push test puts the original
weights back when it is done. block_size=32 and prompts longer than one block put full blocks
in the prefix cache, so a call after a push that reused them would show as wrong log-probs."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from rlvr.cli import main
from rlvr.models.causal_lm import tiny_llama
from rlvr.models.tokenizer import char_tokenizer

pytestmark = pytest.mark.vllm

MAX_NEW = 8
PROMPT_LEN = 40  # > one 32-token block: the prefix cache keeps a full block of every prompt


@pytest.fixture(scope="module")
def setup():
    from rlvr.engines.vllm import VLLMEngine

    tokenizer = char_tokenizer()
    model = tiny_llama(len(tokenizer), hidden_size=64, num_layers=2, num_heads=2, intermediate_size=64,
                       max_seq_len=64, seed=0).eval()
    engine = VLLMEngine(list(model.named_parameters()), model.config, max_new_tokens=MAX_NEW,
                        eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id, kv_cache_mb=16,
                        block_size=32, max_model_len=64)
    yield model, tokenizer, engine
    engine.close()


def _prompts(tokenizer, rows: int, seed: int = 0):
    """Left-padded prompts of random characters, the first row shorter."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, len(tokenizer), (rows, PROMPT_LEN), generator=generator)
    mask = torch.ones_like(ids)
    ids[0, :5], mask[0, :5] = tokenizer.pad_token_id, 0
    return ids, mask


@torch.no_grad()
def _teacher_forced(model, out, temperature: float = 1.0) -> torch.Tensor:
    """log-softmax(logits / T) of each completion token, from a plain transformers forward (B, Tc)."""
    rows = []
    for i in range(len(out)):
        prompt = out.prompt_ids[i][out.prompt_mask[i].bool()]
        n = int(out.completion_mask[i].sum())
        ids = torch.cat([prompt, out.completion_ids[i, :n]])[None]
        logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1].float() / temperature
        logp = logits.log_softmax(-1).gather(-1, ids[0, len(prompt):, None]).squeeze(-1)
        rows.append(torch.cat([logp, torch.zeros(out.completion_ids.shape[1] - n)]))
    return torch.stack(rows)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_tokens_and_logprobs_match_the_model_teacher_forced(setup, temperature):
    model, tokenizer, engine = setup
    ids, mask = _prompts(tokenizer, 6)
    seeds = torch.arange(6) + 100
    out = engine(ids, mask, seeds, temperature=temperature)
    assert out.completion_ids.shape[0] == 6 and out.logprobs.shape == out.completion_ids.shape
    lengths = out.completion_mask.sum(-1).long()
    for i, n in enumerate(lengths.tolist()):  # EOS ends a sample and stays in it; length only if it did not
        ended = out.completion_ids[i, n - 1] == tokenizer.eos_token_id
        assert bool(ended) != bool(out.truncated[i]) or n == MAX_NEW
        assert (out.completion_ids[i, n:] == tokenizer.pad_token_id).all()
    assert (out.logprobs * (1 - out.completion_mask)).abs().max() == 0
    assert (out.logprobs - _teacher_forced(model, out, temperature)).abs().max() < 2e-5
    again = engine(ids, mask, seeds, temperature=temperature)
    assert torch.equal(again.completion_ids, out.completion_ids)  # a row's seed fixes its sample
    other = engine(ids, mask, seeds + 1000, temperature=temperature)
    assert not torch.equal(other.completion_ids, out.completion_ids)


def test_a_group_as_one_request_samples_what_its_rows_one_by_one_do(setup, monkeypatch):
    """n = G with seed s samples completion i with seed s + i: the rows' own seeds."""
    from rlvr.engines import vllm as engines_vllm

    model, tokenizer, engine = setup
    ids, mask = _prompts(tokenizer, 2)
    group = 4
    ids, mask = ids.repeat_interleave(group, 0), mask.repeat_interleave(group, 0)
    seeds = torch.arange(8) + 100
    grouped = engine(ids, mask, seeds, temperature=1.0)
    assert engines_vllm.group_runs([r.tolist() for r in ids], seeds.tolist(), [1.0] * 8) == [(0, 4), (4, 4)]
    monkeypatch.setattr(engines_vllm, "group_runs", lambda prompts, *_: [(i, 1) for i in range(len(prompts))])
    alone = engine(ids, mask, seeds, temperature=1.0)
    assert torch.equal(grouped.completion_ids, alone.completion_ids)
    assert torch.equal(grouped.logprobs, alone.logprobs)
    assert len({tuple(r.tolist()) for r in grouped.completion_ids[:group]}) > 1  # the copies differ


def test_greedy_matches_the_torch_sampler(setup):
    from rlvr.engines.torch_ar import generate

    model, tokenizer, engine = setup
    ids, mask = _prompts(tokenizer, 4, seed=1)
    out = engine(ids, mask, torch.zeros(4, dtype=torch.long), temperature=0.0)
    ref = generate(model, ids, mask, torch.zeros(4, dtype=torch.long), max_new_tokens=MAX_NEW,
                   eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id, temperature=0.0, engine="eager")
    assert torch.equal(out.completion_ids, ref.completion_ids)
    assert torch.equal(out.completion_mask, ref.completion_mask)
    assert (out.logprobs - ref.logprobs).abs().max() < 2e-5


def test_after_a_push_logprobs_match_the_new_weights_and_differ_before(setup):
    model, tokenizer, engine = setup
    ids, mask = _prompts(tokenizer, 6, seed=2)
    seeds = torch.arange(6)
    engine(ids, mask, seeds, temperature=1.0)  # the prompts' first blocks now sit in the prefix cache
    updated = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in updated.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=generator))
    stale = engine(ids, mask, seeds, temperature=1.0)
    assert (stale.logprobs - _teacher_forced(updated, stale)).abs().max() > 0.05  # not yet pushed
    try:
        engine.push_weights(updated.named_parameters(), version=7)
        assert engine.policy_version == 7
        fresh = engine(ids, mask, seeds, temperature=1.0)
        assert (fresh.logprobs - _teacher_forced(updated, fresh)).abs().max() < 2e-5
    finally:
        engine.push_weights(model.named_parameters(), version=0)
    back = engine(ids, mask, seeds, temperature=1.0)
    assert (back.logprobs - _teacher_forced(model, back)).abs().max() < 2e-5


def test_rlvr_train_with_the_vllm_engine_logs_sync_and_mismatch(tmp_path):
    """3 steps with LoRA (the push sends merged weights): the engine keeps up with the adapter, so the
    trainer's and the sampler's log-probs agree at every step, and the rollout correction is on."""
    reward = tmp_path / "length_reward.py"
    reward.write_text("def score(prompt, completion, **example):\n    return 1.0 / (1 + len(completion))\n")
    args = ["train", "model.path=", "model.hidden_size=64", "model.num_layers=2", "model.num_heads=2",
            "model.intermediate_size=64", "rollout.prompts_per_step=2", "rollout.group_size=4",
            "rollout.max_new_tokens=8", "task.heldout_size=8", "trainer.eval_every=0", "trainer.steps=3",
            "optim.lr=3e-2", "optim.warmup_steps=1", "model.lora.r=4", "model.lora.target_modules=all-linear",
            "rollout.engine=vllm", "rollout.vllm_kv_cache_mb=16", "rollout.vllm_block_size=32",
            "rollout.vllm_max_model_len=64", f"reward.fn={reward}:score", "algo.dynamic_sampling=false",
            f"trainer.out_dir={tmp_path}", "trainer.name=run"]
    assert main(args) == 0
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in lines if m.get("step", 0) > 0 and "time/weight_sync_s" in m]
    assert len(steps) == 3
    config = (tmp_path / "run" / "config.yaml").read_text()
    assert "rollout_correction: true" in config
    for m in steps:
        assert m["time/weight_sync_s"] > 0
        assert 0 <= m["rollout/mismatch_kl"] < 1e-6 and m["rollout/mismatch_max_ratio"] < 1.001
        assert m["actor/grad_norm"] > 0
