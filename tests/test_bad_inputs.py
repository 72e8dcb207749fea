"""Bad input, as a careless user or a hostile reward function would give it: every case ends in a
one-line error naming the field and the fix (exit 2), or in the documented behaviour, never in a
traceback, a silent wrong result or lost data.

Most cases go through `rlvr.cli.main` in this process (a config check costs milliseconds, a
data or reward case one step of a 16-wide model); the full-disk cases write to a 2 MiB tmpfs
(mounting needs root, which CI has); the signal cases signal this process from inside a reward
function, which the run's own handlers catch.
"""

from __future__ import annotations

import errno
import hashlib
import json
import shutil
import signal
from pathlib import Path

import pytest

from rlvr.cli import main

TINY = ["model.path=", "model.hidden_size=16", "model.num_layers=1", "model.num_heads=2",
        "model.intermediate_size=32", "rollout.prompts_per_step=2", "rollout.group_size=2",
        "rollout.max_new_tokens=4", "task.heldout_size=2", "trainer.threads=1", "trainer.steps=1",
        "trainer.eval_every=0", "trainer.save_every=1"]
WALL_CLOCK = ("time/", "perf/")
FIXTURE = Path(__file__).parents[1] / "data" / "gsm8k_fixture.jsonl"


def tiny(*changes: str) -> list[str]:
    """TINY with ``changes`` in place of its own KEY=VALUE items of the same keys (a key given twice
    is refused)."""
    keys = {c.partition("=")[0] for c in changes}
    return [o for o in TINY if o.partition("=")[0] not in keys] + list(changes)


def cli(argv: list[str], capsys) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code: int, out: str, err: str, field: str) -> None:
    assert code == 2, (out, err)
    assert err.count("\n") == 1 and err.startswith("error: "), err
    assert field in err, err
    assert "Traceback" not in out + err


