"""`rlvr config --from-trl FILE`: TRL's GRPOConfig (a full JSON dump from the installed TRL, a YAML
file, or launch-command flags) as an rlvr recipe that loads, with what was not converted as comments."""

from __future__ import annotations

import json

import pytest
import yaml
from _hub_cache import REVISION, hub_dataset_cache

from rlvr.cli import main
from rlvr.config import load_config
from rlvr.config.from_trl import convert, parse_flags, recipe_from_trl
from rlvr.errors import ConfigError


def test_flags_parse_as_trls_argument_parser_reads_them():
    assert parse_flags("--num_generations 8 \\\n --use-vllm --beta=0.04 --epsilon_high None --lr_scheduler_type cosine"
                       ) == {"num_generations": 8, "use_vllm": True, "beta": 0.04, "epsilon_high": None,
                             "lr_scheduler_type": "cosine"}


def test_a_full_grpo_config_dump_converts_to_what_it_sets(tmp_path):
    trl = pytest.importorskip("trl")
    args = trl.GRPOConfig(output_dir=str(tmp_path / "trl"), num_generations=4, beta=0.04, epsilon=0.3,
                          loss_type="dr_grpo", max_completion_length=12, learning_rate=2e-5, repetition_penalty=1.1,
                          logging_steps=3, report_to="none", bf16=False)
    path = tmp_path / "grpo.json"
    path.write_text(args.to_json_string())
    text = recipe_from_trl(path)
    tree = yaml.safe_load(text)
    config = load_config(tree)
    assert (config.rollout.group_size, config.algo.kl_coef, config.algo.clip_low, config.algo.clip_high) == (
        4, 0.04, 0.3, 0.3)  # epsilon sets both ends, as TRL does when epsilon_high is unset
    assert config.algo.aggregation == "seq_mean_token_sum_norm" and config.rollout.max_new_tokens == 12
    assert config.optim.lr == 2e-5 and config.rollout.repetition_penalty == 1.1 and config.seed == 42
    comments = [line for line in text.splitlines() if line.startswith("#")]
    assert any("logging_steps" in line for line in comments)  # kept as a note, not dropped
    # TRL's defaults rlvr cannot take (gradient_accumulation_steps=1, a linear schedule) are no loss: no note
    assert not any("gradient_accumulation_steps=" in line or "lr_scheduler_type=" in line for line in comments)


def test_a_changed_value_without_an_rlvr_field_is_noted():
    tree, notes = convert({"lr_scheduler_type": "cosine_with_restarts", "epsilon": 0.2,
                           "epsilon_high": 0.28, "model_name_or_path": "Qwen/Qwen2.5-0.5B"})
    assert tree == {"algo": {"dynamic_sampling": False, "clip_low": 0.2, "clip_high": 0.28},
                    "model": {"path": "Qwen/Qwen2.5-0.5B"}}
    assert len(notes) == 1 and notes[0].startswith("lr_scheduler_type='cosine_with_restarts': has no rlvr equivalent")


@pytest.mark.parametrize(("trl", "prompts", "minibatches"), [
    ({"per_device_train_batch_size": 8, "num_generations": 8}, 1, 1),  # TRL's defaults: one prompt per step
    ({"per_device_train_batch_size": 16, "num_generations": 4}, 4, 1),
    ({"per_device_train_batch_size": 4, "gradient_accumulation_steps": 4, "num_generations": 8}, 2, 1),
    ({"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2, "steps_per_generation": 8,
      "num_generations": 8}, 4, 4),  # one generation, four optimizer steps
    ({"per_device_train_batch_size": 4, "generation_batch_size": 32, "num_generations": 8}, 4, 8),
    ({"num_processes": 4, "per_device_train_batch_size": 4, "num_generations": 8}, 2, 1),  # the processes' batch
])
def test_batch_sizes_become_prompts_per_step_as_grpo_config_derives_them(trl, prompts, minibatches):
    tree, _ = convert(trl)
    assert (tree["rollout"]["prompts_per_step"], tree["trainer"]["minibatches"]) == (prompts, minibatches)
    assert tree["rollout"]["group_size"] == trl["num_generations"]


def test_a_pasted_launch_line_with_warmup_ratio_and_max_prompt_length(tmp_path):
    line = tmp_path / "launch.sh"
    line.write_text("accelerate launch --config_file zero3.yaml --num_processes 2 trl/scripts/grpo.py \\\n"
                    "  --model_name_or_path Qwen/Qwen2-0.5B-Instruct --per_device_train_batch_size 4 \\\n"
                    "  --num_generations 4 --max_steps 200 --warmup_ratio 0.05 --max_prompt_length 256\n")
    tree = yaml.safe_load(recipe_from_trl(line))
    assert tree["rollout"] == {"prompts_per_step": 2, "group_size": 4} and tree["optim"] == {"warmup_steps": 10}
    assert tree["model"]["path"] == "Qwen/Qwen2-0.5B-Instruct" and tree["trainer"]["steps"] == 200
    text = recipe_from_trl(line)
    assert "# not converted: max_prompt_length=256: TRL truncates prompts" in text and "num_processes=2" in text
    with pytest.raises(ConfigError, match="must be a multiple of num_generations=3"):
        convert({"per_device_train_batch_size": 4, "num_generations": 3})


