"""Inputs in the wrong form where a user writes them: chat prompts and callables passed to the API, TRL or
verl launch files, a judge's mode, YAML merge keys in a recipe, and what a TRL-form reward returns. Each
bad one is one line naming the argument, field or file and the fix (exit 2 from the CLI, a ConfigError
from the API), before any model loads; the TRL forms TRL itself accepts train as TRL reads them.
"""

from __future__ import annotations

import pytest
from test_bad_input_classes import _error  # exit 2, one `error:` line, no traceback

from rlvr.api import Trainer
from rlvr.cli import main
from rlvr.errors import ConfigError

TINY = {"model.path": "", "model.hidden_size": 16, "model.num_layers": 1, "model.num_heads": 2,
        "model.intermediate_size": 32, "rollout.prompts_per_step": 2, "rollout.group_size": 2,
        "rollout.max_new_tokens": 4, "trainer.threads": 1, "trainer.steps": 1, "trainer.eval_every": 0,
        "trainer.save_every": 0}
USER = [{"role": "user", "content": "2+2?"}]


def _refused(**kwargs) -> str:
    with pytest.raises(ConfigError) as info:
        Trainer(**kwargs)
    assert "\n" not in str(info.value), info.value
    return str(info.value)


def _score(completions, **kwargs):
    return [1.0] * len(completions)


# ---------------------------------------------------------------------------------- API chat prompts

@pytest.mark.parametrize(("prompt", "says"), [
    ([{"role": "wizard", "content": "hi"}], "message 1 has role 'wizard'; roles are system, user, assistant, tool"),
    (["hi", "there"], "message 1 is a str, not a {\"role\", \"content\"} dict"),
    ([{"role": "user"}], "message 1's content is missing, not text"),
    ([{"role": "user", "content": 3}], "message 1's content is int, not text"),
    ([], "the conversation is empty"),
])
def test_api_chat_prompts_are_checked_as_conversations(prompt, says, tmp_path):
    """Before: role "wizard", plain strings and missing content rendered and trained; [] crashed in the template."""
    rows = [{"prompt": USER}] * 6 + [{"prompt": prompt}] + [{"prompt": USER}] * 3
    err = _refused(reward_funcs=_score, train_dataset=rows, overrides={**TINY, "trainer.out_dir": str(tmp_path)})
    assert err.startswith("train_dataset[6]: field 'prompt': " + says), err
    assert not list(tmp_path.iterdir())


def test_an_sft_conversation_gets_the_same_reasons(tmp_path, capsys):
    data = tmp_path / "chat.jsonl"
    data.write_text('{"messages": [{"role": "wizard", "content": "hi"}, {"role": "assistant", "content": "4"}]}\n')
    err = _error(capsys, ["sft", *(f"{k}={v}" for k, v in TINY.items()), f"sft.data={data}", "sft.steps=1",
                          "--out", str(tmp_path / "out")])
    assert "sft.data: " in err and "message 1 has role 'wizard'" in err, err


def test_correct_fn_and_callbacks_that_cannot_take_the_call_are_refused_at_start(tmp_path):
    """Before: a TypeError at the first step, after the model had loaded and the warm start had run."""
    rows = [{"prompt": "2+2=", "answer": "4"}] * 10
    kwargs = dict(reward_funcs=_score, train_dataset=rows, overrides={**TINY, "trainer.out_dir": str(tmp_path)})
    err = _refused(**kwargs, correct_fn=lambda completion: True)
    assert err.startswith("correct_fn: is called as (prompt, completion, **columns)"), err

    class Hook:
        def on_step_end(self, step):
            return None

    err = _refused(**kwargs, callbacks=[Hook()])
    assert err.startswith("callbacks[0]: Hook.on_step_end: is called as (step, metrics)"), err
    assert _refused(**kwargs, callbacks=[lambda: None]).startswith("callbacks[0]: <lambda>: is called as (step, ")
    Trainer(**kwargs, correct_fn=lambda prompt, completion, answer: True, callbacks=[lambda step, metrics: None])


# ---------------------------------------------------------------------------------- launch files

@pytest.mark.parametrize(("flag", "name", "text", "says"), [
    ("--from-trl", "launch.sh", '--num_generations 4 --run_name "oops\n', "cannot split it as a shell does"),
    ("--from-trl", "args.txt", "--beta 0.1 --report_to 'none\n", "cannot split it as a shell does"),
    ("--from-verl", "run.sh", 'python3 -m verl.trainer.main_ppo data.train_batch_size="8\n',
     "cannot split it as a shell does"),
    ("--from-verl", "config.json", '{"algorithm": {', "not valid JSON"),
])
def test_a_launch_file_that_does_not_parse_is_one_line(flag, name, text, says, tmp_path, capsys):
    """Before: shlex's "No closing quotation" ValueError and a JSONDecodeError, as tracebacks."""
    path = tmp_path / name
    path.write_text(text)
    err = _error(capsys, ["config", flag, str(path)])
    assert err.startswith(f"error: {flag} '{path}': {says}"), err