def snapshot(folder: Path) -> dict[str, str]:
    """sha256 of every file under `folder`: what a refused command must leave as it was."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def without_wall_clock(lines: list[dict]) -> list[dict]:
    return [{k: v for k, v in line.items() if not k.startswith(WALL_CLOCK)} for line in lines]


# ---------------------------------------------------------------------------------- config

CONFIG = [  # (override, the field the error must name)
    ("optim.lr=0", "optim.lr"), ("optim.lr=-1e-4", "optim.lr"), ("optim.lr=inf", "optim.lr"),
    ("optim.lr=.nan", "optim.lr"), ("optim.lr=-.inf", "optim.lr"), ("sft.lr=0", "sft.lr"),
    ("sft.lr=inf", "sft.lr"), ("optim.weight_decay=-0.01", "optim.weight_decay"),
    ("optim.weight_decay=inf", "optim.weight_decay"), ("optim.beta1=1", "optim.beta1"),
    ("optim.beta2=1.5", "optim.beta2"), ("optim.beta2=-0.1", "optim.beta2"), ("optim.grad_clip=-1", "optim.grad_clip"),
    ("optim.min_lr_ratio=2", "optim.min_lr_ratio"), ("optim.warmup_steps=-5", "optim.warmup_steps"),
    ("sft.warmup_steps=-1", "sft.warmup_steps"), ("optim.schedule=linear", "optim.schedule"),
    ("sft.schedule=step", "sft.schedule"), ("sft.steps=0", "sft.steps"), ("sft.batch_size=0", "sft.batch_size"),
    ("algo.clip_low=-0.1", "algo.clip_low"), ("algo.clip_high=-0.2", "algo.clip_high"),
    ("algo.kl_coef=-0.1", "algo.kl_coef"), ("algo.kl_placement=advantage", "algo.kl_placement"),
    ("algo.dual_clip=0.5", "algo.dual_clip"), ("algo.overlong_buffer=-1", "algo.overlong_buffer"),
    ("algo.overlong_buffer=100", "algo.overlong_buffer"), ("algo.max_sampling_rounds=0", "algo.max_sampling_rounds"),
    ("algo.kl_target=0", "algo.kl_target"), ("algo.critic_lr=0", "algo.critic_lr"),
    ("algo.critic_warmup_steps=-1", "algo.critic_warmup_steps"), ("algo.objective=ppo", "algo.objective"),
    ("algo.advantage=grpoo", "algo.advantage"), ("algo.aggregation=sum", "algo.aggregation"),
    ("algo.kl_estimator=k4", "algo.kl_estimator"), ("algo.clip_hihg=0.3", "algo.clip_high"),
    ("rollout.group_size=1", "rollout.group_size"), ("rollout.group_size=2.5", "rollout.group_size"),
    ("rollout.prompts_per_step=0", "rollout.prompts_per_step"), ("rollout.max_new_tokens=0", "rollout.max_new_tokens"),
    ("rollout.temperature=0", "rollout.temperature"), ("rollout.temperature=-1", "rollout.temperature"),
    ("rollout.top_p=0", "rollout.top_p"), ("rollout.top_p=1.5", "rollout.top_p"),
    ("sampler.candidates=0.5", "sampler.candidates"),
    ("sampler.target=2", "sampler.target"),
    ("sampler.decay=-1", "sampler.decay"),
    ("rollout.decode_engine=vllm", "rollout.decode_engine"),
    ("sampler.name=greedy", "sampler.name"),
    ("task.heldout_size=0", "task.heldout_size"), ("task.heldout_size=-3", "task.heldout_size"),
    ("task.name=gsm8k", "task.name"), ("task.sudoku4.min_blanks=2", "task.sudoku4"),
    ("task.countdown.sampling=random", "task.countdown.sampling"), ("trainer.steps=0", "trainer.steps"),
    ("trainer.steps=true", "trainer.steps"), ("trainer.minibatches=0", "trainer.minibatches"),
    ("trainer.minibatches=3", "trainer.minibatches"), ("trainer.ppo_epochs=0", "trainer.ppo_epochs"),
    ("trainer.micro_batch_size=0", "trainer.micro_batch_size"), ("trainer.keep_last=0", "trainer.keep_last"),
    ("trainer.eval_every=-1", "trainer.eval_every"), ("trainer.save_every=-1", "trainer.save_every"),
    ("trainer.samples_per_step=-1", "trainer.samples_per_step"), ("trainer.eval_samples=-1", "trainer.eval_samples"),
    ("trainer.threads=-1", "trainer.threads"), ("trainer.thread_mode=processes", "trainer.thread_mode"),
    ("trainer.kernels=triton", "trainer.kernels"), ("trainer.device=tpu", "trainer.device"),
    ("trainer.learners=ddp", "trainer.learners"),
    ("trainer.trackers=wandbb", "trainer.trackers"), ("trainer.trackers=tensorboard,comet", "trainer.trackers"),
    ("reward.timeout_s=-1", "reward.timeout_s"), ("reward.timeout_s=inf", "reward.timeout_s"),
    ("model.kind=seq2seq", "model.kind"), ("model.dtype=float16", "model.dtype"),
    ("model.lora.r=-1", "model.lora.r"), ("model.lora.alpha=0", "model.lora.alpha"),
    ("model.lora.dropout=1", "model.lora.dropout"), ("model=3", "model"), ("seed=abc", "seed"),
    ("estimator.n=0", "estimator.n"),
]

# Each names the field the error must name last: ranges declared on the schema's fields (> x, >= x and
# intervals, in every section and task), ranges that depend on another field, a key given twice (the last
# would silently win) and options of a backend that is not chosen.
RANGES = [
    "algo.kl_horizon=0", "algo.pass_k=0", "algo.tau_pos=0", "algo.tau_neg=-1", "algo.norm_length=0",
    "algo.adv_eps=-1e-6", "algo.gamma=-0.5", "algo.gamma=1.5", "algo.lam=2", "algo.log_ratio_clamp=-1",
    "algo.correction_cap=-2", "algo.value_clip=-0.5", "model.hidden_size=0", "model.num_heads=0",
    "rollout.diffusion_steps=-1", "rollout.block_length=-4", "rollout.threshold=2", "rollout.threshold=0",
    "estimator.t_min=-0.1", "estimator.t_max=1.5", "estimator.beta=0", "expert.rlplus_gamma=-1",
    "task.name=code_file task.code_file.path={FIXTURE} task.code_file.memory_mb=0",
    "task.name=code_file task.code_file.path={FIXTURE} task.code_file.wall_s=-1",
    "task.name=math_file task.math_file.path={FIXTURE} task.math_file.math_timeout_s=-1",
    "task.name=agent_calculator task.agent_calculator.tool_timeout_s=-1",
    "task.name=agent_calculator task.agent_calculator.max_total_tokens=0",
    "algo.advantage=passk algo.pass_k=99",
    "model.kind=diffusion estimator.name=coupled estimator.t_max=0.5 estimator.t_min=0.9",
    "model.kind=diffusion rollout.block_length=5",
    "model.kind=diffusion rollout.block_length=4 rollout.diffusion_steps=6",
    "model.path= model.num_heads=3", "seed=1 seed=2", "algo.kl_coef=0.1 algo.kl_coef=0.2",
    "trainer.rollout_workers=2", "trainer.ray_address=auto", "rollout.vllm_kv_cache_mb=128",
]
CONFIG += [(o, o.split()[-1].partition("=")[0]) for o in RANGES]


@pytest.mark.parametrize(("override", "field"), CONFIG, ids=[o for o, _ in CONFIG])
def test_config_value(override, field, capsys):
    assert_one_line_error(*cli(["config", *override.format(FIXTURE=FIXTURE).split()], capsys), field)


# ---------------------------------------------------------------------------------- recipes

RECIPES = {  # name: (recipe text or None for a directory, extra argv, field)
    "directory": (None, [], "is a directory"),
    "invalid_yaml": ("algo: {clip_high: 0.3\n", [], "not valid YAML at line"),
    "a_list": ("- algo\n- rollout\n", [], "must be a mapping of sections"),
    "unknown_key": ("algo:\n  clip_hihg: 0.3\n", [], "algo.clip_high"),
    "wrong_type": ("rollout:\n  group_size: many\n", [], "rollout.group_size"),
    "section_not_mapping": ("algo: 3\n", [], "algo: expected a section"),
    "bad_value": ("optim:\n  lr: .inf\n", [], "optim.lr"),
    "override_without_value_after_recipe": ("seed: 1\n", ["seed"], "override 'seed': expected KEY=VALUE, e.g. seed="),
    "duplicate_key": ("seed: 1\nseed: 2\n", [], "key 'seed' given twice (line 2)"),
    "duplicate_key_in_a_section": ("algo:\n  kl_coef: 0.1\n  kl_coef: 0.2\n", [], "key 'kl_coef' given twice"),
    "not_utf8": (b"seed: 1  # \xff\xfe\n", [], "is not UTF-8 text"),
    "range_in_a_recipe": ("algo:\n  advantage: gae\n  gamma: 1.5\n", [], "algo.gamma: must be in [0, 1]"),
    "list_of_the_wrong_type": ("model:\n  lora:\n    target_modules: [1, 2]\n", [],
                               "model.lora.target_modules[0]: expected str, got 1"),
}


@pytest.mark.parametrize("name", list(RECIPES))
def test_recipe(name, tmp_path, capsys):
    text, extra, field = RECIPES[name]
    recipe = tmp_path / "recipes" if text is None else tmp_path / "recipe.yaml"
    recipe.mkdir() if text is None else recipe.write_bytes(text if isinstance(text, bytes) else text.encode())
    assert_one_line_error(*cli(["config", str(recipe), *extra], capsys), field)


@pytest.mark.parametrize(("argv", "field"), [
    (["config", "missing.yaml"], "recipe 'missing.yaml' does not exist"),
    (["config", "task.name"], "override 'task.name': expected KEY=VALUE, e.g. task.name=VALUE"),
    (["config", "algo.clip_high"], "override 'algo.clip_high': expected KEY=VALUE"),
    (["config", "seed=1", "=3"], "override '=3': expected KEY=VALUE"),
    (["train", "trainer.steps"], "override 'trainer.steps'"),
    (["config", "seed=1", "trainer.steps=2", "seed=2"], "override 'seed': given twice ('seed=1' and 'seed=2')"),
])
def test_command_line(argv, field, capsys):
    assert_one_line_error(*cli(argv, capsys), field)


# ---------------------------------------------------------------------------------- data

def _jsonl(path: Path, rows: list) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


GOOD = [{"question": f"{i}+1", "answer": str(i + 1)} for i in range(8)]


def _data_case(name: str, tmp: Path) -> tuple[list[str], str]:
    """(overrides, field) of one bad data file."""
    good = _jsonl(tmp / "good.jsonl", GOOD)
    math = ["task.name=math_file"]
    if name == "missing_path":
        return math + [f"task.math_file.path={tmp}/nope.jsonl"], "task.math_file.path"
    if name == "missing_heldout_path":
        return math + [f"task.math_file.path={good}", f"task.math_file.heldout_path={tmp}/nope.jsonl"], \
            "task.math_file.heldout_path"
    if name == "not_utf8":
        path = tmp / "latin1.jsonl"
        path.write_bytes(b'{"question": "1+1", "answer": "2"}\n{"question": "caf\xe9", "answer": "3"}\n')
        return math + [f"task.math_file.path={path}"], "latin1.jsonl:2: not UTF-8"
    if name == "invalid_json":
        return math + [f"task.math_file.path={_jsonl(tmp / 'j.jsonl', [GOOD[0], '{question: 1}'])}"], \
            "j.jsonl:2: invalid JSON"
    if name == "not_an_object":
        return math + [f"task.math_file.path={_jsonl(tmp / 'o.jsonl', [GOOD[0], [1, 2]])}"], \
            "o.jsonl:2: expected a JSON object"
    if name == "missing_prompt_field":
        return math + [f"task.math_file.path={_jsonl(tmp / 'p.jsonl', [{'q': 'x', 'answer': '1'}])}"], \
            "task.math_file.prompt_key"
    if name == "missing_answer_field":
        return math + [f"task.math_file.path={_jsonl(tmp / 'a.jsonl', [{'question': 'x'}])}"], \
            "task.math_file.answer_key"
    if name == "empty_prompt":
        return math + [f"task.math_file.path={_jsonl(tmp / 'ep.jsonl', [*GOOD, {'question': '  ', 'answer': '1'}])}"], \
            "ep.jsonl:9: field 'question' is empty"
    if name == "empty_answer":
        return math + [f"task.math_file.path={_jsonl(tmp / 'e.jsonl', [{'question': 'x', 'answer': ' '}])}"], \
            "field 'answer' is empty"
    if name == "wrong_suffix":
        (tmp / "rows.csv").write_text("question,answer\n1+1,2\n")
        return math + [f"task.math_file.path={tmp}/rows.csv"], "task.math_file.path"
    if name == "empty_heldout_file":
        (tmp / "empty.jsonl").write_text("\n")
        return math + [f"task.math_file.path={good}", f"task.math_file.heldout_path={tmp}/empty.jsonl"], \
            "task.math_file.heldout_path"
    if name == "heldout_split_of_a_file":
        return math + [f"task.math_file.path={good}", "task.math_file.heldout_split=test"], \
            "task.math_file.heldout_split"
    if name == "template_without_prompt":
        return math + [f"task.math_file.path={good}", "task.math_file.prompt_template=Q:"], \
            "task.math_file.prompt_template"
    if name == "everything_held_out":
        return math + [f"task.math_file.path={good}", "task.heldout_size=50"], "leaves no training rows"
    if name == "code_tests_empty":
        path = _jsonl(tmp / "c.jsonl", [{"prompt": "write f", "tests": []}])
        return ["task.name=code_file", f"task.code_file.path={path}"], "field 'tests' is empty"
    if name == "code_test_malformed":
        path = _jsonl(tmp / "c.jsonl", [{"prompt": "write f", "tests": [{"input": "1"}]}])
        return ["task.name=code_file", f"task.code_file.path={path}"], "field 'tests'[0] must be"
    raise KeyError(name)


DATA = ["missing_path", "missing_heldout_path", "not_utf8", "invalid_json", "not_an_object", "missing_prompt_field",
        "empty_prompt", "missing_answer_field", "empty_answer", "wrong_suffix", "empty_heldout_file",
        "heldout_split_of_a_file", "template_without_prompt", "everything_held_out", "code_tests_empty",
        "code_test_malformed"]


@pytest.mark.parametrize("name", DATA)
def test_data(name, tmp_path, capsys):
    overrides, field = _data_case(name, tmp_path)
    out_dir = tmp_path / "runs"
    assert_one_line_error(*cli(["train", *tiny(*overrides), f"trainer.out_dir={out_dir}"], capsys), field)
    assert not out_dir.exists() or not any(out_dir.iterdir())  # no failed run left behind


def test_a_datasets_directory_holds_out_its_test_split(tmp_path):
    datasets = pytest.importorskip("datasets")
    from rlvr.tasks.files import MathFileTask

    rows = [{"question": f"{i}+1", "answer": str(i + 1)} for i in range(10)]
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows[:7]),
                          "test": datasets.Dataset.from_list(rows[7:])}).save_to_disk(str(tmp_path / "d"))
    task = MathFileTask(path=str(tmp_path / "d"), heldout_split="test", heldout_size=5)
    assert [e.answer for e in task.heldout()] == ["8", "9", "10"] and len(task._train) == 7


def test_a_dataset_dict_trains_on_train_and_holds_out_test():
    from rlvr.tasks.dataset import dataset_splits

    train, held = [{"prompt": "a"}], [{"prompt": "b"}]
    assert dataset_splits({"train": train, "test": held}) == (train, held, "train_dataset['train'], held out: "
                                                                           "train_dataset['test']")
    assert dataset_splits({"train": train, "validation": held})[1] is held
    own = [{"prompt": "c"}]
    assert dataset_splits({"train": train, "test": held}, own)[1] is own  # an explicit eval_dataset wins


# ---------------------------------------------------------------------------------- reward functions

# Functions that signal the trainer (os.getpid()) or count their calls in a global run with reward.workers=0:
# in a reward worker, their pid and their globals would be the worker's.
REWARDS = '''
import math, os, signal, sys
from pathlib import Path
calls = {"n": 0}
def nan_always(p, c, **k): return math.nan
def inf_always(p, c, **k): return math.inf
def raises(p, c, **k): raise ValueError("bad reward")
def text(p, c, **k): return "1.0"
def exits(p, c, **k): sys.exit(3)
def nan_sometimes(p, c, **k):
    calls["n"] += 1
    return math.nan if calls["n"] % 2 else float(len(c) % 2)
def term_once(p, c, **k):
    marker = Path(os.environ["RLVR_TEST_MARKER"])
    if not marker.exists():
        marker.write_text("sent")
        os.kill(os.getpid(), getattr(signal, os.environ["RLVR_TEST_SIGNAL"]))
    return float(len(c) % 2)
def term_twice(p, c, **k):
    os.kill(os.getpid(), signal.SIGTERM)
    return 0.0
not_callable = 3
def none_always(p, c, **k): return None
'''


@pytest.fixture
def rewards(tmp_path) -> Path:
    path = tmp_path / "rewards.py"
    path.write_text(REWARDS)
    (tmp_path / "broken.py").write_text("import no_such_module_here\n")
    return path


SPEC_ERRORS = [  # (reward.fn, what the error must say)
    ("score", "expected FILE.py:NAME"), ("{tmp}/nowhere.py:score", "not found"),
    ("{tmp}/rewards.py:missing", "no 'missing' in"), ("{tmp}/rewards.py:not_callable", "is not callable"),
    ("{tmp}/broken.py:f", "importing"), ("no_such_pkg_xyz:f", "cannot import module"),
    ("x*{tmp}/rewards.py:raises", "weight 'x'"), ("{tmp}/rewards.py:raises,,", "empty entry"),
]


@pytest.mark.parametrize(("spec", "says"), SPEC_ERRORS, ids=[s for s, _ in SPEC_ERRORS])
def test_reward_spec(spec, says, rewards, tmp_path, capsys):
    out_dir = tmp_path / "runs"
    argv = ["train", *TINY, f"trainer.out_dir={out_dir}", f"reward.fn={spec.format(tmp=tmp_path)}"]
    code, out, err = cli(argv, capsys)
    assert_one_line_error(code, out, err, f"reward.fn='{spec.format(tmp=tmp_path)}'")
    assert says in err
    assert not out_dir.exists()


@pytest.mark.parametrize(("fn", "first_error"), [
    ("nan_always", "NonFiniteReward: reward is nan"), ("inf_always", "NonFiniteReward: reward is inf"),
    ("raises", "ValueError: bad reward"), ("text", "TypeError: reward must be a number"),
    ("exits", "SystemExit: 3"),
])
def test_a_reward_that_never_scores_stops_the_run_naming_it(fn, first_error, rewards, tmp_path, capsys):
    argv = ["train", *TINY, f"trainer.out_dir={tmp_path}", "trainer.name=r", f"reward.fn={rewards}:{fn}"]
    code, out, err = cli(argv, capsys)
    assert_one_line_error(code, out, err, f"reward user (rewards.py:{fn}) failed on all 4 samples")
    assert first_error in err
    info = json.loads((tmp_path / "r" / "run.json").read_text())
    assert info["status"] == "failed" and info["exit_status"] == 1 and first_error in info["error"]
    assert [m["step"] for m in metrics(tmp_path / "r")] == [0]  # nothing trained, nothing claimed


def test_a_reward_that_never_scores_anything_says_so_once(rewards, tmp_path, capsys):
    argv = ["train", *tiny("trainer.steps=2"), f"trainer.out_dir={tmp_path}", "trainer.name=r",
            f"reward.fn={rewards}:none_always"]
    code, _, err = cli(argv, capsys)
    assert code == 0 and err.count("\n") == 1, err
    assert err.startswith("warning: reward user (rewards.py:none_always) returned None (not scorable) for all 4 ")
    assert [m["reward/user/unscorable"] for m in metrics(tmp_path / "r")[1:]] == [4.0, 4.0]


def test_a_reward_that_is_sometimes_nan_is_counted(rewards, tmp_path, capsys):
    argv = ["train", *tiny("trainer.steps=2"), f"trainer.out_dir={tmp_path}", "trainer.name=r",
            f"reward.fn={rewards}:nan_sometimes", "reward.workers=0"]
    code, _, err = cli(argv, capsys)
    assert code == 0 and err == ""
    steps = metrics(tmp_path / "r")[1:]
    assert [m["reward/user/nonfinite"] for m in steps] == [2.0, 2.0]  # every other of 4 samples
    assert all(m["reward/scorable_frac"] == 0.5 for m in steps)
    samples = [json.loads(line) for line in (tmp_path / "r" / "samples.jsonl").read_text().splitlines()]
    assert None in [s["reward"] for s in samples]  # null, never a bare NaN


def test_a_callable_in_the_config_says_where_it_goes():
    from rlvr import Trainer
    from rlvr.config import Config, RewardConfig, load_config
    from rlvr.errors import ConfigError

    def score(p, c, **k):
        return 1.0

    for make in (lambda: Trainer(overrides={"reward.fn": score}), lambda: Trainer(overrides={"reward": {"fn": score}}),
                 lambda: Trainer(config=Config(reward=RewardConfig(fn=score))),
                 lambda: load_config({"reward": {"fn": score}})):
        with pytest.raises(ConfigError, match=r"^reward.fn: a Python callable cannot go in the config; pass it") as err:
            make()
        assert "\n" not in str(err.value) and "reward_funcs=" in str(err.value)


# ---------------------------------------------------------------------------------- models

@pytest.mark.parametrize(("overrides", "field"), [
    (["model.path=/nonexistent/model"], "model.path"), (["model.path=rlvr:no-such-asset"], "model.path"),
    (["model.path=/etc/hostname"], "model.path"), (["model.kind=diffusion", "model.dtype=bfloat16"], "model.dtype"),
    (["model.kind=diffusion", "model.lora.r=4"], "model.lora.r"), (["model.lora.r=4", "algo.advantage=gae"],
                                                                    "model.lora.r"),
    (["model.lora.target_modules=[]"], "model.lora.target_modules"), (["trainer.device=cuda:7"], "trainer.device"),
    (["model.kind=diffusion", "model.path=rlvr:countdown-warmstart"], "is not a loadable masked-diffusion LM"),
])
def test_model(overrides, field, tmp_path, capsys):
    out_dir = tmp_path / "runs"
    assert_one_line_error(*cli(["train", *tiny(*overrides), f"trainer.out_dir={out_dir}"], capsys), field)
    assert not out_dir.exists() or not any(out_dir.iterdir())


@pytest.mark.parametrize("how", ["truncated_weights", "vocab_below_the_weights"])
def test_a_broken_model_folder(how, tmp_path, capsys):
    model = tmp_path / "model"
    shutil.copytree(Path(__file__).parents[1] / "src/rlvr/assets/countdown-warmstart", model)
    if how == "truncated_weights":
        weights = model / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    else:
        config = json.loads((model / "config.json").read_text())
        (model / "config.json").write_text(json.dumps({**config, "vocab_size": config["vocab_size"] // 2}))
    out_dir = tmp_path / "runs"
    argv = ["train", *tiny(f"model.path={model}"), f"trainer.out_dir={out_dir}"]
    assert_one_line_error(*cli(argv, capsys), "is not a loadable Hugging Face causal LM")
    assert not out_dir.exists() or not any(out_dir.iterdir())


# ---------------------------------------------------------------------------------- sft

def test_sft_on_a_file_task_without_solutions(tmp_path, capsys):
    good = _jsonl(tmp_path / "good.jsonl", GOOD)
    argv = ["sft", *TINY, "task.name=math_file", f"task.math_file.path={good}", "--out", str(tmp_path / "w")]
    assert_one_line_error(*cli(argv, capsys), "task.math_file.solution_key")
    code = _jsonl(tmp_path / "code.jsonl", [{"prompt": "f", "tests": ["assert True"]}] * 4)
    argv = ["sft", *TINY, "task.name=code_file", f"task.code_file.path={code}", "--out", str(tmp_path / "w")]
    assert_one_line_error(*cli(argv, capsys), "no reference solution (what rlvr sft, rm and dpo train on")
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize("case", ["non_empty_out", "base_model_folder", "out_is_a_file"])
def test_sft_out(case, tmp_path, capsys):
    out = tmp_path / "w"
    if case == "non_empty_out":
        out.mkdir()
        (out / "keep.txt").write_text("mine")
        argv, field = ["--out", str(out)], "--overwrite"
    elif case == "base_model_folder":
        base = tmp_path / "base"
        shutil.copytree(Path(__file__).parents[1] / "src/rlvr/assets/countdown-warmstart", base)
        argv, field, out = [f"model.path={base}", "--out", str(base)], "holds the base model", base
    else:
        out.write_text("mine")
        argv, field = ["--out", str(out)], "is a file"
    before = snapshot(tmp_path)
    assert_one_line_error(*cli(["sft", *tiny(*argv)], capsys), field)
    assert snapshot(tmp_path) == before


# ---------------------------------------------------------------------------------- resume

@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A 2-step run with a checkpoint per step (trained once, copied per test)."""
    root = tmp_path_factory.mktemp("finished")
    assert main(["train", *tiny("trainer.steps=2"), f"trainer.out_dir={root}", "trainer.name=r"]) == 0
    return root / "r"


