"""One case per class of bad input a new user makes: values the schema let through that overflow below
it, knobs without a range, fixed-set options, a TRL name beside the field it sets, an unreachable
Countdown bucket, a loss that goes non-finite, and the launcher's environment. Each ends in one line
naming the field (or variable) and the fix, exit 2, never a traceback, a hang or a run that "finishes"
on nonsense. Config cases cost milliseconds; one tiny training step shows the non-finite loss end to end.
"""

from __future__ import annotations

import dataclasses
import json
import math
import typing

import pytest

from rlvr.cli import main
from rlvr.config.schema import Config, section_type
from rlvr.errors import ConfigError
from rlvr.runtime.distributed import launched_world
from rlvr.tasks.countdown import Countdown
from rlvr.trainer.nonfinite import nonfinite_loss

TINY = ["model.path=", "model.hidden_size=16", "model.num_layers=1", "model.num_heads=2",
        "model.intermediate_size=32", "rollout.prompts_per_step=2", "rollout.group_size=2",
        "rollout.max_new_tokens=4", "task.heldout_size=2", "trainer.threads=1", "trainer.steps=1",
        "trainer.eval_every=0", "trainer.save_every=1"]


def _error(capsys, argv: list[str]) -> str:
    capsys.readouterr()
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in out + err, err
    return err


def _numeric_leaves(cls, prefix: str = ""):
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        inner = section_type(hints[f.name])
        if inner is not None:
            yield from _numeric_leaves(inner, f"{prefix}{f.name}.")
        elif {int, float} & set(typing.get_args(hints[f.name]) or (hints[f.name],)):
            yield f"{prefix}{f.name}", f


def test_every_numeric_field_declares_a_range():
    """A knob without a range takes any number, and 1e308 or -1 "trains" (a checkpoint of NaNs, a
    penalty that pays): every int and float field says what it accepts, on the field."""
    leaves = dict(_numeric_leaves(Config))
    assert len(leaves) > 150  # the walk reaches every section, the task sections too
    bare = [name for name, f in leaves.items() if "range" not in f.metadata and "choices" not in f.metadata]
    assert not bare, f"numeric fields without ranged(...): {bare}"


OVERFLOW = [  # (override, the field the error names): each was accepted, then overflowed or trained on nonsense
    ("seed=1000000000000000000000000000000", "seed"),
    ("seed=-1", "seed"),
    ("sampler.name=mopps sampler.candidates=1e308", "sampler.candidates"),
    ("trainer.collective_timeout_s=1e308", "trainer.collective_timeout_s"),
    ("trainer.collective_timeout_s=-5", "trainer.collective_timeout_s"),
    ("algo.objective=kl_cov algo.cov_ratio=-1", "algo.cov_ratio"),
    ("algo.objective=nft algo.nft_eps=-1", "algo.nft_eps"),
    ("optim.lr=1e308", "optim.lr"),
    ("algo.overlong_buffer=4 algo.overlong_factor=-1", "algo.overlong_factor"),
    ("algo.objective=clip_cov algo.cov_lb=5 algo.cov_ub=1", "algo.cov_lb"),
    ("algo.objective=wd1 algo.wd1_psi=0", "algo.wd1_psi"),
    ("rollout.repetition_penalty=1e-300", "rollout.repetition_penalty"),
    ("sampler.name=dots sampler.temperature=1e-300", "sampler.temperature"),
    ("sampler.name=coba sampler.concentration=1e308", "sampler.concentration"),
    ("task.name=agent_guess task.agent_guess.reward_decay=-1", "task.agent_guess.reward_decay"),
    ("reward.model_clip=.nan", "reward.model_clip"),
    ("algo.entropy_coef=.inf", "algo.entropy_coef"),
    ("preference.beta=0", "preference.beta"), ("preference.beta=-1", "preference.beta"),
    ("preference.batch_size=0", "preference.batch_size"), ("preference.batch_size=-1", "preference.batch_size"),
    ("sft.batch_size=0", "sft.batch_size"), ("preference.heldout_pairs=-1", "preference.heldout_pairs"),
    ("preference.eval_every=-1", "preference.eval_every"), ("preference.save_every=-2", "preference.save_every"),
    ("expert.per_step=-1", "expert.per_step"), ("trainer.samples_per_step=-3", "trainer.samples_per_step"),
    ("task.countdown.num_count=1", "task.countdown.num_count"),
    ("reward.model_normalize=whiten", "reward.model_normalize"),  # a fixed set, checked whatever reads it
    ("rollout.speculative=true", "rollout.speculative"),  # nothing recurs to draft from
    ("reward.judge_verdicts=Y,Y", "reward.judge_verdicts"), ("reward.judge_verdicts=Good", "reward.judge_verdicts"),
]


