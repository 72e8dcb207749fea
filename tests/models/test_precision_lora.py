"""model.dtype, trainer.device, trainer.gradient_checkpointing and model.lora on tiny models (CPU)."""

from __future__ import annotations

import copy
import json
import math
import shutil

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from rlvr.builder import build
from rlvr.builder.components import build_components
from rlvr.cli import main
from rlvr.config import load_config
from rlvr.errors import ConfigError
from rlvr.models.causal_lm import enable_checkpointing, tiny_llama
from rlvr.models.policy import CausalPolicy
from rlvr.models.tokenizer import char_tokenizer
from rlvr.trainer.sync import rl_step

pytest.importorskip("peft")

TINY = ["model.path=", "model.hidden_size=32", "model.num_layers=2", "model.num_heads=2",
        "model.intermediate_size=64", "rollout.prompts_per_step=2", "rollout.group_size=4",
        "rollout.max_new_tokens=8", "task.heldout_size=8", "trainer.eval_every=0", "trainer.thread_mode=ops",
        "trainer.threads=1", "optim.lr=1e-2", "optim.warmup_steps=1"]


@pytest.fixture
def length_reward(tmp_path):
    """A reward that separates the completions of a fresh model (countdown's verifier scores them all 0)."""
    path = tmp_path / "length_reward.py"
    path.write_text("def score(prompt, completion, **example):\n    return 1.0 / (1 + len(completion))\n")
    return f"reward.fn={path}:score"


def _train(tmp_path, name, *overrides, resume=False):
    args = ["train", *TINY, f"trainer.out_dir={tmp_path}", f"trainer.name={name}", *overrides]
    assert main(args + (["--resume", str(tmp_path / name)] if resume else [])) == 0
    return tmp_path / name


def _metrics(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _batch(tokenizer, rows=4, width=6):
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, len(tokenizer), (rows, 5), generator=generator)
    mask = torch.ones_like(prompt)
    mask[0, :2] = 0
    completion = torch.randint(3, len(tokenizer), (rows, width), generator=generator)
    return prompt, mask, completion


def test_bfloat16_run_trains_and_saves_and_exports_bfloat16(tmp_path, length_reward):
    run = _train(tmp_path, "bf16", length_reward, "model.dtype=bfloat16", "trainer.steps=3")
    lines = _metrics(run)
    assert [line["step"] for line in lines if line["step"]][-1] == 3
    assert all(math.isfinite(line["loss/policy"]) for line in lines if "loss/policy" in line)
    weights = load_file(str(run / "checkpoints" / "step_000003" / "model.safetensors"))
    assert {w.dtype for w in weights.values()} == {torch.bfloat16}
    assert main(["export", str(run), str(tmp_path / "hf")]) == 0
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype="auto").dtype == torch.bfloat16


def test_bfloat16_takes_the_plain_forward_with_float32_logprobs():
    config = load_config(None, [*TINY, "model.dtype=bfloat16"])
    model, tokenizer = build.build_model(config)
    policy = build.build_policy(config, model)
    prompt, mask, completion = _batch(tokenizer)
    before = policy.forwards
    logp, _ = policy.token_logprobs(prompt, mask, completion)
    assert policy.forwards == before + 1 and logp.dtype == torch.float32  # the module ran: not the fused path


def test_device_option():
    assert build.resolve_device("cpu") == torch.device("cpu")
    assert build.resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ConfigError, match="trainer.device"):
        load_config(None, ["trainer.device=gpu"])
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="trainer.device") as err:
            build_components(load_config(None, [*TINY, "trainer.device=cuda"]))
        assert "\n" not in str(err.value)


@pytest.mark.parametrize("overrides, field", [
    (["model.dtype=float16"], "model.dtype"),
    (["model.kind=diffusion", "model.dtype=bfloat16"], "model.dtype"),
    (["model.kind=diffusion", "trainer.device=cuda"], "trainer.device"),
    (["model.lora.r=-1"], "model.lora.r"),
    (["model.lora.r=4", "model.lora.dropout=1.0"], "model.lora.dropout"),
    (["model.lora.r=4", "model.kind=diffusion"], "model.lora.r"),
    (["model.lora.r=4", "algo.advantage=gae"], "model.lora.r"),
])
def test_bad_values_are_one_line_errors_naming_the_field(overrides, field):
    with pytest.raises(ConfigError, match=field) as err:
        load_config(None, overrides)
    assert "\n" not in str(err.value)


