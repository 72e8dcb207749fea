"""Data-parallel learners under the asynchronous loop (`trainer.max_staleness`): each rank's
rollout thread samples its share of a batch from its snapshot of the gathered weights and the
ranks exchange the shares on a process group of the rollout side's own, so the learner thread's
collectives (the no-grad passes, the update, the weight gather) never pair up with them.

η = 0 is the 2-rank synchronous run bit for bit; η = 1 with `trainer.staleness=exact` (every rank
samples batch k with version k-2) trains as one process with the same settings.
"""

from __future__ import annotations

import pytest
from _learners import EVERY_STEP, checkpoint_weights, run_metrics, same_lines, same_weights, torchrun, warm_start

from rlvr.cli import main

REWARD = """
def score(prompt, completion, **example):
    return float(len(completion) % 3 == 0)
"""
STEPS = "trainer.steps=3"
ONE_STEP_OFF = ["trainer.max_staleness=1", "trainer.staleness=exact"]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("learners_async")
    (root / "reward.py").write_text(REWARD)
    return root


def common(root) -> list[str]:
    return [f"reward.fn={root / 'reward.py'}:score", f"trainer.out_dir={root}", STEPS, *EVERY_STEP]


def samples(run) -> list[str]:
    return (run / "samples.jsonl").read_text().splitlines()


@pytest.mark.slow
def test_two_ranks_at_staleness_zero_are_the_two_rank_synchronous_run(root):
    for name, extra in (("sync", []), ("eta0", ["trainer.max_staleness=0"])):
        done = torchrun(f"trainer.name={name}", *extra, *common(root))
        assert done.returncode == 0, done.stderr[-3000:]
    sync, eta0 = run_metrics(root / "sync"), run_metrics(root / "eta0")
    keys = {k for k in sync[1] if not k.startswith(("time/", "perf/"))}
    assert "actor/grad_norm" in keys
    assert [{k: m[k] for k in keys if k in m} for m in eta0] == [{k: m[k] for k in keys if k in m} for m in sync]
    assert samples(root / "eta0") == samples(root / "sync")
    assert all(m["async/staleness"] == 0.0 for m in eta0[1:])
    for step in (1, 3):  # the checkpoints' gathered weights, bit for bit
        a, b = checkpoint_weights(root / "eta0", step), checkpoint_weights(root / "sync", step)
        assert a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a)


@pytest.mark.slow
def test_two_ranks_one_step_off_train_as_one_process_one_step_off(root):
    done = torchrun("trainer.name=two_eta1", *ONE_STEP_OFF, *common(root))
    assert done.returncode == 0, done.stderr[-3000:]
    assert main(["train", "trainer.name=one_eta1", "trainer.threads=1", *ONE_STEP_OFF, *common(root)]) == 0
    two, one = run_metrics(root / "two_eta1"), run_metrics(root / "one_eta1")
    same_lines(two, one)
    assert [m["async/staleness"] for m in two[1:]] == [0.0, 1.0, 1.0]  # batch k from version k-2
    assert samples(root / "two_eta1") == samples(root / "one_eta1")
    same_weights(checkpoint_weights(root / "two_eta1", 3), checkpoint_weights(root / "one_eta1", 3), warm_start())


def test_two_ranks_one_step_off_by_pace_is_one_line(tmp_path):
    done = torchrun("trainer.max_staleness=1", "trainer.steps=1", f"trainer.out_dir={tmp_path}", *EVERY_STEP)
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert lines and lines[0].startswith("error: trainer.staleness: 2 data-parallel learners sample each batch "
                                         "with one policy version; set trainer.staleness=exact"), done.stderr[-2000:]