@pytest.mark.parametrize(("override", "field"), OVERFLOW, ids=[o for o, _ in OVERFLOW])
def test_a_value_out_of_its_range_is_one_line(override, field, capsys):
    err = _error(capsys, ["config", *override.split()])
    assert err.startswith(f"error: {field}: ") and any(w in err for w in ("must be", "below", "set ")), err


def test_a_huge_int_is_shown_short(capsys):
    err = _error(capsys, ["config", "seed=" + "9" * 400])
    assert "got ~1e+400" in err and len(err) < 200, err


@pytest.mark.parametrize("where", ["command line", "recipe"])
def test_a_trl_name_beside_the_field_it_sets_is_refused(where, tmp_path, capsys):
    """`num_generations=4 rollout.group_size=8`: one of the two silently won."""
    if where == "recipe":
        recipe = tmp_path / "r.yaml"
        recipe.write_text("num_generations: 4\nrollout:\n  group_size: 8\n")
        argv = ["config", str(recipe)]
    else:
        argv = ["config", "num_generations=4", "rollout.group_size=8"]
    err = _error(capsys, argv)
    assert f"num_generations: given in the {where}" in err or f"num_generations: given on the {where}" in err
    assert "rollout.group_size" in err
    capsys.readouterr()
    assert main(["config", "num_generations=4"]) == 0 and "group_size: 4" in capsys.readouterr().out


def test_an_unreachable_countdown_bucket_is_refused_at_once():
    """3 numbers up to 9 make at most 9·9·9 = 729: targets 900-999 once drew forever."""
    with pytest.raises(ConfigError, match=r"task\.countdown\.buckets: targets from 900 are out of reach of 3 "
                                          r"numbers up to 9 \(at most 729"):
        Countdown(buckets="3:900-999", heldout_size=2)
    assert Countdown(buckets="3:1-20", heldout_size=2).sample(3)  # a reachable bucket still draws


# ---------------------------------------------------------------------------------- non-finite loss

LOSS_NAN = {"loss/policy": math.nan, "actor/grad_norm": math.nan, "actor/entropy": 1.2, "reward/mean": 0.5,
            "reward/std": 0.3}
SAMPLED_NAN = {**LOSS_NAN, "actor/entropy": math.nan, "actor/ratio": math.nan}
CONFIG = {"algo": {"kl_coef": 0.0, "entropy_coef": 0.0}, "rollout": {"temperature": 1.0}, "optim": {"lr": 1e-4}}


@pytest.mark.parametrize(("metrics", "change", "knob"), [
    (LOSS_NAN, ("algo", "kl_coef", 1e308), "algo.kl_coef"),
    (LOSS_NAN, ("algo", "entropy_coef", -1e300), "algo.entropy_coef"),
    (SAMPLED_NAN, ("rollout", "temperature", 1e-300), "rollout.temperature"),
    ({**LOSS_NAN, "reward/std": math.inf}, ("algo", "kl_coef", 0.0), "reward"),
    ({**LOSS_NAN, "reward/mean": 1e300}, ("algo", "kl_coef", 0.0), "reward"),
    (LOSS_NAN, ("algo", "kl_coef", 0.01), "optim.lr"),  # nothing else stands out: the usual suspects
])
def test_a_non_finite_loss_names_the_knob_behind_it(metrics, change, knob):
    config = json.loads(json.dumps(CONFIG))
    config[change[0]][change[1]] = change[2]
    error = nonfinite_loss(3, metrics, config)
    assert isinstance(error, ConfigError) and isinstance(error, FloatingPointError)
    assert str(error).startswith(f"{knob}: non-finite loss at step 3") and "\n" not in str(error), error


def test_a_kl_weight_that_overflows_stops_the_run_naming_it(tmp_path, capsys):
    err = _error(capsys, ["train", *TINY, f"trainer.out_dir={tmp_path}", "trainer.name=r", "algo.kl_coef=1e308"])
    assert err.startswith("error: algo.kl_coef: non-finite loss at step 1") and "optim.lr" not in err, err
    manifest = json.loads((tmp_path / "r" / "run.json").read_text())
    assert manifest["status"] == "failed" and "algo.kl_coef" in json.dumps(manifest)
    assert not list((tmp_path / "r" / "checkpoints").glob("step_*"))  # no checkpoint of non-finite weights