@pytest.fixture
def run_copy(finished_run, tmp_path) -> Path:
    shutil.copytree(finished_run, tmp_path / "r")
    return tmp_path / "r"


def _break(run: Path, how: str) -> None:
    newest = run / "checkpoints" / "step_000002"
    if how == "corrupt_checkpoint":
        (newest / "model.safetensors").write_bytes(b"torn")
    elif how == "unreadable_state":
        (newest / "trainer_state.pt").write_bytes(b"junk")
        checksums = json.loads((newest / "checksums.json").read_text())
        checksums["trainer_state.pt"] = hashlib.sha256(b"junk").hexdigest()
        (newest / "checksums.json").write_text(json.dumps(checksums))


RESUME = [  # (how the run is broken, extra argv, field)
    ("corrupt_checkpoint", ["trainer.steps=3"], "is corrupt (checksum mismatch in model.safetensors)"),
    ("unreadable_state", ["trainer.steps=3"], "is unreadable"),
    ("", ["trainer.steps=3", "optim.lr=1e-3"], "resume: the config differs"),
    ("", ["trainer.steps=3", "algo.objective=gspo"], "--allow-config-change"),
]


@pytest.mark.parametrize(("how", "extra", "field"), RESUME, ids=[f"{h or 'changed'}-{e[-1]}" for h, e, _ in RESUME])
def test_resume(how, extra, field, run_copy, capsys):
    _break(run_copy, how)
    before = snapshot(run_copy)
    assert_one_line_error(*cli(["train", "--resume", str(run_copy), *extra], capsys), field)
    assert snapshot(run_copy) == before  # a refused resume changes nothing


