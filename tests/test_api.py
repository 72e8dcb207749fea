"""The Python API: `rlvr.Trainer` on rows, tasks and model objects; reward columns and weights;
callbacks; run directories; one-line errors for bad arguments. Runs are a step or two."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from rlvr.errors import ConfigError

TINY = {"trainer.steps": 2, "trainer.eval_every": 0, "trainer.save_every": 0, "trainer.threads": 1,
        "rollout.prompts_per_step": 2, "rollout.group_size": 2, "rollout.max_new_tokens": 8}


def _rows(n: int = 20) -> list[dict]:
    return [{"prompt": f"{a} {a + 1} 1>{2 * a + 2}:", "target": 2 * a + 2, "numbers": [a, a + 1, 1]}
            for a in range(1, n + 1)]


def _metrics(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _trainer(tmp_path, reward_funcs, rows=None, **kwargs):
    from rlvr import Trainer

    overrides = {**TINY, "trainer.out_dir": str(tmp_path), **kwargs.pop("overrides", {})}
    return Trainer("rlvr:countdown-warmstart", reward_funcs, _rows() if rows is None else rows,
                   overrides=overrides, echo=lambda *a: None, **kwargs)


def test_import_rlvr_is_cheap_and_exports_the_api_lazily():
    code = ("import sys, rlvr; assert 'torch' not in sys.modules; assert 'Trainer' in dir(rlvr); "
            "rlvr.Trainer, rlvr.train; assert 'torch' not in sys.modules, 'rlvr.api imported torch'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_every_column_reaches_the_reward_as_a_keyword(tmp_path):
    seen = []

    def reward(prompt, completion, target, numbers, **columns):
        seen.append((prompt, target, numbers, columns))
        return float(completion.startswith(str(numbers[0])))

    # `seen` is this process's list: the function runs here, not in a reward worker (a fork, whose list it would fill)
    trainer = _trainer(tmp_path, reward, overrides={"reward.workers": 0})
    final = trainer.train()
    assert seen and all(isinstance(t, int) and isinstance(n, list) and c == {} for _, t, n, c in seen)
    assert all(p == f"{n[0]} {n[1]} 1>{t}:" for p, t, n, _ in seen)  # the row's own columns
    assert final["step"] == 2 and "reward/user/mean" in final
    run = trainer.run_dir
    assert run == tmp_path / "grpo_dataset_s0"
    assert {p.name for p in run.iterdir()} >= {"config.yaml", "run.json", "metrics.jsonl", "samples.jsonl",
                                               "checkpoints"}
    info = json.loads((run / "run.json").read_text())
    assert info["status"] == "finished" and info["train_dataset"]["rows"] == 20
    assert info["train_dataset"]["heldout_rows"] == 4  # a fifth of the rows at most
    assert info["reward_funcs"] == [{"name": "user", "weight": 1.0, "fn": f"{__name__}.{reward.__qualname__}"}]


def test_several_reward_functions_log_each_and_reward_the_weighted_sum(tmp_path):
    def starts(prompt, completion, numbers, **columns):
        return float(completion.startswith(str(numbers[0])))

    def short(prompt, completion, **columns):
        return 1.0 / (1 + len(completion))

    final = _trainer(tmp_path, [starts, short], reward_weights=[1.0, 0.5],
                     overrides={"algo.dynamic_sampling": False}).train()
    assert final["reward/mean"] == pytest.approx(final["reward/starts/mean"] + 0.5 * final["reward/short/mean"])
    assert final["reward/starts/errors"] == 0 and final["reward/short/unscorable"] == 0


def test_callbacks_see_steps_evaluations_checkpoints_and_can_stop(tmp_path):
    events = []

    class Watch:
        def on_step_end(self, step, metrics):
            events.append(("step", step))
            return step < 2  # False after step 2: stop

        def on_evaluate(self, step, metrics):
            events.append(("eval", step, sorted(metrics)))

        def on_checkpoint(self, step, path):
            events.append(("checkpoint", step, path.name))

    calls = []
    trainer = _trainer(tmp_path, lambda p, c, **cols: float(len(c) > 3),
                       callbacks=[Watch(), lambda s, m: calls.append(s)],
                       overrides={"trainer.steps": 5, "trainer.eval_every": 1})
    final = trainer.train()
    assert final["step"] == 2 and calls == [1, 2]
    assert [e for e in events if e[0] == "step"] == [("step", 1), ("step", 2)]
    assert ("eval", 1, ["eval/heldout_accuracy", "eval/train_accuracy"]) in events
    assert events[0] == ("eval", 0, ["eval/heldout_accuracy", "eval/train_accuracy"])  # the warm-start evaluation
    assert ("checkpoint", 2, "step_000002") in events  # the final checkpoint of a stopped run
    assert [m["step"] for m in _metrics(trainer.run_dir)] == [0, 1, 2]
    assert json.loads((trainer.run_dir / "run.json").read_text())["status"] == "finished"


def test_a_task_and_a_model_object(tmp_path, tiny_model, tokenizer):
    from rlvr import Trainer
    from rlvr.tasks.countdown import Countdown

    got = []
    final = Trainer(tiny_model, lambda p, c, answer, meta, **ex: got.append(meta) or 0.5, Countdown(heldout_size=4),
                    tokenizer=tokenizer, overrides={**TINY, "trainer.out_dir": str(tmp_path), "reward.workers": 0},
                    echo=lambda *a: None).train()  # workers=0: `got` is filled in this process, not a worker's
    assert final["step"] == 2 and final["reward/mean"] == 0.5
    assert got and all({"numbers", "target"} <= set(m) for m in got)  # a task's examples: answer and meta
    assert (tmp_path / "grpo_countdown_s0" / "checkpoints" / "step_000002" / "config.json").is_file()


def test_eval_dataset_and_the_hash_split():
    from rlvr.rewards.runner import RewardSum
    from rlvr.tasks.dataset import DatasetTask

    reward = RewardSum([lambda p, c, target, **cols: float(c == str(target))], columns=True)
    rows = _rows(50)
    split = DatasetTask(rows, reward=reward, heldout_size=10)
    again = DatasetTask(list(reversed(rows)), reward=reward, heldout_size=10)
    assert len(split.heldout()) == 10 and {e.prompt for e in split.heldout()} == {e.prompt for e in again.heldout()}
    held = {e.prompt for e in split.heldout()}
    assert not held & {e.prompt for e in split.sample(200, __import__("random").Random(0))}
    own = DatasetTask(rows, reward=reward, heldout_rows=_rows(3), heldout_size=10)
    assert [e.meta["target"] for e in own.heldout()] == [4, 6, 8] and len(own.sample(50)) == 50


def test_correctness_rule_threshold_and_correct_fn():
    from rlvr.rewards.runner import RewardSum
    from rlvr.tasks.dataset import DatasetTask

    def right(prompt, completion, target, **cols):
        return float(completion == str(target))

    def short(prompt, completion, **cols):
        return float(len(completion) < 3)

    example = DatasetTask(_rows(5), reward=RewardSum([right], columns=True)).sample(1)[0]
    target = str(example.meta["target"])
    both = DatasetTask(_rows(5), reward=RewardSum([right, short], [1.0, 0.5], columns=True), correct_threshold=1.5)
    assert both.is_correct(target, example) is (len(target) < 3) and not both.is_correct("nope", example)
    assert both.reward(example.prompt, target, meta=example.meta) == 1.0 + 0.5 * (len(target) < 3)
    custom = DatasetTask(_rows(5), reward=RewardSum([right], columns=True), correct_fn=lambda p, c, **cols: c == "x")
    assert custom.is_correct("x", example) and not custom.is_correct(target, example)


def test_chat_messages_go_through_the_chat_template(tokenizer):
    from rlvr.rewards.runner import RewardSum
    from rlvr.tasks.dataset import DatasetTask

    rows = [{"prompt": [{"role": "user", "content": f"q{i}"}], "target": i} for i in range(5)]
    reward = RewardSum([lambda p, c, **cols: 0.0], columns=True)
    with pytest.raises(ConfigError, match="chat template"):
        DatasetTask(rows, reward=reward, tokenizer=tokenizer)
    tokenizer.chat_template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}>"
    task = DatasetTask(rows, reward=reward, tokenizer=tokenizer, system_prompt="be brief")
    assert sorted(e.prompt for e in task.sample(5)) == [f"<system>be brief<user>q{i}>" for i in range(5)]


def test_config_object_dict_and_list_overrides(tmp_path):
    from rlvr import Trainer
    from rlvr.config import Config

    def fn(p, c, **cols):
        return 0.0

    trainer = Trainer(None, fn, _rows(), config=Config(seed=4),
                      overrides={"trainer.name": "007", "algo.clip_high": 0.28, "trainer.out_dir": str(tmp_path)})
    assert trainer.config.seed == 4 and trainer.config.trainer.name == "007" and trainer.config.algo.clip_high == 0.28
    assert trainer.run_dir == tmp_path / "007"
    listed = Trainer("", fn, _rows(), overrides=["seed=2", f"trainer.out_dir={tmp_path}"])
    assert listed.config.model.path == "" and listed.run_dir == tmp_path / "grpo_dataset_s2"
    (tmp_path / "grpo_dataset_s2").mkdir()
    again = Trainer("", fn, _rows(), overrides=["seed=2", f"trainer.out_dir={tmp_path}"])
    assert again.run_dir.name == "grpo_dataset_s2-2"


@pytest.mark.parametrize("kwargs, message", [
    ({"reward_funcs": None}, "reward_funcs: rows need reward functions"),
    ({"reward_weights": [1.0, 2.0]}, "reward_weights: 2 weights for 1 reward functions"),
    ({"reward_weights": ["x"]}, "reward_weights: expected a list of numbers"),
    ({"reward_funcs": 3}, "reward_funcs: expected a callable"),
    ({"reward_funcs": "nowhere.py:score"}, "reward_funcs='nowhere.py:score': file"),
    ({"train_dataset": [1, 2]}, "train_dataset[0]: expected a dict"),
    ({"train_dataset": {"validation": []}}, "train_dataset: a DatasetDict without a 'train' split"),
    ({"train_dataset": {"prompt": "1 2>3:", "target": 3}}, "train_dataset: got a mapping"),
    ({"train_dataset": _rows(4)}, "train_dataset: 4 rows hold out none"),
    ({"train_dataset": [{"question": "x"}]}, "train_dataset[0]: field 'prompt' missing"),
    ({"train_dataset": [{"question": "x"}], "prompt_key": "q"}, "set prompt_key"),
    ({"train_dataset": [{"prompt": 3}]}, "train_dataset[0]: field 'prompt' must be a string"),
    ({"eval_dataset": "rows.jsonl"}, "eval_dataset: 'rows.jsonl' is no file or folder and no Hub dataset id"),
    ({"model": object()}, "model: expected a model directory"),
    ({"model": "", "tokenizer": object()}, "tokenizer: only used with a model object"),
    ({"overrides": "seed=3"}, "overrides: expected a list"),
    ({"overrides": {"algo.clip_hihg": 0.3}}, "did you mean 'algo.clip_high'"),
    ({"config": 3}, "config: expected a Config"),
    ({"callbacks": [3]}, "callbacks[0]: int has none of"),
    ({"callbacks": [type("Flat", (), {"on_step_end": 3})()]}, "callbacks[0]: Flat.on_step_end is not callable (int)"),
    ({"resume": True}, "resume=True: no run to continue"),
    ({"correct_fn": "yes"}, "correct_fn: expected a callable"),
])
def test_bad_arguments_raise_one_line_config_errors(kwargs, message):
    from rlvr import Trainer

    args = {"model": None, "reward_funcs": lambda p, c, **cols: 0.0, "train_dataset": _rows(), **kwargs}
    with pytest.raises(ConfigError) as err:
        Trainer(args.pop("model"), args.pop("reward_funcs"), args.pop("train_dataset"), **args)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_task_only_arguments_and_existing_runs_are_refused(tmp_path):
    from rlvr import Trainer
    from rlvr.tasks.countdown import Countdown

    with pytest.raises(ConfigError, match="eval_dataset: a task brings its own held-out set"):
        Trainer(train_dataset=Countdown(), eval_dataset=_rows())
    with pytest.raises(ConfigError, match="correct_fn: applies to rows"):
        Trainer(train_dataset=Countdown(), correct_fn=lambda *a, **k: True)
    (tmp_path / "config.yaml").write_text("seed: 0\n")
    with pytest.raises(ConfigError, match="already holds a run; pass resume=True"):
        Trainer(run_dir=tmp_path)
    assert Trainer(resume=tmp_path).run_dir == tmp_path


def test_reward_fn_spec_names_several_weighted_functions(tmp_path):
    from rlvr.builder.build import build_reward
    from rlvr.config import load_config
    from rlvr.rewards.runner import load_reward_spec

    (tmp_path / "r.py").write_text("def right(p, c, **e):\n    return 1.0\n\ndef short(p, c, **e):\n    return 0.5\n")
    spec = f"{tmp_path}/r.py:right, 0.2*{tmp_path}/r.py:short"
    assert [(fn.__name__, w) for fn, w in load_reward_spec(spec)] == [("right", 1.0), ("short", 0.2)]
    reward = build_reward(load_config(None, [f"reward.fn={spec}"]), task=None)
    out = reward(["q"], ["c"], [{"answer": "", "meta": {}}])
    assert out.rewards == [pytest.approx(1.1)] and {"right/mean", "short/mean"} <= set(out.metrics)
    with pytest.raises(ConfigError, match="weight 'x' of"):
        load_reward_spec(f"x*{tmp_path}/r.py:right")
    with pytest.raises(ConfigError, match="empty entry"):
        load_reward_spec(f"{tmp_path}/r.py:right,,")


def test_reward_sum_marks_a_sample_unscorable_when_a_weighted_function_fails():
    from rlvr.rewards.runner import RewardSum

    def fails_on_b(p, c, **e):
        if c == "b":
            raise ValueError("no b")
        return 1.0

    out = RewardSum([fails_on_b, lambda p, c, **e: 2.0], [1.0, 0.5])(["q", "q"], ["a", "b"], [{}, {}])
    assert out.rewards[0] == 2.0 and math.isnan(out.rewards[1]) and out.errors == [None, "ValueError: no b"]
    assert math.isnan(RewardSum([fails_on_b]).score_one("q", "b", {}))


def test_a_run_on_rows_is_not_resumed_or_evaluated_without_them(tmp_path, capsys):
    from rlvr import Trainer
    from rlvr.cli import main

    trainer = _trainer(tmp_path, lambda p, c, **cols: float(len(c) > 3))
    trainer.train()
    with pytest.raises(ConfigError, match="resume: .* trained on a train dataset passed from Python"):
        Trainer(resume=trainer.run_dir)
    assert main(["eval", str(trainer.run_dir)]) == 2
    assert "cannot rebuild" in capsys.readouterr().err
    resumed = _trainer(tmp_path, lambda p, c, **cols: float(len(c) > 3), resume=trainer.run_dir,
                       overrides={"trainer.steps": 3})
    assert resumed.train()["step"] == 3


def test_a_datasets_dataset_gives_the_same_rows():
    datasets = pytest.importorskip("datasets")
    from rlvr.tasks.dataset import dataset_rows

    dataset = datasets.Dataset.from_list(_rows(5))
    assert dataset_rows(dataset, "train_dataset") == _rows(5)
    with pytest.raises(ConfigError, match=r"one split of a DatasetDict, e.g. dataset\['train'\]"):
        dataset_rows(datasets.DatasetDict({"train": dataset}), "train_dataset")


def test_rlvr_train_is_trainer_train(tmp_path):
    import rlvr

    final = rlvr.train("rlvr:countdown-warmstart", lambda p, c, **cols: 1.0, _rows(),
                       overrides={**TINY, "trainer.out_dir": str(tmp_path)}, echo=lambda *a: None)
    assert final["step"] == 2 and final["reward/mean"] == 1.0 and final["reward/accuracy"] == 1.0
