"""`rollout.engine` without vLLM installed: validation, the rollout-correction default it implies,
the merged LoRA weights a weight-sync engine receives, and the loop's gap metrics."""

from __future__ import annotations

import copy

import pytest
import torch

from rlvr.config import load_config
from rlvr.errors import ConfigError
from rlvr.models.causal_lm import tiny_llama
from rlvr.models.lora import merged_weights
from rlvr.models.tokenizer import char_tokenizer
from rlvr.trainer.proximal import gap_metrics


@pytest.mark.parametrize("overrides, field", [
    (["rollout.engine=sglang"], "rollout.engine"),
    (["rollout.engine=vllm", "model.kind=diffusion"], "rollout.engine"),
    (["rollout.engine=vllm", "rollout.vllm_block_size=20"], "rollout.vllm_block_size"),
    (["rollout.engine=vllm", "rollout.vllm_kv_cache_mb=0"], "rollout.vllm_kv_cache_mb"),
])
def test_bad_engine_settings_are_one_line_errors(overrides, field):
    with pytest.raises(ConfigError, match=field) as err:
        load_config(None, overrides)
    assert "\n" not in str(err.value)


def test_the_vllm_engine_turns_rollout_correction_on_unless_set():
    assert load_config(None, []).algo.rollout_correction is False
    on = load_config(None, ["rollout.engine=vllm"]).algo
    assert on.rollout_correction is True and on.correction_cap is not None and on.correction_mode == "truncate"
    assert load_config(None, ["rollout.engine=vllm", "algo.rollout_correction=false"]).algo.rollout_correction is False


def test_merged_weights_fold_the_adapter_in_like_peft_does():
    pytest.importorskip("peft")
    from rlvr.models.lora import apply_lora

    tokenizer = char_tokenizer()
    base = tiny_llama(len(tokenizer), hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                      max_seq_len=32, seed=0)
    model = apply_lora(copy.deepcopy(base), r=4, alpha=8, dropout=0.0, target_modules="all-linear")
    with torch.no_grad():  # a trained adapter: B is no longer zero
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    ours = dict(merged_weights(model))
    reference = dict(copy.deepcopy(model).merge_and_unload().named_parameters())
    assert ours.keys() == reference.keys() == dict(base.named_parameters()).keys()
    assert max(float((ours[k] - reference[k]).abs().max()) for k in ours) < 1e-6
    assert float((ours["model.layers.0.self_attn.q_proj.weight"]
                  - base.model.layers[0].self_attn.q_proj.weight.detach()).abs().max()) > 1e-3
    assert all(not t.requires_grad for t in ours.values())


def test_gap_metrics_report_kl_and_the_largest_ratio():
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    old = torch.tensor([[-1.0, -2.0, -9.0]])
    roll = torch.tensor([[-1.0, -2.5, 0.0]])  # the padded position must not count
    gap = gap_metrics(old, roll, mask, None)[0]
    k3 = (torch.exp(torch.tensor(0.5)) - 1 - 0.5) / 2
    assert gap["mismatch_kl"] == pytest.approx(float(k3), abs=1e-6)
    assert gap["mismatch_max_ratio"] == pytest.approx(float(torch.exp(torch.tensor(0.5))), abs=1e-6)
    assert gap_metrics(old, old, mask, None)[0]["mismatch_max_ratio"] == 1.0
