"""Any causal LM from disk: each architecture, as a tiny random instance built locally with a BPE
tokenizer and a chat template, trains through `rlvr train model.path=DIR`, in bf16, and exports
in bf16; loading errors (context too short, junk config.json) are one line."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from _archs import ARCHS, BOS, BOS_CHAT_TEMPLATE, ROOT, build_model_dir
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlvr.builder.components import build_components
from rlvr.cli import main
from rlvr.codec import encode_prompts
from rlvr.config import load_config
from rlvr.errors import ConfigError

GSM8K = str(ROOT / "data" / "gsm8k_fixture.jsonl")
RUN = ["task.name=math_file", f"task.math_file.path={GSM8K}", "task.heldout_size=4", "rollout.prompts_per_step=2",
       "rollout.group_size=4", "rollout.max_new_tokens=8", "trainer.eval_every=0", "trainer.threads=1",
       "optim.lr=1e-2", "optim.warmup_steps=1"]


@pytest.fixture
def length_reward(tmp_path):
    """A reward that separates a random model's completions (the math verifier scores them all 0)."""
    path = tmp_path / "length_reward.py"
    path.write_text("def score(prompt, completion, **example):\n    return 1.0 / (1 + len(completion))\n")
    return f"reward.fn={path}:score"


def _weights(directory: Path) -> dict[str, torch.Tensor]:
    out = {}
    for file in sorted(directory.glob("*.safetensors")):
        out.update(load_file(str(file)))
    return out


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_architecture_trains_three_steps_in_bfloat16_and_exports_bfloat16(tmp_path, arch, length_reward):
    source = build_model_dir(tmp_path / "model", arch, dtype=torch.bfloat16)
    run = tmp_path / "run"
    assert main(["train", *RUN, length_reward, f"model.path={source}", "model.dtype=bfloat16", "trainer.steps=3",
                 f"trainer.out_dir={tmp_path}", "trainer.name=run"]) == 0
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    losses = [line["loss/policy"] for line in lines if "loss/policy" in line]
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses)
    before, after = _weights(source), _weights(run / "checkpoints" / "step_000003")
    assert {w.dtype for w in after.values()} == {torch.bfloat16}
    changed = [k for k in before if k in after and not torch.equal(before[k], after[k])]
    assert len(changed) > len(before) // 2, f"{arch}: only {changed} changed"

    assert main(["export", str(run), str(tmp_path / "hf")]) == 0
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype="auto")
    original = AutoModelForCausalLM.from_pretrained(source, dtype="auto")
    assert type(exported) is type(original) and exported.dtype == torch.bfloat16
    assert AutoTokenizer.from_pretrained(tmp_path / "hf").chat_template == AutoTokenizer.from_pretrained(
        source).chat_template


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_model_dtype_auto_keeps_the_checkpoint_dtype(tmp_path, dtype):
    source = build_model_dir(tmp_path / "model", "qwen2", dtype=dtype)
    config = load_config(None, [*RUN, f"model.path={source}", "model.dtype=auto"])
    assert next(build_components(config).learner.model.parameters()).dtype == dtype
    # the default, float32, upcasts a bf16 checkpoint (fp32 master weights)
    assert next(build_components(load_config(None, [*RUN, f"model.path={source}"])).learner.model.parameters()).dtype \
        == torch.float32


@pytest.mark.parametrize("arch, field", [("gpt2", "n_positions"), ("qwen2", "max_position_embeddings")])
def test_prompt_plus_completion_longer_than_the_context_is_a_config_error(tmp_path, arch, field):
    positions = {"n_positions": 48} if arch == "gpt2" else {"max_position_embeddings": 48}
    source = build_model_dir(tmp_path / "model", arch, **positions)
    run = [o for o in RUN if not o.startswith("rollout.max_new_tokens=")]
    config = load_config(None, [*run, f"model.path={source}", "rollout.max_new_tokens=32"])
    with pytest.raises(ConfigError, match=f"rollout.max_new_tokens.*48 positions.*{field}") as err:
        build_components(config)
    message = str(err.value)
    assert "\n" not in message and "task.math_file.max_prompt_length" in message
    with pytest.raises(ConfigError, match=r"model's context of 64 positions \(model.max_seq_len\); lower"):
        build_components(load_config(None, ["model.path=", "model.max_seq_len=64", "rollout.max_new_tokens=60"]))
    # The same run with prompts that fit is accepted.
    build_components(load_config(None, [*run, f"model.path={source}", "rollout.max_new_tokens=4",
                                        "task.math_file.max_prompt_length=40"]))


def test_a_template_that_emits_bos_gets_no_second_one(tmp_path):
    plain = AutoTokenizer.from_pretrained(build_model_dir(tmp_path / "a", "llama"))
    templated = AutoTokenizer.from_pretrained(build_model_dir(tmp_path / "b", "llama", template=BOS_CHAT_TEMPLATE))
    messages = [{"role": "user", "content": "3 5 2>13:"}]
    for tokenizer in (plain, templated):
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids, mask = encode_prompts(tokenizer, [text, "x"])
        row = ids[0][mask[0].bool()].tolist()
        assert row[0] == BOS and row.count(BOS) == 1
    assert templated.apply_chat_template(messages, tokenize=False).startswith("<bos>")


@pytest.mark.parametrize("junk", ["{not json", '{"model_type": "no_such_arch"}', "[]"])
def test_a_junk_config_json_is_a_one_line_error(tmp_path, junk):
    source = build_model_dir(tmp_path / "model", "qwen2")
    (source / "config.json").write_text(junk)
    with pytest.raises(ConfigError, match="model.path") as err:
        build_components(load_config(None, [*RUN, f"model.path={source}"]))
    assert "\n" not in str(err.value)
