"""A run that can learn nothing warns once, naming why: ties in every group, a zero gradient, every
completion truncated (`rlvr.tracking.signal.NoSignal`), and a run with signal does not."""

from __future__ import annotations

from rlvr.cli import main
from rlvr.tracking.signal import NoSignal

TINY = ["model.path=", "model.hidden_size=32", "model.num_layers=2", "model.num_heads=2", "model.intermediate_size=64",
        "rollout.prompts_per_step=2", "rollout.group_size=4", "rollout.max_new_tokens=8", "task.heldout_size=4",
        "trainer.eval_every=0", "trainer.threads=1", "trainer.steps=3"]


def test_each_reason_warns_once_after_its_run_of_steps():
    watch = NoSignal(patience=3)
    tie = {"batch/kept_group_rate": 0.0, "actor/grad_norm": 0.2, "response/truncation_rate": 0.5}
    moving = {"batch/kept_group_rate": 0.5, "actor/grad_norm": 0.2, "response/truncation_rate": 1.0}
    assert [watch.check(m) for m in (tie, tie, moving, tie, tie)] == [[], [], [], [], []]  # the run restarts
    warned = watch.check(tie)
    assert len(warned) == 1 and warned[0].startswith("no group with varying rewards for 3 steps")
    assert watch.check(tie) == []  # once
    assert watch.check(moving) == [] and watch.check(moving) == []  # truncated 2 steps in a row so far
    last = watch.check({**moving, "actor/grad_norm": 0.0})  # the third; a zero gradient's first
    assert len(last) == 1 and last[0].startswith("every completion ran to rollout.max_new_tokens for 3 steps")
    without_dynamic = NoSignal(patience=1)  # no kept_group_rate: the zero-variance fraction decides
    assert without_dynamic.check({"batch/zero_variance_group_frac": 0.5}) == []
    assert without_dynamic.check({"batch/zero_variance_group_frac": 1.0})[0].startswith("no group with varying")


def test_a_random_model_with_dynamic_sampling_says_it_learns_nothing(tmp_path, capsys):
    assert main(["train", *TINY, f"trainer.out_dir={tmp_path}"]) == 0
    out = capsys.readouterr().out
    warnings = [line for line in out.splitlines() if line.startswith("warning:")]
    assert any(w.startswith("warning: no group with varying rewards for 3 steps") for w in warnings), out
    assert len(warnings) == len(set(warnings)) and len(warnings) <= 3


def test_a_run_whose_rewards_vary_does_not_warn_of_ties(tmp_path, capsys):
    vowels = tmp_path / "vowels.py"
    vowels.write_text("def score(prompt, completion, **example):\n"
                      "    return sum(c in 'aeiou' for c in completion) / 8\n")
    assert main(["train", *TINY, f"reward.fn={vowels}:score", f"trainer.out_dir={tmp_path}"]) == 0
    out = capsys.readouterr().out
    assert "no group with varying rewards" not in out and "gradient has been 0" not in out


def test_an_objective_that_reads_no_advantages_is_not_warned_of_ties(tmp_path, capsys):
    assert NoSignal(patience=1, ignore=frozenset({"ties"})).check({"batch/zero_variance_group_frac": 1.0}) == []
    teacher = ["train", *TINY[:-1], "trainer.steps=1", "trainer.save_every=1", f"trainer.out_dir={tmp_path}",
               "trainer.name=teacher"]
    assert main(teacher) == 0
    capsys.readouterr()
    distil = [*TINY, "algo.dynamic_sampling=false", "algo.objective=reverse_kl_distill",
              f"model.teacher_path={tmp_path / 'teacher/checkpoints/step_000001'}", f"trainer.out_dir={tmp_path}"]
    assert main(["train", *distil, "trainer.name=student"]) == 0  # a random model: every group ties
    assert "no group with varying rewards" not in capsys.readouterr().out