def test_a_non_utf8_trl_file_is_one_line(tmp_path, capsys):
    path = tmp_path / "grpo.yaml"
    path.write_bytes(b"num_generations: 4\nrun_name: caf\xe9\n")
    assert "is not UTF-8 text (line 2" in _error(capsys, ["config", "--from-trl", str(path)])


# ---------------------------------------------------------------------------------- fixed sets, recipes

def test_judge_mode_is_a_fixed_set(capsys):
    """Before: `reward.judge_mode=vibes` loaded, and was refused only when a judge was built."""
    err = _error(capsys, ["config", "reward.judge_mode=vibes"])
    assert err.startswith("error: reward.judge_mode: must be one of 'verdict', 'score', got 'vibes'"), err


@pytest.mark.parametrize(("text", "says"), [
    ("trainer:\n  <<: 5\n", "the merge key (<<) at line 2 merges a scalar; merge keys are supported"),
    ("trainer:\n  <<: [*nowhere]\n", "found undefined alias 'nowhere' at line 2; anchor the value first"),
    ("defaults: &d {steps: 3}\ntrainer:\n  <<: *d\n", "unknown config key 'defaults'; run `rlvr config` to list "
     "valid keys (a block that holds anchors for `<<: *name` merges goes under a key starting with x-)"),
])
def test_a_merge_key_is_supported_and_its_mistakes_say_so(text, says, tmp_path, capsys):
    """Before: "not valid YAML; fix its syntax" for a merge of no mapping, and no place for the anchors."""
    recipe = tmp_path / "r.yaml"
    recipe.write_text(text)
    assert says in _error(capsys, ["config", str(recipe)])
    recipe.write_text("x-defaults: &d {steps: 3, threads: 1}\ntrainer:\n  <<: *d\n  steps: 5\n")
    capsys.readouterr()
    assert main(["config", str(recipe)]) == 0
    out = capsys.readouterr().out
    assert "  steps: 5\n" in out and "  threads: 1\n" in out and "x-defaults" not in out


# ---------------------------------------------------------------------------------- TRL-form returns

def _train(reward_funcs, rows, tmp_path) -> dict:
    trainer = Trainer(reward_funcs=reward_funcs, train_dataset=rows, echo=lambda *a: None,
                      overrides={**TINY, "trainer.out_dir": str(tmp_path)})
    return trainer.train()


@pytest.mark.parametrize("kind", ["torch", "numpy"])
def test_a_trl_reward_returning_a_1d_tensor_trains_as_trl_reads_it(kind, tmp_path):
    """Before: refused ("returned Tensor for 2 completions"), though TRL takes it."""
    import numpy as np
    import torch

    def lengths(completions, **kwargs):
        values = [float(len(c)) + 0.5 for c in completions]
        return torch.tensor(values) if kind == "torch" else np.array(values, dtype=np.float32)

    final = _train(lengths, [{"prompt": f"{i}+1="} for i in range(10)], tmp_path)
    assert final["reward/user/errors"] == 0 and final["reward/scorable_frac"] == 1.0
    assert final["reward/user/mean"] == 4.5  # 4 new tokens of one character each, + 0.5


@pytest.mark.parametrize(("value", "says"), [("2d", "returned a 2-D Tensor of shape (2, 1) for 2 completions"),
                                             ("0d", "returned a 0-D Tensor of shape () for 2 completions")])
def test_a_trl_reward_returning_another_shape_is_one_line(value, says, tmp_path):
    import torch

    def shaped(completions, **kwargs):
        return torch.ones(len(completions), 1) if value == "2d" else torch.tensor(1.0)

    err = _refused(reward_funcs=shaped, train_dataset=[{"prompt": "1+1="}] * 10,
                   overrides={**TINY, "trainer.out_dir": str(tmp_path)})
    assert err.startswith("reward_funcs: user " + says) and "1-D tensor or array" in err, err


def test_a_trl_none_means_not_applicable_beside_other_functions(tmp_path):
    """TRL sums the functions with `nansum`: math rows scored by one, code rows by the other. Before, every
    sample had a None from one of them and was unscorable: scorable_frac 0, nothing trained."""
    def math_reward(completions, kind, **kwargs):
        return [1.0 if k == "math" else None for k in kind]

    def code_reward(completions, kind, **kwargs):
        return [0.5 if k == "code" else None for k in kind]

    rows = [{"prompt": f"{i}+1=", "kind": "math" if i % 2 else "code"} for i in range(10)]
    final = _train([math_reward, code_reward], rows, tmp_path)
    assert final["reward/scorable_frac"] == 1.0
    assert final["reward/mean"] in (0.5, 0.75, 1.0)  # two prompts: code 0.5 / math 1.0, each group whole
    assert final["reward/math_reward/unscorable"] + final["reward/code_reward/unscorable"] == 4
    alone = _train([math_reward], rows, tmp_path / "alone")  # one function's None: not scorable, as in TRL
    assert alone["reward/scorable_frac"] == 1.0 - alone["reward/user/unscorable"] / 4