# ---------------------------------------------------------------------------------- environment

@pytest.mark.parametrize(("env", "says"), [
    ({"WORLD_SIZE": "two"}, "WORLD_SIZE='two' in the environment is not a whole number"),
    ({"RANK": "1"}, "RANK=1 is set without WORLD_SIZE"),
    ({"RANK": "3", "WORLD_SIZE": "2"}, "need 0 <= RANK < WORLD_SIZE"),
    ({"LOCAL_WORLD_SIZE": "-1", "WORLD_SIZE": "2", "RANK": "0"}, "LOCAL_WORLD_SIZE='-1' in the environment"),
])
def test_launcher_variables_are_checked(env, says, monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    assert launched_world() == (0, 1, 1)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=says.replace("(", r"\(").replace("[", r"\[")):
        launched_world()


def test_a_wandb_mode_wandb_does_not_know_is_one_line(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    from rlvr.tracking.tracker import make_trackers

    monkeypatch.setenv("WANDB_MODE", "sideways")
    with pytest.raises(ConfigError, match=r"WANDB_MODE='sideways' in the environment: must be one of offline"):
        make_trackers(["wandb"], tmp_path)
    assert not (tmp_path / "wandb").exists()



# ---------------------------------------------------------------------------------- output paths

@pytest.mark.parametrize("command", ["train", "sft"])
@pytest.mark.parametrize("how", ["name_too_long", "a_file_as_out_dir"])
def test_a_run_path_the_os_refuses_is_one_line(command, how, tmp_path, capsys):
    (tmp_path / "plain").write_text("x\n")
    out_dir, name = (tmp_path, "c" * 300) if how == "name_too_long" else (tmp_path / "plain", "r")
    place = ([f"trainer.out_dir={out_dir}", f"trainer.name={name}"] if command == "train"
             else ["--out", str(out_dir / name), "sft.steps=1"])
    err = _error(capsys, [command, *TINY, *place])
    assert "cannot use the path" in err and "choose another path" in err and len(err) < 300, err
    assert (tmp_path / "plain").read_text() == "x\n" and sorted(p.name for p in tmp_path.iterdir()) == ["plain"]


# ---------------------------------------------------------------------------------- rm and dpo

@pytest.mark.parametrize("command", ["dpo", "rm"])
def test_sigterm_during_a_preference_run_records_it_and_keeps_the_weights(command, tmp_path, capsys, monkeypatch):
    """SIGTERM once killed `rlvr dpo` / `rlvr rm` outright: run.json stayed `running` for good."""
    import os
    import signal

    from rlvr.preference.run import PreferenceRun

    log = PreferenceRun.log

    def log_then_signal(self, step, metrics):
        log(self, step, metrics)
        if step == 1:
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(PreferenceRun, "log", log_then_signal)
    capsys.readouterr()
    code = main([command, *TINY, f"trainer.out_dir={tmp_path}", "trainer.name=p", "preference.steps=4",
                 "preference.pairs=4", "preference.heldout_pairs=2", "preference.batch_size=2"])
    err = capsys.readouterr().err
    assert code == 143 and "Traceback" not in err, err
    manifest = json.loads((tmp_path / "p" / "run.json").read_text())
    assert manifest["status"] == "interrupted" and manifest["signal"] == "SIGTERM", manifest
    steps = [json.loads(line)["step"] for line in (tmp_path / "p" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1]
    assert [p.name for p in (tmp_path / "p" / "checkpoints").iterdir() if p.name.startswith("step_")] == ["step_000001"]


@pytest.mark.parametrize(("margin", "says"), [('"big"', "margin 'big'"), ("1e999", "margin inf"),
                                              ("true", "margin True")])
def test_a_pair_margin_that_is_not_a_number_is_one_line(margin, says, tmp_path, capsys):
    data = tmp_path / "pairs.jsonl"
    row = '{"prompt": "3 4>7:", "chosen": "3+4", "rejected": "3*4", "margin": MARGIN}\n'.replace("MARGIN", margin)
    data.write_text(row * 4)
    err = _error(capsys, ["rm", *TINY, f"trainer.out_dir={tmp_path}", f"preference.data={data}",
                          "preference.steps=1"])
    assert "preference.data:" in err and says in err and "finite number" in err, err


@pytest.mark.parametrize(("overrides", "field"), [
    (["preference.process=true", "preference.step_separator="], "preference.step_separator"),
    (["reward.model_steps=min", "reward.model_step_separator="], "reward.model_step_separator"),
])
def test_an_empty_step_separator_is_one_line(overrides, field, capsys):
    assert _error(capsys, ["config", *overrides]).startswith(f"error: {field}: must not be empty")


def test_dpo_without_solutions_does_not_say_sft(tmp_path, capsys):
    """The message once named `rlvr sft` to a user who ran `rlvr dpo`."""
    code = tmp_path / "code.jsonl"
    code.write_text('{"prompt": "f", "tests": ["assert True"]}\n' * 4)
    err = _error(capsys, ["dpo", *TINY, "task.name=code_file", f"task.code_file.path={code}",
                          f"trainer.out_dir={tmp_path}", "preference.steps=1"])
    assert "no reference solution (what rlvr sft, rm and dpo train on" in err and "for rlvr sft;" not in err


@pytest.mark.parametrize("command", ["dpo", "rm"])
def test_a_pair_longer_than_the_models_positions_is_one_line(command, tmp_path, capsys):
    """A fresh tiny model has model.max_seq_len=64 positions; a 200-character answer once trained past them."""
    data = tmp_path / "pairs.jsonl"
    rows = [{"prompt": "3 4>7:", "chosen": "3+4", "rejected": "3*4"}] * 3
    rows.append({"prompt": "3 4>7:", "chosen": "3+4", "rejected": "4" * 200})
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    err = _error(capsys, [command, *TINY, f"trainer.out_dir={tmp_path}", f"preference.data={data}",
                          "preference.steps=1", "preference.heldout_pairs=1"])
    assert "preference.data: pair 4 is" in err and "over the model's 64 positions" in err, err
    assert not list(tmp_path.glob("*/metrics.jsonl"))  # refused before any run was started


def test_a_reward_model_run_is_not_resumed_or_evaluated_as_a_policy(tmp_path, capsys):
    """`--resume` of an `rlvr rm` run was a KeyError; `rlvr eval` of one scored a classifier as a generator."""
    assert main(["rm", *TINY, f"trainer.out_dir={tmp_path}", "trainer.name=r", "preference.steps=1",
                 "preference.pairs=4", "preference.heldout_pairs=2", "preference.batch_size=2"]) == 0
    run = tmp_path / "r"
    before = (run / "run.json").read_text()
    err = _error(capsys, ["train", *TINY, "--resume", str(run)])
    assert "is a `rlvr rm` run, which `rlvr train --resume` cannot continue" in err, err
    err = _error(capsys, ["eval", str(run), "--n", "2"])
    assert "is a reward model (`rlvr rm`)" in err and "reward.fn" in err, err
    assert (run / "run.json").read_text() == before


def test_a_chat_row_longer_than_the_models_positions_is_one_line(tmp_path, capsys):
    """Chat SFT once trained past the model's positions (`sft.data` rows are rendered whole)."""
    from rlvr.models.causal_lm import tiny_llama
    from rlvr.models.tokenizer import char_tokenizer

    tokenizer = char_tokenizer()
    tokenizer.chat_template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}|{% endfor %}"
    base = tmp_path / "base"
    tiny_llama(len(tokenizer), hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32, max_seq_len=48,
               seed=0).save_pretrained(base)
    tokenizer.save_pretrained(base)
    short = {"messages": [{"role": "user", "content": "2+2"}, {"role": "assistant", "content": "4"}]}
    long = {"messages": [{"role": "user", "content": "2+2"}, {"role": "assistant", "content": "4" * 100}]}
    data = tmp_path / "chat.jsonl"
    data.write_text(json.dumps(short) + "\n" + json.dumps(long) + "\n")
    err = _error(capsys, ["sft", f"model.path={base}", f"sft.data={data}", "sft.steps=1", "trainer.threads=1",
                          "--out", str(tmp_path / "out")])
    assert "sft.data: conversation 2 is" in err and "over the model's 48 positions" in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("threads", "local", "fix"), [
    (1, 4, "start at most 2 ranks here (torchrun --nproc_per_node 2)"),  # once: "set trainer.threads=1", as it was
    (2, 2, "set trainer.threads=1 or start fewer ranks"),
])
def test_too_many_ranks_for_the_cores_names_a_fix_that_changes_something(threads, local, fix, monkeypatch):
    import torch

    from rlvr.runtime.distributed import init_learners

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", str(local))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local))
    with pytest.raises(ConfigError, match=r"trainer\.threads: .*; " + fix.replace("(", r"\(").replace(")", r"\)")):
        init_learners(device=torch.device("cpu"), threads=threads, cores=2, timeout_s=1.0)