@pytest.mark.parametrize(("argv", "field"), [
    (["train", "--resume", "{tmp}"], "--resume: '{tmp}' is not a run directory"),
    (["train", "--allow-config-change", "seed=1"], "--allow-config-change: only applies with --resume"),
    (["eval", "{tmp}"], "eval: '{tmp}' is not a run directory"),
    (["report", "{tmp}"], "is not a run directory"),
    (["runs", "compare", "{tmp}/missing"], "does not exist"),
])
def test_not_a_run(argv, field, tmp_path, capsys):
    argv = [a.format(tmp=tmp_path) for a in argv]
    assert_one_line_error(*cli(argv, capsys), field.format(tmp=tmp_path))


RUN_TOOLS = [  # (what is wrong, argv with {run} and {tmp}, field)
    ("negative_count", ["eval", "{run}", "--n", "-5"], "--n: must be >= 0"),
    ("plot_onto_a_directory", ["runs", "plot", "{run}", "--out", "{tmp}"], "is a directory; pass a PNG path"),
    ("report_onto_its_metrics", ["report", "{run}", "--out", "{run}/metrics.jsonl"], "inside the run directory"),
    ("export_onto_itself", ["export", "{run}", "{run}", "--force"], "inside the run directory"),
]


@pytest.mark.parametrize("case", [c[0] for c in RUN_TOOLS])
def test_run_tools(case, run_copy, tmp_path, capsys):
    _, argv, field = next(c for c in RUN_TOOLS if c[0] == case)
    before = snapshot(run_copy)
    assert_one_line_error(*cli([a.format(run=run_copy, tmp=tmp_path) for a in argv], capsys), field)
    assert snapshot(run_copy) == before


