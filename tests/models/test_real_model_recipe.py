"""The real-model GSM8K recipe: model.path is required, and its CPU-scale twin runs end to end on a
tiny Qwen2 built locally (bf16, chat template, LoRA, strict math verifier)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from _archs import ROOT, build_model_dir
from safetensors.torch import load_file

from rlvr.builder.components import build_components
from rlvr.cli import main
from rlvr.config import load_config
from rlvr.errors import ConfigError

pytest.importorskip("peft")
REAL, TINY = ROOT / "recipes" / "gsm8k_real_model.yaml", ROOT / "recipes" / "gsm8k_tiny_qwen2.yaml"


@pytest.mark.parametrize("recipe", [REAL, TINY], ids=lambda p: p.name)
def test_a_run_without_model_path_is_a_one_line_error(recipe, tmp_path, capsys):
    assert main(["train", str(recipe), f"trainer.out_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "model.path" in err and "pass model.path=DIR" in err


def test_the_real_recipe_builds_lora_bf16_and_the_strict_verifier(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the recipe's task file is relative to the repository
    source = build_model_dir(tmp_path / "model", "qwen2", dtype=torch.bfloat16)
    config = load_config(REAL, [f"model.path={source}", "rollout.max_new_tokens=16", "task.heldout_size=4",
                                "task.math_file.max_prompt_length=200", "rollout.engine=torch"])  # vLLM: tests/engines
    assert load_config(REAL, [f"model.path={source}"]).rollout.engine == "vllm"
    c = build_components(config)
    assert next(c.learner.model.parameters()).dtype == torch.bfloat16 and c.rollout.task.strict
    trainable = {n for n, p in c.learner.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    # Unchanged, its 512 new tokens do not fit the tiny model's 256 positions: caught at start.
    with pytest.raises(ConfigError, match="rollout.max_new_tokens"):
        build_components(load_config(REAL, [f"model.path={source}", "task.heldout_size=4", "rollout.engine=torch"]))


def test_the_cpu_scale_recipe_runs_on_a_tiny_qwen2(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    source = build_model_dir(tmp_path / "model", "qwen2", dtype=torch.bfloat16)
    assert main(["train", str(TINY), f"model.path={source}", f"trainer.out_dir={tmp_path}", "trainer.name=run",
                 "trainer.threads=1"]) == 0
    run = tmp_path / "run"
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [line for line in lines if "reward/mean" in line]
    assert len(steps) == 3 and all(math.isfinite(line.get("loss/policy", 0.0)) for line in steps)
    adapter = load_file(str(run / "checkpoints" / "step_000003" / "adapter_model.safetensors"))
    assert adapter and all("lora_" in k for k in adapter)  # the adapter only; the base stays as loaded
    assert load_config(run / "config.yaml").task.math_file.strict is True
