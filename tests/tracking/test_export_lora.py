"""`rlvr export` of a LoRA run: the adapter alone (PEFT's format) or merged in float32 then cast,
refused where the cast rounds the update away."""

from __future__ import annotations

import json

import pytest
import torch

from rlvr.cli import main
from rlvr.config import load_config
from rlvr.tracking.export import merge_refusal, update_error

peft = pytest.importorskip("peft")

TINY = ["model.path=", "model.hidden_size=32", "model.num_layers=2", "model.num_heads=2",
        "model.intermediate_size=64", "rollout.prompts_per_step=2", "rollout.group_size=4",
        "rollout.max_new_tokens=8", "task.heldout_size=8", "trainer.eval_every=0", "trainer.thread_mode=ops",
        "trainer.threads=1", "optim.warmup_steps=0", "model.lora.r=4", "model.lora.target_modules=[q_proj,v_proj]"]


def test_update_error_by_hand():
    original = {"w": torch.tensor([1.0, 1.0, 2.0]), "steps": torch.tensor([3])}
    merged = {"w": torch.tensor([1.001, 1.25, 2.0]), "steps": torch.tensor([3])}
    # bfloat16 spacing near 1 is 2^-7 = 0.0078: 1.001 casts to 1.0 (the update 0.001 lost), 1.25 exactly.
    out = update_error(original, merged, torch.bfloat16)
    assert (out["changed"], out["lost"], out["dtype"]) == (2, 1, "bfloat16")
    assert out["update_error"] == pytest.approx(0.001 / (0.001 ** 2 + 0.25 ** 2) ** 0.5, rel=1e-3)  # 0.0040
    assert update_error(original, merged, torch.float32)["update_error"] == 0.0
    tiny = update_error({"w": torch.ones(4)}, {"w": torch.ones(4) + 1e-3}, torch.bfloat16)
    assert (tiny["lost"], tiny["update_error"]) == (4, 1.0)


def test_a_merge_that_keeps_part_of_the_update_is_refused_by_hand():
    # Ten weights of 1.0: bfloat16's spacing there is 2^-7, so a change of 1e-3 rounds back to 1.0
    # and one of 2^-5 survives exactly. Two lost of ten: 20% > 10%, though the L2 error is only 0.016
    # (sqrt(2e-6) / sqrt(2e-6 + 8 * 2^-10)).
    original = {"w": torch.ones(10)}
    merged = {"w": torch.tensor([1.0 + 1e-3] * 2 + [1.0 + 2 ** -5] * 8)}
    record = update_error(original, merged, torch.bfloat16)
    assert (record["changed"], record["lost"]) == (10, 2) and record["update_error"] == pytest.approx(0.0160, abs=1e-4)
    refusal = merge_refusal(record)
    assert refusal.startswith("export: casting the float32 merge to bfloat16 rounds away 2 of the 10 weights")
    assert "(20%;" in refusal and refusal.endswith("--dtype float32, or the adapter alone with --adapter")
    one_lost = update_error(original, {"w": torch.tensor([1.0 + 1e-3] + [1.0 + 2 ** -5] * 9)}, torch.bfloat16)
    assert one_lost["lost"] == 1 and merge_refusal(one_lost) is None  # 10%: at the limit, kept
    assert merge_refusal(update_error(original, merged, torch.float32)) is None


@pytest.fixture
def reward(tmp_path):
    path = tmp_path / "vowels.py"  # varies within a group even when every completion runs to the length limit
    path.write_text("def score(prompt, completion, **example):\n    return sum(c in 'aeiou' for c in completion) / 8\n")
    return f"reward.fn={path}:score"


def _lora_run(tmp_path, reward, *overrides, name="lora"):
    assert main(["train", *TINY, reward, f"trainer.out_dir={tmp_path}", f"trainer.name={name}", *overrides]) == 0
    return tmp_path / name


