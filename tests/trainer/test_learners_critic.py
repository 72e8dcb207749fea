"""Data-parallel learners with a critic (PPO/GAE, `recipes/ppo_countdown.yaml`): 2 ranks of
`torchrun` (FSDP2 over gloo, one thread each) against one process on the same global batches.

The critic is sharded as the policy: its values pass splits the rows over the ranks and gathers
them, each rank trains its share of a minibatch with the loss normalised by the minibatch's
global token count, so the metrics (the critic's too), the policy's weights and the critic's
agree to float rounding. The checkpoint holds the critic's gathered weights and its optimizer's
shards: one process resumes it, and 2 ranks a 1-process one, onto the uninterrupted run.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from _learners import EVERY_STEP, SRC, checkpoint_weights, run_metrics, same_lines, same_weights, torchrun, warm_start

from rlvr.cli import main

REWARD = "def score(prompt, completion, **example):\n    return float(len(completion) % 3 == 0)\n"
RECIPE = SRC / "rlvr" / "recipes" / "ppo_countdown.yaml"


def _critic(run, step: int) -> dict[str, torch.Tensor]:
    state = torch.load(run / "checkpoints" / f"step_{step:06d}" / "trainer_state.pt", weights_only=False)
    return state["critic"]


def _same_critic(a: dict, b: dict, start: dict, rel: float = 1e-5) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert float((a[name] - b[name]).float().norm()) <= rel * max(float(b[name].float().norm()), 1e-12), name
    assert float((b["head.weight"] - start["head.weight"]).norm()) > 0  # the head trained off its zero start


def _from_step_2(run: Path, to: Path) -> Path:
    """A copy of `run` whose last checkpoint is step 2's: a resume trains step 3 again."""
    shutil.copytree(run, to)
    shutil.rmtree(to / "checkpoints" / "step_000003")
    return to


def _same_as_uninterrupted(resumed: Path, one: Path) -> None:
    same_lines(run_metrics(resumed), run_metrics(one))
    same_weights(checkpoint_weights(resumed, 3), checkpoint_weights(one, 3), checkpoint_weights(one, 2))
    _same_critic(_critic(resumed, 3), _critic(one, 3), _critic(one, 2))


@pytest.fixture(scope="module")
def ppo_runs(tmp_path_factory):
    """3 PPO steps (step 1 the critic's warm-up alone, then both), by 2 ranks and by one process."""
    root = tmp_path_factory.mktemp("learners_critic")
    (root / "reward.py").write_text(REWARD)
    common = [str(RECIPE), "trainer.steps=3", "algo.critic_warmup_steps=1", f"reward.fn={root / 'reward.py'}:score",
              f"trainer.out_dir={root}", "trainer.keep_last=3", *EVERY_STEP]
    done = torchrun(*common, "trainer.name=two")
    assert done.returncode == 0, done.stderr[-3000:]
    assert main(["train", *common, "trainer.name=one", "trainer.threads=1"]) == 0
    return root / "two", root / "one"


@pytest.mark.slow
def test_two_ranks_train_ppo_with_a_critic_as_one_process(ppo_runs):
    two, one = ppo_runs
    lines = run_metrics(two)
    same_lines(lines, run_metrics(one))
    assert "critic/value_loss" in lines[1] and "actor/grad_norm" not in lines[1]  # the critic's warm-up
    assert all("critic/value_loss" in m and "actor/grad_norm" in m for m in lines[2:])
    same_weights(checkpoint_weights(two, 3), checkpoint_weights(one, 3), warm_start())
    _same_critic(_critic(two, 3), _critic(one, 3), _critic(one, 1))
    assert (two / "checkpoints" / "step_000003" / "critic_optimizer" / ".metadata").is_file()  # its shards


@pytest.mark.slow
def test_a_two_rank_checkpoint_with_a_critic_resumes_in_one_process_onto_the_uninterrupted_run(ppo_runs, tmp_path):
    """Step 3 again from the 2-rank run's step-2 checkpoint (both optimizers' shards), by one process."""
    two, one = ppo_runs
    resumed = _from_step_2(two, tmp_path / "two_by_one")
    assert main(["train", "--resume", str(resumed)]) == 0
    _same_as_uninterrupted(resumed, one)


@pytest.mark.slow
def test_two_ranks_resume_a_one_process_checkpoint_with_a_critic_onto_the_uninterrupted_run(ppo_runs, tmp_path):
    """Step 3 again from the 1-process run's step-2 checkpoint (full optimizer states, cut into shards), by 2 ranks."""
    _, one = ppo_runs
    resumed = _from_step_2(one, tmp_path / "one_by_two")
    done = torchrun("--resume", str(resumed))
    assert done.returncode == 0, done.stderr[-3000:]
    _same_as_uninterrupted(resumed, one)


@pytest.mark.slow
def test_two_bf16_ranks_keep_the_value_head_in_float32_and_train_as_one_bf16_process(tmp_path):
    """bf16 weights gathered in bf16 (`trainer.fsdp_param_dtype=bfloat16`), the value head a group
    of its own in float32 (gathered in bf16 it met the body's float32 hidden states: a dtype error):
    2 PPO steps equal one bf16 process to bf16's precision (as the policy's bf16 test), the head
    still float32 in the checkpoint."""
    (tmp_path / "reward.py").write_text(REWARD)
    common = [str(RECIPE), "trainer.steps=2", "algo.critic_warmup_steps=1", "model.dtype=bfloat16",
              f"reward.fn={tmp_path / 'reward.py'}:score", f"trainer.out_dir={tmp_path}", *EVERY_STEP]
    done = torchrun(*common, "trainer.name=two", "trainer.fsdp_param_dtype=bfloat16",
                    "trainer.fsdp_reduce_dtype=float32")
    assert done.returncode == 0, done.stderr[-3000:]
    assert main(["train", *common, "trainer.name=one", "trainer.threads=1"]) == 0
    same_lines(run_metrics(tmp_path / "two"), run_metrics(tmp_path / "one"), rel=2e-2, abs_tol=2e-3)
    head = _critic(tmp_path / "two", 2)["head.weight"]
    assert head.dtype == torch.float32 and float(head.norm()) > 0
