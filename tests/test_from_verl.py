"""`rlvr config --from-verl`: verl's keys as rlvr fields (docs/migrating-from-verl.md current, every
row loading), and verl's GSM8K GRPO example script converted and trained for two steps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlvr.cli import main
from rlvr.config import load_config
from rlvr.config.from_verl import VERL_NAMES, convert_verl, parse_overrides, recipe_from_verl, verl_page

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "migrating-from-verl.md"
FIXTURE = ROOT / "data" / "gsm8k_fixture.jsonl"

# verl's examples/grpo_trainer GSM8K run script, its keys as written there, sized for a CPU test
EXAMPLE = """set -x
python3 -m verl.trainer.main_ppo \\
    algorithm.adv_estimator=grpo \\
    data.train_files={train} \\
    data.val_files={test} \\
    data.prompt_key=question \\
    data.train_batch_size=2 \\
    data.max_prompt_length=200 \\
    data.max_response_length=8 \\
    data.filter_overlong_prompts=True \\
    data.truncation='error' \\
    actor_rollout_ref.model.path={model} \\
    actor_rollout_ref.actor.optim.lr=1e-6 \\
    actor_rollout_ref.model.use_remove_padding=True \\
    actor_rollout_ref.actor.ppo_mini_batch_size=1 \\
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \\
    actor_rollout_ref.actor.use_kl_loss=True \\
    actor_rollout_ref.actor.kl_loss_coef=0.001 \\
    actor_rollout_ref.actor.kl_loss_type=low_var_kl \\
    actor_rollout_ref.actor.entropy_coeff=0 \\
    actor_rollout_ref.model.enable_gradient_checkpointing=True \\
    actor_rollout_ref.actor.fsdp_config.param_offload=False \\
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=False \\
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4 \\
    actor_rollout_ref.rollout.tensor_model_parallel_size=2 \\
    actor_rollout_ref.rollout.name=vllm \\
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \\
    actor_rollout_ref.rollout.n=2 \\
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4 \\
    actor_rollout_ref.ref.fsdp_config.param_offload=True \\
    algorithm.use_kl_in_reward=False \\
    trainer.critic_warmup=0 \\
    trainer.logger='["console","wandb"]' \\
    trainer.project_name='verl_grpo_example_gsm8k' \\
    trainer.experiment_name='qwen2_7b_function_rm' \\
    trainer.n_gpus_per_node=8 \\
    trainer.nnodes=1 \\
    trainer.save_freq=20 \\
    trainer.test_freq=5 \\
    trainer.total_training_steps=2 \\
    trainer.total_epochs=15 $@
"""


def test_the_migration_table_is_current():
    assert verl_page(PAGE.read_text()) == PAGE.read_text(), "python -m rlvr.config --verl-page " \
                                                            "docs/migrating-from-verl.md"


def test_every_row_loads_into_the_config_schema():
    for v in VERL_NAMES.values():
        if v.key:
            value = {"model.path": "rlvr:countdown-warmstart", "model.lora.target_modules": "all-linear",
                     "task.math_file.path": str(FIXTURE), "task.math_file.heldout_path": str(FIXTURE),
                     "task.math_file.prompt_key": "question", "trainer.out_dir": "out", "rollout.top_p": 0.9,
                     "algo.dual_clip": 3.0, "optim.lr": 1e-6}.get(v.key, 2)
            if v.key in ("algo.std_normalize", "algo.dynamic_sampling", "trainer.gradient_checkpointing"):
                value = True
            extra = {"data.train_files": str(FIXTURE)} if v.key.startswith("task.math_file.") else {}
            tree, notes = convert_verl({**extra, v.verl: value})
            assert not notes and load_config(tree) is not None, v.verl
        for option in v.choices:
            tree, notes = convert_verl({v.verl: option})
            config = load_config(tree)
            for key, expected in v.choices[option].items():
                section, name = key.split(".")
                assert getattr(getattr(config, section), name) == expected, (v.verl, option)


def test_verls_grpo_example_converts_and_trains_two_steps(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    script = tmp_path / "run_gsm8k_grpo.sh"
    rows = FIXTURE.read_text().splitlines(keepends=True)
    (tmp_path / "train.jsonl").write_text("".join(rows[:40]))
    (tmp_path / "test.jsonl").write_text("".join(rows[40:]))
    from rlvr.models.tiny_archs import build_model_dir

    model = build_model_dir(tmp_path / "tiny-qwen2", "qwen2")  # a tiny random Qwen2 with a 256-token context
    script.write_text(EXAMPLE.format(train=tmp_path / "train.jsonl", test=tmp_path / "test.jsonl", model=model))
    assert parse_overrides(script.read_text())["trainer.logger"] == '["console","wandb"]'
    assert main(["config", "--from-verl", str(script)]) == 0
    recipe = tmp_path / "grpo_gsm8k.yaml"
    recipe.write_text(capsys.readouterr().out)
    config = load_config(str(recipe))
    assert (config.rollout.prompts_per_step, config.rollout.group_size, config.trainer.minibatches) == (2, 2, 2)
    assert (config.algo.advantage, config.algo.kl_estimator, config.algo.kl_placement, config.algo.kl_coef) == (
        "grpo", "k3", "loss", 0.001)
    assert (config.task.name, config.task.math_file.prompt_key, config.rollout.engine) == ("math_file", "question",
                                                                                           "vllm")
    assert not config.algo.dynamic_sampling and config.trainer.steps == 2 and config.trainer.eval_every == 5
    text = recipe.read_text()
    assert "# not converted: trainer.total_epochs=15: rlvr runs trainer.steps" in text
    assert "placement and logging, which rlvr decides itself: data.filter_overlong_prompts" in text
    # on a CPU: rlvr's own sampler instead of vLLM, one thread
    assert main(["train", str(recipe), "rollout.engine=torch", "trainer.threads=1", "task.heldout_size=2"]) == 0
    lines = [json.loads(line) for line in (tmp_path / "runs" / "grpo_gsm8k_s0" / "metrics.jsonl").read_text()
             .splitlines()]
    assert [m["step"] for m in lines] == [0, 1, 2] and "actor/kl" in lines[-1]


def test_bad_files_are_one_line(tmp_path, capsys):
    (tmp_path / "empty.sh").write_text("echo nothing\n")
    (tmp_path / "list.yaml").write_text("- 1\n")
    for name, message in (("missing.sh", "is not a file"), ("empty.sh", "holds no key=value overrides"),
                          ("list.yaml", "not a mapping of verl's sections")):
        assert main(["config", "--from-verl", str(tmp_path / name)]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1
    with pytest.raises(Exception, match="algorithm.adv_estimator='nope': no rlvr equivalent"):
        recipe_from_verl_text(tmp_path, "algorithm.adv_estimator=nope")


def recipe_from_verl_text(tmp_path, text):
    path = tmp_path / "one.sh"
    path.write_text(text)
    tree, notes = convert_verl(parse_overrides(text))
    if notes:
        raise ValueError(notes[0])
    return recipe_from_verl(path)