def test_resume_of_a_finished_run_says_nothing_is_left(run_copy, capsys):
    before = snapshot(run_copy)
    code, out, err = cli(["train", "--resume", str(run_copy)], capsys)
    assert code == 0 and err == "" and out.startswith("nothing to train:") and "trainer.steps=N" in out
    assert snapshot(run_copy) == before


def test_a_failed_runs_error_is_in_its_report(rewards, tmp_path, capsys):
    argv = ["train", *TINY, f"trainer.out_dir={tmp_path}", "trainer.name=r", f"reward.fn={rewards}:raises"]
    assert cli(argv, capsys)[0] == 2
    assert cli(["report", str(tmp_path / "r")], capsys)[0] == 0
    page = (tmp_path / "r" / "report.html").read_text()
    assert "<tr id=error><th>error</th><td>RewardError: reward user (rewards.py:raises) failed" in page


# ---------------------------------------------------------------------------------- full disk

@pytest.fixture
def small_disk(tmpfs) -> Path:
    """A 2 MiB tmpfs (a disk that fills up)."""
    return tmpfs("2m")


def _train(out_dir: Path, name: str, *, steps: int = 4, callbacks=(), extra=()) -> dict:
    from rlvr import Trainer

    overrides = [*tiny(f"trainer.steps={steps}", *extra), f"trainer.out_dir={out_dir}", f"trainer.name={name}"]
    return Trainer(overrides=overrides, callbacks=list(callbacks), echo=lambda *a: None).train()