def _logits(model, seed=0):
    ids = torch.randint(3, 20, (2, 7), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


def test_adapter_export_loads_with_peft_and_merged_float32_matches_it(tmp_path, reward, capsys):
    from transformers import AutoModelForCausalLM

    from rlvr.tracking.export import _base

    run = _lora_run(tmp_path, reward, "trainer.steps=2", "optim.lr=1e-2")
    assert main(["export", str(run), str(tmp_path / "adapter"), "--adapter"]) == 0
    assert "(the adapter alone)" in capsys.readouterr().out
    files = {p.name for p in (tmp_path / "adapter").iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json"} <= files
    assert "model.safetensors" not in files
    adapted = peft.PeftModel.from_pretrained(_base(run), str(tmp_path / "adapter"))

    assert main(["export", str(run), str(tmp_path / "merged")]) == 0
    out = capsys.readouterr().out
    assert "merged in float32, cast to float32" in out and "update error 0.000" in out
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    torch.testing.assert_close(_logits(merged), _logits(adapted), rtol=0, atol=1e-5)
    assert _logits(merged).sub(_logits(_base(run))).abs().max() > 1e-3  # the adapter did move the model
    record = json.loads((tmp_path / "merged" / "rlvr_export.json").read_text())["merge"]
    assert record["changed"] > 0 and record["lost"] == 0


def test_a_bfloat16_cast_that_loses_the_update_is_refused(tmp_path, reward, capsys):
    from transformers import AutoModelForCausalLM

    run = _lora_run(tmp_path, reward, "trainer.steps=1", "optim.lr=1e-5", "model.dtype=bfloat16")
    assert load_config(run / "config.yaml").model.dtype == "bfloat16"
    assert main(["export", str(run), str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert "casting the float32 merge to bfloat16 rounds away" in err and "--dtype float32" in err
    assert "\n" not in err.strip() and not (tmp_path / "hf").exists()
    # two steps at lr 1e-4 keep about two thirds of the update: refused too, not merged half-lost
    part = _lora_run(tmp_path, reward, "trainer.steps=2", "optim.lr=1e-4", "model.dtype=bfloat16", name="part")
    assert main(["export", str(part), str(tmp_path / "part_hf")]) == 2
    lost = capsys.readouterr().err
    share = int(lost.split(" weights the adapter changes (")[1].split("%")[0])
    assert 10 < share < 90 and not (tmp_path / "part_hf").exists(), lost
    assert main(["export", str(run), str(tmp_path / "hf32"), "--dtype", "float32"]) == 0
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "hf32", dtype="auto").dtype == torch.float32
    assert main(["export", str(run), str(tmp_path / "a"), "--adapter"]) == 0


def test_adapter_export_of_a_run_without_adapters_is_refused(tmp_path, reward, capsys):
    assert main(["train", *TINY[:-2], reward, f"trainer.out_dir={tmp_path}", "trainer.name=full",
                 "trainer.steps=1"]) == 0
    assert main(["export", str(tmp_path / "full"), str(tmp_path / "x"), "--adapter"]) == 2
    assert "trained no adapter (model.lora.r=0)" in capsys.readouterr().err


def test_an_exported_adapter_names_its_base_portably_and_loads_after_both_folders_move(tmp_path, reward, capsys):
    from transformers import AutoModelForCausalLM

    from rlvr.models.tiny_archs import build_model_dir
    from rlvr.tracking.export import portable_base

    home = tmp_path / "home"
    base = build_model_dir(home / "base", "qwen2")
    sizes = [o for o in TINY if not o.startswith("model.")] + ["model.lora.r=4",
                                                               "model.lora.target_modules=[q_proj,v_proj]"]
    assert main(["train", *sizes, reward, f"model.path={base}", f"trainer.out_dir={tmp_path}", "trainer.name=q",
                 "trainer.steps=2", "optim.lr=1e-2"]) == 0
    assert main(["export", str(tmp_path / "q"), str(home / "adapter"), "--adapter"]) == 0
    config = json.loads((home / "adapter" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == "../base"  # relative to the adapter folder, not this machine's path
    before = _logits(peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), home / "adapter"))

    moved = (home.rename(tmp_path / "elsewhere")) / "adapter"  # both folders move; the old paths are gone
    named = json.loads((moved / "adapter_config.json").read_text())["base_model_name_or_path"]
    loaded = peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(moved / named), moved)
    torch.testing.assert_close(_logits(loaded), before, rtol=0, atol=0)
    assert _logits(loaded).sub(_logits(AutoModelForCausalLM.from_pretrained(moved / named))).abs().max() > 1e-4

    # a Hub id is written as the id (PEFT's AutoPeftModel fetches it anywhere); a built model names none
    assert portable_base("acme/tiny-model@v1", tmp_path / "out") == ("acme/tiny-model", "v1")
    assert portable_base("", tmp_path / "out") == (None, None)
