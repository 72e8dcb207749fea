"""`rlvr export RUN DIR`: transformers alone reloads the model and decodes what rlvr decodes."""

from __future__ import annotations

import json

import pytest
import torch
from fake_runs import make_run
from test_cli_runs import run_cli
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlvr.codec import decode_completions, encode_prompts
from rlvr.engines.torch_ar import generate
from rlvr.models.causal_lm import tiny_llama
from rlvr.models.tokenizer import char_tokenizer
from rlvr.trainer.checkpoint import save_checkpoint

PROMPTS = ["Numbers: 3 4 5\nTarget: 12\n", "Numbers: 9 1\nTarget: 8\n", "7+", "Numbers: 2 2 8 6\nTarget: 24\n"]


@pytest.fixture
def trained(tmp_path):
    """A run with two checkpoints; the newest holds a model with confident (well-separated) logits."""
    run = make_run(tmp_path, "grpo_s0", seed=0, steps=4)
    tokenizer = char_tokenizer()
    model = tiny_llama(len(tokenizer), hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                       max_seq_len=64, seed=0)
    save_checkpoint(run / "checkpoints", 2, model, tokenizer, {"optimizer": {}}, keep_last=2)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():  # stand-in for training: large weights make greedy argmax robust to float noise
        for name, param in model.named_parameters():
            if "norm" not in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.25)
    save_checkpoint(run / "checkpoints", 4, model, tokenizer, {"optimizer": {}}, keep_last=2)
    return run, model, tokenizer


def test_exported_model_greedy_matches_rlvr_sampler(trained, tmp_path, capsys):
    run, model, tokenizer = trained
    out = tmp_path / "hf_model"
    assert run_cli(["export", str(run), str(out)]) == 0
    assert "step_000004" in capsys.readouterr().out
    assert not (out / "trainer_state.pt").exists()
    assert json.loads((out / "rlvr_export.json").read_text())["checkpoint"] == "step_000004"

    # rlvr side: the in-memory model through rlvr's own sampler, temperature 0.
    ids, mask = encode_prompts(tokenizer, PROMPTS)
    ours = decode_completions(tokenizer, generate(model, ids, mask, torch.zeros(len(PROMPTS), dtype=torch.long),
                                                  max_new_tokens=12, eos_id=tokenizer.eos_token_id,
                                                  pad_id=tokenizer.pad_token_id, temperature=0.0))
    assert len(set(ours)) > 1 and any(ours)

    # transformers side: only the exported folder and public transformers API.
    hf_tok = AutoTokenizer.from_pretrained(out)
    hf_model = AutoModelForCausalLM.from_pretrained(out)
    assert type(hf_model).__name__ == "LlamaForCausalLM" and hf_tok.padding_side == "left"
    batch = hf_tok([hf_tok.bos_token + p for p in PROMPTS], padding=True, add_special_tokens=False,
                   return_tensors="pt")
    with torch.no_grad():
        generated = hf_model.generate(**batch, max_new_tokens=12, do_sample=False, eos_token_id=hf_tok.eos_token_id,
                                      pad_token_id=hf_tok.pad_token_id)
    theirs = hf_tok.batch_decode(generated[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)
    assert theirs == ours, (theirs, ours)


def test_export_refuses_to_overwrite_and_names_missing_step(trained, tmp_path, capsys):
    run, _, _ = trained
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "file").write_text("x")
    assert run_cli(["export", str(run), str(tmp_path / "taken")]) == 2
    assert "not empty" in capsys.readouterr().out
    assert run_cli(["export", str(run), str(tmp_path / "e"), "--step", "3"]) == 2
    assert "available: step_000002, step_000004" in capsys.readouterr().out
    assert run_cli(["export", str(run), str(tmp_path / "taken"), "--step", "2", "--force"]) == 2
    assert "not made by rlvr" in capsys.readouterr().out  # --force replaces only an export rlvr made
    assert (tmp_path / "taken" / "file").read_text() == "x"
    assert run_cli(["export", str(run), str(tmp_path / "e"), "--step", "2"]) == 0
    assert run_cli(["export", str(run), str(tmp_path / "e"), "--step", "4", "--force"]) == 0
    assert json.loads((tmp_path / "e" / "rlvr_export.json").read_text())["checkpoint"] == "step_000004"
