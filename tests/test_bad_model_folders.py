"""Model folders rlvr did not write, damaged or of the wrong kind, named where a user names them: a reward
model in `reward.fn`, a judge (`judge:DIR`), a block-diffusion checkpoint in `model.path`, a LoRA run's
adapter under `rlvr eval` / `rlvr export`. Each is one line naming the file and the fix, exit 2, no
traceback, and the folder itself is left as it was.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from _reward_models import save_tiny_reward_model

from rlvr.cli import main

TINY = ["model.path=", "model.hidden_size=16", "model.num_layers=1", "model.num_heads=2",
        "model.intermediate_size=32", "rollout.prompts_per_step=2", "rollout.group_size=2",
        "rollout.max_new_tokens=4", "task.heldout_size=2", "trainer.threads=1", "trainer.steps=1",
        "trainer.eval_every=0", "trainer.save_every=1"]
BLOCK_ASSET = Path(__file__).resolve().parents[1] / "src" / "rlvr" / "assets" / "countdown-dllm-block-warmstart"


def _error(capsys, argv: list[str]) -> str:
    capsys.readouterr()
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    line = err.splitlines()[-1] if err else ""
    assert line.startswith("error: ") and err.count("error: ") == 1 and "Traceback" not in out + err, err
    return line


def _digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def _edit_json(path: Path, **change) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **change}))


@pytest.fixture(scope="module")
def reward_model(tmp_path_factory):
    return save_tiny_reward_model(tmp_path_factory.mktemp("rm") / "good")


def _causal_weights_without_architectures(d: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = json.loads((d / "config.json").read_text())
    model = LlamaForCausalLM(LlamaConfig(**{k: v for k, v in config.items() if k in (
        "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
        "intermediate_size", "max_position_embeddings", "pad_token_id")}))
    model.save_pretrained(d)
    config.pop("architectures", None)
    (d / "config.json").write_text(json.dumps(config))


def _two_label_head(d: Path) -> None:
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(d, num_labels=2, ignore_mismatched_sizes=True)
    model.save_pretrained(d)  # a default 2-label head writes no id2label: only the weights' shape tells


DAMAGES = {  # name -> (damage, what the line says)
    "no_config": (lambda d: (d / "config.json").unlink(), "has no config.json"),
    "junk_config": (lambda d: (d / "config.json").write_text("{not json"), "config.json is not valid JSON"),
    "list_config": (lambda d: (d / "config.json").write_text("[1, 2]"), "config.json holds a JSON list"),
    "no_weights": (lambda d: (d / "model.safetensors").unlink(), "has no weights (none of model.safetensors"),
    "cut_weights": (lambda d: (d / "model.safetensors").write_bytes((d / "model.safetensors").read_bytes()[:-64]),
                    "model.safetensors is damaged or cut short"),
    "no_tokenizer": (lambda d: [(d / n).unlink() for n in ("tokenizer.json", "tokenizer_config.json")],
                     "has no tokenizer"),
    # (a config.json naming a causal LM was refused already: tests/rewards/test_reward_model.py)
    "causal_weights": (_causal_weights_without_architectures, "lack score.weight, which would start at random"),
    "two_labels": (_two_label_head, "hold score.weight in another shape"),
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_reward_model_folder_is_one_line(damage, reward_model, tmp_path, capsys):
    """Before: JSONDecodeError / AttributeError / SafetensorError tracebacks, "expected FILE.py:NAME" for a
    folder without config.json, and a causal LM's weights or a 2-label head scored through a random head."""
    folder = tmp_path / "rm"
    shutil.copytree(reward_model, folder)
    make, says = DAMAGES[damage]
    make(folder)
    before = _digests(folder)
    err = _error(capsys, ["train", *TINY, f"trainer.out_dir={tmp_path / 'runs'}", f"reward.fn={folder}"])
    assert err.startswith("error: reward model: ") and says in err, err
    assert _digests(folder) == before


def test_a_sequence_classifier_named_as_a_judge_is_one_line(reward_model, tmp_path, capsys):
    """Before: loaded as a causal LM with a random LM head, and its verdicts scored."""
    err = _error(capsys, ["train", *TINY, f"trainer.out_dir={tmp_path}", f"reward.fn=judge:{reward_model}"])
    assert "reward.fn: judge '" in err and "holds a LlamaForSequenceClassification, which writes no text" in err
    assert "name it without judge:" in err, err


# ---------------------------------------------------------------------------------- block diffusion

BLOCK = ["model.kind=diffusion", "rollout.prompts_per_step=2", "rollout.group_size=2", "task.heldout_size=2",
         "trainer.threads=1", "trainer.steps=1", "trainer.eval_every=0", "trainer.save_every=0"]


@pytest.mark.parametrize(("block_size", "overrides", "says"), [
    ("eight", ["rollout.max_new_tokens=8"], "config.json names block_size 'eight'; a block size is a whole number"),
    (8, ["rollout.max_new_tokens=8", "rollout.igpo=true"],
     "rollout.igpo: inpaints a bidirectional model's whole window; a block model (blocks of 8)"),
    (8, ["rollout.max_new_tokens=12"], "model.block_size: must divide rollout.max_new_tokens (12)"),
    (8, ["rollout.max_new_tokens=8", "rollout.block_length=4"], "rollout.block_length: a block model samples"),
])
def test_a_block_checkpoint_meets_the_block_checks(block_size, overrides, says, tmp_path, capsys):
    """model.block_size left 0 once skipped the block checks for a checkpoint that names its own size:
    IGPO crashed in the block sampler (TypeError), a window of 12 or blocks of 4 were ValueErrors."""
    folder = tmp_path / "block"
    shutil.copytree(BLOCK_ASSET, folder)
    _edit_json(folder / "config.json", block_size=block_size)
    err = _error(capsys, ["train", *BLOCK, *overrides, f"model.path={folder}", f"trainer.out_dir={tmp_path}"])
    assert says in err, err
    if block_size != "eight":
        assert err.endswith("(model.path's config.json names blocks of 8)"), err


# ---------------------------------------------------------------------------------- LoRA adapters

@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    pytest.importorskip("peft")
    root = tmp_path_factory.mktemp("lora")
    assert main(["train", *TINY, "model.lora.r=2", f"trainer.out_dir={root}", "trainer.name=run"]) == 0
    return root / "run"


def _no_weights(run: Path) -> None:
    (run / "checkpoints" / "step_000001" / "adapter_model.safetensors").unlink()


def _other_base(run: Path) -> None:
    config = run / "config.yaml"
    config.write_text(config.read_text().replace("hidden_size: 16", "hidden_size: 32"))


@pytest.mark.parametrize("command", ["eval", "export"])
@pytest.mark.parametrize(("damage", "says"), [
    (_no_weights, "has no weights (none of adapter_model.safetensors); the checkpoint is damaged"),
    (_other_base, "adapter weights do not fit this model (base_model.model."),
])
def test_an_adapter_without_weights_or_of_another_base_is_one_line(command, damage, says, lora_run, tmp_path,
                                                                    capsys):
    """Before: FileNotFoundError (eval) and RuntimeError size-mismatch (eval, export) tracebacks."""
    run = tmp_path / "run"
    shutil.copytree(lora_run, run)
    damage(run)
    argv = ["eval", str(run), "--n", "2"] if command == "eval" else ["export", str(run), str(tmp_path / "out")]
    err = _error(capsys, argv)
    assert says in err, err
    assert not (tmp_path / "out").exists()
    if damage is _other_base:
        assert " saved, (" in err and " here)" in err, err  # the shapes that differ
