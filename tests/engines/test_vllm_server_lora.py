"""Adapter-only LoRA sync to a vLLM server: after each of N optimizer steps on the adapters, the
adapter alone (no merge) is loaded as a vLLM LoRA adapter, and the server's log-probs equal the
trainer's peft model's (vLLM's CPU LoRA path adds the low-rank product in its own order, hence 1e-4)."""

from __future__ import annotations

import pytest
import torch
from _teacher_forced import teacher_forced

from rlvr.models.causal_lm import tiny_llama
from rlvr.models.tokenizer import char_tokenizer

pytestmark = pytest.mark.vllm

STEPS = 3


def test_adapter_pushes_match_the_trainers_peft_model_after_each_step():
    pytest.importorskip("peft")
    from rlvr.engines.server_fleet import ServerOptions
    from rlvr.engines.vllm_server import ServerEngine
    from rlvr.models.lora import apply_lora, base_weights, merged_weights

    tokenizer = char_tokenizer()
    model = tiny_llama(len(tokenizer), hidden_size=64, num_layers=2, num_heads=2, intermediate_size=64,
                       max_seq_len=64, seed=0)
    model = apply_lora(model, r=4, alpha=8, dropout=0.0, target_modules="all-linear")
    engine = ServerEngine(base_weights(model), model.get_base_model().config, max_new_tokens=8,
                          eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id, on_crash="fail",
                          options=ServerOptions(kv_cache_mb=16, max_model_len=64, lora_rank=4),
                          lora_config=model.peft_config["default"])
    try:
        generator = torch.Generator().manual_seed(0)
        ids = torch.randint(3, len(tokenizer), (4, 12), generator=generator)
        mask, seeds = torch.ones_like(ids), torch.arange(4) + 10
        adapters = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        optimizer = torch.optim.Adam([p for _, p in adapters], lr=0.05)
        first = engine(ids, mask, seeds, temperature=1.0)
        for step in range(1, STEPS + 1):
            loss = -model(input_ids=ids).logits.log_softmax(-1)[..., 5].mean()  # push mass onto token 5
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            engine.push_weights([(n, p.detach()) for n, p in adapters], version=step)
            assert engine.adapter == f"rlvr-v{step}" and engine.policy_version == step
            out = engine(ids, mask, seeds, temperature=1.0)
            model.eval()
            assert (out.logprobs - teacher_forced(model, out)).abs().max() < 1e-4
            model.train()
        assert (teacher_forced(model, first) - first.logprobs).abs().max() > 0.05  # the adapters moved
        merged = sum(t.numel() * t.element_size() for _, t in merged_weights(model))
        sent = sum(f.stat().st_size for f in (engine._wire / f"rlvr-v{STEPS}").iterdir())
        assert sum(p.numel() * 4 for _, p in adapters) < sent < merged / 4
        assert sorted(p.name for p in engine._wire.iterdir()) == [f"rlvr-v{STEPS}"]  # older adapters deleted
    finally:
        engine.close()


@pytest.mark.slow
@pytest.mark.parametrize("staleness", [None, 0])
def test_rlvr_train_with_servers_pushes_the_adapter_alone(tmp_path, staleness):
    """3 LoRA steps on a started server, in the synchronous loop and the asynchronous one at η = 0 (whose
    rollout side publishes and pushes the adapter itself): every push moves the adapter only (its bytes,
    not the model's), and the server's log-probs keep up with the trainer's at every step (a batch
    sampled without the newest adapter would be far off)."""
    pytest.importorskip("peft")
    import json

    from rlvr.cli import main

    reward = tmp_path / "length_reward.py"
    reward.write_text("def score(prompt, completion, **example):\n    return 1.0 / (1 + len(completion))\n")
    args = ["train", "model.path=", "model.hidden_size=64", "model.num_layers=2", "model.num_heads=2",
            "model.intermediate_size=64", "rollout.prompts_per_step=2", "rollout.group_size=4",
            "rollout.max_new_tokens=8", "task.heldout_size=8", "trainer.eval_every=0", "trainer.steps=3",
            "optim.lr=3e-2", "optim.warmup_steps=1", "model.lora.r=4", "model.lora.target_modules=all-linear",
            "rollout.engine=vllm_server", "rollout.vllm_kv_cache_mb=16", "rollout.vllm_max_model_len=64",
            "rollout.server_on_crash=fail", f"reward.fn={reward}:score", "algo.dynamic_sampling=false",
            f"trainer.out_dir={tmp_path}", "trainer.name=run"]
    if staleness is not None:  # the rollout side publishes and pushes the adapter alone
        args += [f"trainer.max_staleness={staleness}", "trainer.threads=1"]
    assert main(args) == 0
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    if staleness is not None:
        steps = [m for m in lines if m.get("step", 0) > 0 and "async/staleness" in m]
        assert len(steps) == 3 and max(m["async/staleness"] for m in steps) == 0
        assert all(m["rollout/mismatch_kl"] < 1e-6 for m in steps)
        return
    steps = [m for m in lines if m.get("step", 0) > 0 and "time/weight_sync_s" in m]
    assert len(steps) == 3
    # hidden 64, 2 layers, rank 4, all-linear: q,k,v,o (64x64 each) and gate,up,down (64x64) adapters, fp32
    adapter_mb = 2 * 7 * (4 * 64 + 64 * 4) * 4 / 2**20
    for m in steps:
        assert m["perf/weight_sync_mb"] == pytest.approx(adapter_mb)
        assert 0 <= m["rollout/mismatch_kl"] < 1e-6 and m["rollout/mismatch_max_ratio"] < 1.001
        assert m["actor/grad_norm"] > 0
