"""Data-parallel learners under the asynchronous loop (`trainer.max_staleness`): each rank's
rollout thread samples its share of a batch from its snapshot of the gathered weights and the
ranks exchange the shares on a process group of the rollout side's own, so the learner thread's
collectives (the no-grad passes, the update, the weight gather) never pair up with them.

η = 0 is the 2-rank synchronous run bit for bit. At η >= 1 the ranks sample each batch from the
one version `trainer.staleness=exact` names (under `bounded` each rank would take the newest it
has, so the ranks' shares could come from different policies: refused with one line), and each
rank runs its batches whole (no row lanes on the other side's idle core, which would unshard a
layer mid-forward): 2 ranks at η = 1 are one process at η = 1.
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
    a, b = checkpoint_weights(root / "eta0", 3), checkpoint_weights(root / "sync", 3)  # gathered, bit for bit
    assert a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a)


ASYNC_TIMINGS = ("async/step_s", "async/trainer_idle_frac", "async/rollout_idle_frac", "async/weight_sync_s",
                 "async/rollout_push_s", "async/queue_depth")  # wall-clock, and how many batches were ready


def untimed(run) -> list[dict]:
    return [{k: v for k, v in m.items() if k not in ASYNC_TIMINGS} for m in run_metrics(run)]


@pytest.mark.slow
def test_two_ranks_overlapping_the_update_train_as_one_process_at_the_same_staleness(root):
    """η = 1 with the exact schedule: 2 ranks × 1 thread and one process on 2 threads (its row lanes
    and core lease) sample the same batches from the same versions and train alike over 3 steps."""
    eta1 = ["trainer.max_staleness=1", "trainer.staleness=exact"]
    done = torchrun("trainer.name=two_eta1", *eta1, *common(root))
    assert done.returncode == 0, done.stderr[-3000:]
    assert main(["train", "trainer.name=one_eta1", "trainer.threads=2", *eta1, *common(root)]) == 0
    two, one = untimed(root / "two_eta1"), untimed(root / "one_eta1")
    assert [m.get("async/staleness") for m in two] == [m.get("async/staleness") for m in one]
    assert [m.get("async/staleness") for m in two][-1] == 1.0  # the update overlapped the next batch's rollout
    same_lines(two, one)
    assert samples(root / "two_eta1") == samples(root / "one_eta1")
    same_weights(checkpoint_weights(root / "two_eta1", 3), checkpoint_weights(root / "one_eta1", 3), warm_start())


def test_two_ranks_overlapping_the_update_on_the_bounded_schedule_is_one_line(tmp_path):
    done = torchrun("trainer.max_staleness=1", "trainer.steps=1", f"trainer.out_dir={tmp_path}", *EVERY_STEP)
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert lines and lines[0].startswith("error: trainer.staleness: 2 data-parallel learners overlapping the update "
                                         "(max_staleness 1) sample every batch from one agreed version"), \
        done.stderr[-2000:]