def test_gradient_checkpointing_gives_the_same_gradients():
    tokenizer = char_tokenizer()
    plain = tiny_llama(len(tokenizer), hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                       max_seq_len=64, seed=0).eval()
    checkpointed = copy.deepcopy(plain)
    assert enable_checkpointing(checkpointed)
    prompt, mask, completion = _batch(tokenizer)
    calls = []
    checkpointed.model.layers[0].mlp.register_forward_pre_hook(lambda *_: calls.append(1))
    grads = []
    for model, on in ((plain, False), (checkpointed, True)):
        logp, _ = CausalPolicy(model, fast=False, checkpointing=on).token_logprobs(prompt, mask, completion)
        logp.sum().backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
    assert len(calls) == 2  # the layer was recomputed in the backward pass
    assert not checkpointed.training  # the model's own mode is untouched
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, rtol=1e-5, atol=1e-7)


def test_lora_trains_only_the_adapter_and_the_reference_is_the_base(length_reward):
    config = load_config(None, [*TINY, length_reward, "model.lora.r=4", "algo.kl_coef=0.1", "trainer.steps=3"])
    base, tokenizer = build.base_model(config)
    base_logp, _ = CausalPolicy(copy.deepcopy(base), fast=False).token_logprobs(*_batch(tokenizer))
    c = build_components(config, model=base, tokenizer=tokenizer)
    state = {k: v.clone() for k, v in c.learner.model.state_dict().items()}
    assert {id(p) for group in c.learner.optimizer.param_groups for p in group["params"]} == \
        {id(p) for n, p in c.learner.model.named_parameters() if "lora_" in n}
    for step in (1, 2, 3):
        rl_step(c, step)
    after = c.learner.model.state_dict()
    changed = {k for k in state if not torch.equal(state[k], after[k])}
    assert changed and all("lora_" in k for k in changed)
    assert any("lora_B" in k for k in changed)
    policy_logp, _ = c.learner.policy.token_logprobs(*_batch(tokenizer))
    reference_logp, _ = c.learner.reference.token_logprobs(*_batch(tokenizer))
    assert not torch.allclose(policy_logp, base_logp, atol=1e-4)  # the adapter moved the policy
    torch.testing.assert_close(reference_logp, base_logp, rtol=0, atol=1e-6)


def test_lora_target_modules_that_match_nothing_are_a_config_error():
    config = load_config(None, [*TINY, "model.lora.r=4", "model.lora.target_modules=[no_such_proj]"])
    with pytest.raises(ConfigError, match="model.lora.target_modules") as err:
        build.build_model(config)
    assert "\n" not in str(err.value)


def test_lora_resume_continues_and_export_merges(tmp_path, length_reward):
    lora = [length_reward, "model.lora.r=4", "model.lora.target_modules=[q_proj,v_proj]", "trainer.save_every=1",
            "trainer.keep_last=3", "trainer.steps=3"]
    whole = _train(tmp_path, "whole", *lora)
    # The same run stopped after step 2: its last checkpoint removed, then resumed.
    shutil.copytree(whole, tmp_path / "split")
    shutil.rmtree(tmp_path / "split" / "checkpoints" / "step_000003")
    split = _train(tmp_path, "split", *lora, resume=True)
    assert [line["step"] for line in _metrics(split)] == [line["step"] for line in _metrics(whole)]
    for a, b in zip(_metrics(whole), _metrics(split)):
        assert a.get("loss/policy") == b.get("loss/policy") and a.get("reward/mean") == b.get("reward/mean")
    ckpt = split / "checkpoints" / "step_000003"
    assert not (ckpt / "model.safetensors").exists()  # the adapter only; the base stays as loaded
    adapters = [load_file(str(r / "checkpoints" / "step_000003" / "adapter_model.safetensors")) for r in (whole, split)]
    assert adapters[0].keys() == adapters[1].keys()
    for key in adapters[0]:
        torch.testing.assert_close(adapters[1][key], adapters[0][key])

    assert main(["eval", str(split), "--n", "4"]) == 0  # the base rebuilt and the adapter loaded
    assert main(["export", str(split), str(tmp_path / "hf")]) == 0
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    assert type(exported).__name__ == "LlamaForCausalLM"
    config = load_config(split / "config.yaml")
    adapted, tokenizer = build.build_model(config)
    from rlvr.models.lora import load_adapter

    load_adapter(adapted, ckpt)
    batch = _batch(tokenizer)
    with torch.no_grad():
        ours, _ = CausalPolicy(adapted).token_logprobs(*batch)
        theirs, _ = CausalPolicy(exported, fast=False).token_logprobs(*batch)
    torch.testing.assert_close(theirs, ours, rtol=0, atol=1e-5)
