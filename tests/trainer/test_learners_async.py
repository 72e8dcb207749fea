"""Data-parallel learners under the asynchronous loop (`trainer.max_staleness`): each rank's
rollout thread samples its share of a batch from its snapshot of the gathered weights and the
ranks exchange the shares on a process group of the rollout side's own, so the learner thread's
collectives (the no-grad passes, the update, the weight gather) never pair up with them.

η = 0 is the 2-rank synchronous run bit for bit. η >= 1 is refused with one line: overlapping the
update, the learner's row pool runs the sharded model's forwards in lanes on the rollout side's
idle core, which FSDP2's unshard/reshard does not survive.
"""

from __future__ import annotations

import pytest
from _learners import EVERY_STEP, checkpoint_weights, run_metrics, torchrun

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


def test_two_ranks_overlapping_the_update_is_one_line(tmp_path):
    done = torchrun("trainer.max_staleness=1", "trainer.steps=1", f"trainer.out_dir={tmp_path}", *EVERY_STEP)
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert lines and lines[0].startswith("error: trainer.max_staleness: 1 (rollouts overlapping the update) is not "
                                         "supported with 2 data-parallel learners yet"), done.stderr[-2000:]
