"""`trainer.ray_learners=2` with Ray rollout and reward workers: rank 0 owns the actors, samples
and scores each whole batch on them with the single process's seeds and broadcasts it, and pushes
the gathered weights to the rollout workers after every step; the run trains as one Ray process
with the same workers does (`trainer.backend=ray`, its rollout side on the actors).

Both runs share one local Ray declaring 4 logical CPUs: 2 learner bundles of 1 CPU and 2 rollout
workers of 1 CPU outside the placement group (reward workers take none)."""

from __future__ import annotations

import pytest
from _learners import SMALL, checkpoint_weights, run_metrics, same_lines, same_weights, warm_start

from rlvr.cli import main
from rlvr.config import load_config
from rlvr.config.checks import check_learners
from rlvr.errors import ConfigError
from rlvr.runtime.distributed import Shard

REWARD = "def score(prompt, completion, **example):\n    return float(len(completion) % 3 == 0)\n"
WORKERS = ["trainer.backend=ray", "trainer.rollout_workers=2", "trainer.reward_workers=2", "trainer.threads=1"]


@pytest.fixture(scope="module")
def ray_four():
    import ray

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def _actors(ray) -> list[dict]:
    """Every actor this Ray started, dead ones too (Ray's actor table)."""
    return list(ray._private.state.actors().values())


def _where(address: dict) -> tuple[str, int]:
    """The worker process an actor-table address names (its node and port)."""
    return address["IPAddress"], address["Port"]


@pytest.mark.ray
@pytest.mark.slow
def test_two_ray_learners_with_rollout_and_reward_workers_train_as_one_ray_process(ray_four, tmp_path):
    (tmp_path / "reward.py").write_text(REWARD)
    common = ["trainer.steps=3", *WORKERS, f"reward.fn={tmp_path / 'reward.py'}:score", f"trainer.out_dir={tmp_path}",
              *SMALL]
    assert main(["train", "trainer.name=one", *common]) == 0
    before = _actors(ray_four)
    assert main(["train", "trainer.name=two", "trainer.learners=fsdp", "trainer.ray_learners=2", *common]) == 0
    started = [a for a in _actors(ray_four) if a not in before]
    ranks = {_where(a["Address"]) for a in started if a["ActorClassName"] == "_LearnerRank"}
    owners = {name: {_where(a["OwnerAddress"]) for a in started if a["ActorClassName"] == name}
              for name in ("_RolloutWorker", "_RewardWorker")}
    assert len(ranks) == 2 and all(len(owner) == 1 and owner <= ranks for owner in owners.values()), owners
    assert owners["_RolloutWorker"] == owners["_RewardWorker"]  # one rank (rank 0) owns both kinds of actors
    assert sum(a["ActorClassName"] == "_RolloutWorker" for a in started) == 2
    one, two = tmp_path / "one", tmp_path / "two"
    assert len(run_metrics(two)) == 4
    same_lines(run_metrics(two), run_metrics(one))
    same_weights(checkpoint_weights(two, 3), checkpoint_weights(one, 3), warm_start())


def test_ray_learners_with_workers_are_accepted_and_torchrun_ranks_on_ray_are_one_line():
    load_config(None, ["trainer.learners=fsdp", "trainer.ray_learners=2", *WORKERS])  # no longer refused
    torchrun_ranks = load_config(None, WORKERS)
    with pytest.raises(ConfigError, match=r"^trainer.backend: Ray runs the rollout side of one learner process"):
        check_learners(torchrun_ranks, Shard(0, 2, fsdp=True))