def _fill_after(step: int, disk: Path, fill):
    def hook(at, metrics):
        if at == step:
            fill(disk)
    return hook


@pytest.mark.parametrize(("fill_after", "save_every", "while_"), [
    (2, 1, "while writing checkpoint step 2 (the partial checkpoint was removed)"),
    (1, 2, "while writing checkpoint step 2"),  # no checkpoint yet: the resume starts over, its logs too
])
def test_a_full_disk_stops_cleanly_and_resume_continues(fill_after, save_every, while_, small_disk, fill_disk,
                                                        tmp_path, capsys):
    from rlvr.errors import DiskFull

    _train(tmp_path / "straight", "s", extra=[f"trainer.save_every={save_every}"])
    with pytest.raises(DiskFull) as err:
        _train(small_disk, "r", callbacks=[_fill_after(fill_after, small_disk, fill_disk)],
               extra=[f"trainer.save_every={save_every}"])
    run = small_disk / "r"
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"disk full: no space left on the device of '{run}' {while_}")
    assert message.endswith(f"continue with rlvr train --resume {run}")
    info = json.loads((run / "run.json").read_text())
    assert info["status"] == "failed" and info["error"] == f"DiskFull: {message}"
    assert not list((run / "checkpoints").glob(".tmp_*")) and not list(run.glob(".*.tmp"))
    assert [m["step"] for m in metrics(run)] == [0, 1, 2]  # step 2 was logged, then its checkpoint failed

    before = snapshot(run)  # resume ON the full disk: one line, nothing touched
    assert_one_line_error(*cli(["train", "--resume", str(run)], capsys), "disk full: no space left")
    assert snapshot(run) == before

    (small_disk / "filler").unlink()
    code, _, err_text = cli(["train", "--resume", str(run)], capsys)
    assert code == 0, err_text
    assert json.loads((run / "run.json").read_text())["status"] == "finished"
    assert without_wall_clock(metrics(run)) == without_wall_clock(metrics(tmp_path / "straight" / "s"))