def test_the_cli_prints_a_recipe_train_accepts(tmp_path, capsys):
    flags = tmp_path / "launch.txt"
    flags.write_text("--num_generations 2 --max_completion_length 4 --temperature 0.7 --max_steps 1 --use_vllm false\n")
    assert main(["config", "--from-trl", str(flags)]) == 0
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(capsys.readouterr().out)
    config = load_config(str(recipe))
    assert (config.rollout.group_size, config.rollout.temperature, config.trainer.steps) == (2, 0.7, 1)
    assert config.rollout.engine == "torch"
    for bad, message in ((tmp_path / "missing.json", "is not a file"), (tmp_path / "list.yaml", "not a mapping")):
        if bad.name == "list.yaml":
            bad.write_text("- 1\n")
        assert main(["config", "--from-trl", str(bad)]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1
    (tmp_path / "bad.json").write_text(json.dumps({"num_generations": 0}))
    assert main(["config", "--from-trl", str(tmp_path / "bad.json")]) == 2  # loaded: rlvr's own check names it
    assert "rollout.group_size" in capsys.readouterr().err


def test_a_trl_flag_on_rlvr_train_says_how_to_write_it(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--num_generations", "4"])
    assert "write num_generations=4" in capsys.readouterr().err


def test_the_dataset_and_reward_funcs_of_a_launch_line_carry_over(tmp_path):
    rows = tmp_path / "deepmath.jsonl"
    rows.write_text(json.dumps({"prompt": "1+1=?", "solution": "2"}) + "\n")
    tree, notes = convert({"dataset_name": str(rows), "reward_funcs": ["accuracy_reward", "think_format_reward",
                                                                        "my_rewards.length"]})
    assert tree["task"] == {"name": "math_file", "math_file": {"path": str(rows), "prompt_key": "prompt",
                                                               "answer_key": "solution"}}
    assert tree["reward"] == {"fn": "task, trl.rewards:think_format_reward, my_rewards:length"} and not notes
    hub, notes = convert({"dataset_name": "trl-lib/DeepMath-103K", "reward_funcs": "accuracy_reward"})
    assert hub["task"]["math_file"]["path"] == "trl-lib/DeepMath-103K" and "reward" not in hub and not notes
    neither, notes = convert({"dataset_name": "deepmath", "reward_funcs": "accuracy_reward"})
    assert "task" not in neither and "reward" not in neither
    assert notes[0].startswith("dataset_name='deepmath': no local file or folder and no Hub dataset id")
    assert notes[1].startswith("reward_funcs: accuracy_reward reads the dataset's solution column")


REWARDS = '''import json


def uses_columns(completions, solution, level, **kwargs):  # TRL's form: every dataset column a keyword
    with open("columns.jsonl", "a") as log:
        log.write(json.dumps({"solution": solution, "level": level}) + "\\n")
    return [float(str(s) in c) for c, s in zip(completions, solution)]
'''


def test_a_hub_dataset_and_a_column_reading_reward_train_through_a_converted_recipe(tmp_path, monkeypatch, capsys):
    import huggingface_hub

    from rlvr.models.tiny_archs import build_model_dir

    rows = [{"prompt": f"What is {a} + {a}?", "solution": str(2 * a), "level": a % 3} for a in range(1, 13)]
    cache = hub_dataset_cache(tmp_path / "cache", "acme/sums",
                              {"data/train.jsonl": "".join(json.dumps(r) + "\n" for r in rows)})
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))  # the cache only, offline
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    model = build_model_dir(tmp_path / "tiny-qwen2", "qwen2")
    (tmp_path / "my_rewards.py").write_text(REWARDS)
    (tmp_path / "launch.txt").write_text(
        f"accelerate launch trl/scripts/grpo.py --model_name_or_path {model} --dataset_name acme/sums "
        f"--reward_funcs my_rewards.uses_columns --num_generations 2 --per_device_train_batch_size 4 "
        f"--max_completion_length 8 --max_steps 1\n")
    assert main(["config", "--from-trl", "launch.txt"]) == 0
    text = capsys.readouterr().out
    tree = yaml.safe_load(text)
    assert tree["task"]["math_file"]["path"] == "acme/sums" and tree["reward"]["fn"] == "my_rewards:uses_columns"
    assert tree["algo"]["dynamic_sampling"] is False  # TRL trains every group
    (tmp_path / "recipe.yaml").write_text(text)
    assert main(["train", "recipe.yaml", "trainer.threads=1", "task.heldout_size=2", "trainer.eval_every=0"]) == 0
    calls = [json.loads(line) for line in (tmp_path / "columns.jsonl").read_text().splitlines()]
    by_solution = {r["solution"]: r["level"] for r in rows}
    seen = [(s, lv) for call in calls for s, lv in zip(call["solution"], call["level"])]
    assert len(seen) >= 4 and all(by_solution[s] == lv for s, lv in seen)  # each row's own columns
    record = json.loads((tmp_path / "runs" / "recipe_s0" / "run.json").read_text())["datasets"][0]
    assert (record["hub_dataset"], record["revision"], record["files"]) == ("acme/sums", REVISION, 1)
