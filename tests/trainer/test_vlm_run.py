"""A vision-language model through `rlvr train` and `rlvr sft`: images in the rollouts, the
update, evaluation, checkpoints and the export; and the one-line errors before training."""

from __future__ import annotations

import json

import pytest
import torch

from rlvr.cli import main
from rlvr.config import load_config
from rlvr.errors import ConfigError
from rlvr.models.vlm import is_vlm_dir, load_vlm, tiny_vlm

SHORT = ["task.name=count_shapes", "task.heldout_size=4", "rollout.prompts_per_step=2", "rollout.group_size=4",
         "rollout.max_new_tokens=2", "trainer.threads=1", "optim.lr=1e-2",
         "optim.warmup_steps=1", "algo.entropy_coef=0.1"]  # entropy: a gradient whatever the rewards


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("vlm")
    model, processor = tiny_vlm(seed=0, hidden_size=32, intermediate_size=64, num_layers=1, vision_layers=1,
                                num_heads=2)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def warm_dir(vlm_dir, tmp_path_factory):
    """The tiny VLM after a few supervised steps: it answers with a digit, right sometimes."""
    folder = tmp_path_factory.mktemp("warm") / "ws"
    assert main(["sft", f"model.path={vlm_dir}", *SHORT, "sft.steps=6", "sft.batch_size=8", "sft.lr=1e-2",
                 "sft.warmup_steps=1", "--out", str(folder)]) == 0
    return folder


def _weights(folder):
    model, _ = load_vlm(str(folder), folder)
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_train_updates_the_language_model_and_keeps_the_vision_tower(warm_dir, tmp_path):
    vlm_dir = warm_dir
    assert main(["train", f"model.path={vlm_dir}", *SHORT, "trainer.steps=2", "trainer.eval_every=1",
                 f"trainer.out_dir={tmp_path}", "trainer.name=run", "trainer.save_every=2"]) == 0
    run = tmp_path / "run"
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert any("eval/heldout_accuracy" in line for line in lines)
    assert main(["export", str(run), str(tmp_path / "export")]) == 0
    assert is_vlm_dir(tmp_path / "export")
    before, after = _weights(vlm_dir), _weights(tmp_path / "export")
    moved = {n for n in before if not torch.equal(before[n], after[n])}
    assert moved and all("text_model" in n or "lm_head" in n for n in moved)
    assert not any("vision_model" in n for n in moved)


def test_lora_trains_adapters_on_the_language_model_only(warm_dir, tmp_path):
    from rlvr.builder.build import build_model

    config = load_config(None, [f"model.path={warm_dir}", *SHORT, "model.lora.r=2"])
    model, _ = build_model(config)
    trained = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trained and all("lora_" in n and "text_model" in n for n in trained)
    assert main(["train", f"model.path={warm_dir}", *SHORT, "trainer.steps=1", f"trainer.out_dir={tmp_path}",
                 "trainer.name=lora", "model.lora.r=2", "trainer.eval_every=0", "trainer.save_every=1"]) == 0
    assert main(["export", str(tmp_path / "lora"), str(tmp_path / "merged")]) == 0
    assert is_vlm_dir(tmp_path / "merged")


def test_a_trainable_vision_tower_moves(warm_dir, tmp_path):
    vlm_dir = warm_dir
    assert main(["train", f"model.path={vlm_dir}", *SHORT, "trainer.steps=1", f"trainer.out_dir={tmp_path}",
                 "trainer.name=vis", "model.train_vision=true", "trainer.eval_every=0", "trainer.save_every=1"]) == 0
    assert main(["export", str(tmp_path / "vis"), str(tmp_path / "vis_export")]) == 0
    before, after = _weights(vlm_dir), _weights(tmp_path / "vis_export")
    assert any("vision_model" in n and not torch.equal(before[n], after[n]) for n in before)


def test_sft_on_images_writes_a_reloadable_warm_start(vlm_dir, warm_dir):
    model, prompts = load_vlm(str(warm_dir), warm_dir)
    assert prompts.image_token == "<image>" and model.config.model_type == "idefics3"
    before, after = _weights(vlm_dir), _weights(warm_dir)
    assert any(not torch.equal(before[n], after[n]) for n in before)


@pytest.mark.parametrize("extra, message", [
    (["task.name=countdown"],
     r"task: row 0: prompt holds 0 <image> placeholder\(s\) for 0 image\(s\) in field 'images'"),
    (["rollout.repetition_penalty=1.1"], "rollout.repetition_penalty: not supported with a vision-language model"),
    (["trainer.thread_mode=rows", "trainer.threads=2"], "trainer.thread_mode: a vision-language model"),
])
def test_refused_before_training(vlm_dir, tmp_path, extra, message):
    from rlvr.builder.components import build_components
    from rlvr.runtime.process import Runtime
    from rlvr.runtime.rows import RowPool

    base = [a for a in SHORT if a.split("=")[0] not in {e.split("=")[0] for e in extra}]
    config = load_config(None, [f"model.path={vlm_dir}", *base, f"trainer.out_dir={tmp_path}", *extra])
    rows = RowPool(2) if "trainer.threads=2" in extra else None  # what configure_process makes of them
    with pytest.raises(ConfigError, match=message):
        build_components(config, runtime=Runtime(rows=rows))


def test_image_rows_for_a_text_model_are_refused(tmp_path):
    from rlvr.builder.components import build_components

    config = load_config(None, ["model.path=", "model.hidden_size=16", "model.num_layers=1", "model.num_heads=2",
                                "model.intermediate_size=32", *SHORT])
    with pytest.raises(ConfigError, match="task: held-out row 0 has field 'images' but model.path is a text-only"):
        build_components(config)