def test_a_log_line_the_full_disk_cut_is_rolled_back(small_disk, fill_disk):
    from rlvr.tracking.run_dir import RunDir

    run = RunDir(small_disk / "r")
    run.create()
    try:
        run.append(run.metrics_file, {"step": 0})
        fill_disk(small_disk)
        with pytest.raises(OSError) as err:
            run.append(run.metrics_file, {"step": 1, "text": "x" * 100_000})  # more than the last page holds
        assert err.value.errno == errno.ENOSPC
        assert run.metrics_file.read_text() == '{"step": 0}\n'  # no torn line
    finally:
        run.release()  # the lock's open file would keep the disk from being unmounted


def test_a_full_disk_at_the_start_leaves_no_run_behind(small_disk, fill_disk, capsys):
    fill_disk(small_disk)
    code, out, err = cli(["train", *TINY, f"trainer.out_dir={small_disk}", "trainer.name=r"], capsys)
    assert_one_line_error(code, out, err, "disk full: no space left")
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler"]


def test_sft_on_a_full_disk_writes_nothing(small_disk, fill_disk, capsys):
    (small_disk / "out").mkdir()
    fill_disk(small_disk)
    argv = ["sft", *TINY, "sft.steps=1", "sft.batch_size=2", "--out", str(small_disk / "out" / "w")]
    assert_one_line_error(*cli(argv, capsys), "disk full: no space left on the device of --out")
    assert list((small_disk / "out").iterdir()) == []


# ---------------------------------------------------------------------------------- signals

@pytest.mark.parametrize(("signal_name", "code"), [("SIGTERM", 143), ("SIGINT", 130)])
def test_a_signal_stops_after_the_step_and_resume_continues(signal_name, code, rewards, tmp_path, capsys,
                                                            monkeypatch, request):
    monkeypatch.setenv("RLVR_TEST_MARKER", str(tmp_path / "sent"))
    monkeypatch.setenv("RLVR_TEST_SIGNAL", signal_name)
    # A suite started in the background gets SIGINT ignored, which a run keeps: give it a terminal's.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    request.addfinalizer(lambda: signal.signal(signal.SIGINT, previous))
    base = ["train", *tiny("trainer.steps=3"), f"trainer.out_dir={tmp_path}", "trainer.name=r",
            f"reward.fn={rewards}:term_once", "reward.workers=0"]
    got, out, err = cli(base, capsys)
    assert got == code and err == f"interrupted: {signal_name}: run interrupted after step 1\n", (out, err)
    info = json.loads((tmp_path / "r" / "run.json").read_text())
    assert info["status"] == "interrupted" and info["signal"] == signal_name and info["final"]["step"] == 1
    assert (tmp_path / "r" / "checkpoints" / "step_000001").is_dir()
    assert cli(["train", "--resume", str(tmp_path / "r")], capsys)[0] == 0
    assert [m["step"] for m in metrics(tmp_path / "r")] == [0, 1, 2, 3]


def test_a_second_signal_stops_at_once_and_leaves_no_partial_write(rewards, tmp_path, capsys):
    argv = ["train", *tiny("trainer.steps=3"), f"trainer.out_dir={tmp_path}", "trainer.name=r",
            f"reward.fn={rewards}:term_twice", "reward.workers=0"]
    got, out, err = cli(argv, capsys)
    assert got == 143 and err.count("\n") == 1 and err.startswith("interrupted: SIGTERM"), (out, err)
    run = tmp_path / "r"
    info = json.loads((run / "run.json").read_text())
    assert info["status"] == "interrupted" and info["exit_status"] == 143
    assert not list((run / "checkpoints").glob(".tmp_*"))
    assert [m["step"] for m in metrics(run)] == [0]  # stopped inside step 1: nothing half-logged


# ---------------------------------------------------------------------------------- run tools

def test_a_long_legend_leaves_the_panels_their_width(tmp_path, capsys):
    import sys
    import warnings

    sys.path.insert(0, str(Path(__file__).parent / "tracking"))
    from fake_runs import make_run

    for seed in (0, 1):
        make_run(tmp_path / "runs", f"ppo_s{seed}", seed=seed)
        make_run(tmp_path / "runs", f"cispo_s{seed}", seed=seed,
                 overrides=("algo.objective=cispo", "optim.lr=3e-4", "rollout.group_size=8", "trainer.keep_last=7"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "constrained_layout not applied because axes sizes collapsed"
        code, out, _ = cli(["runs", "compare", str(tmp_path / "runs"), "--out", str(tmp_path / "c")], capsys)
    assert code == 0
    rows = [line.split("|")[1].strip() for line in out.splitlines() if line.startswith("| ")][1:]
    # the clip widths follow the objective and stay out; the keys are named by their last part
    assert sorted(rows) == ["objective=cispo, lr=0.0003, group_size=8, keep_last=7",
                            "objective=ppo_clip, lr=0.0001, group_size=16, keep_last=2"]


def test_a_resumed_runs_record_keeps_the_earlier_end_apart(rewards, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("RLVR_TEST_MARKER", str(tmp_path / "sent"))
    monkeypatch.setenv("RLVR_TEST_SIGNAL", "SIGTERM")
    argv = ["train", *tiny("trainer.steps=2"), f"trainer.out_dir={tmp_path}", "trainer.name=r",
            f"reward.fn={rewards}:term_once", "reward.workers=0"]
    assert cli(argv, capsys)[0] == 143
    assert cli(["train", "--resume", str(tmp_path / "r")], capsys)[0] == 0
    info = json.loads((tmp_path / "r" / "run.json").read_text())
    assert info["status"] == "finished" and "signal" not in info and info["exit_status"] == 0
    [earlier] = info["earlier_ends"]
    assert earlier["status"] == "interrupted" and earlier["signal"] == "SIGTERM" and earlier["exit_status"] == 143
