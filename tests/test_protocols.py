"""The shipped components satisfy the seams of `rlvr.protocols`, and the seams carry what the
trainer used to reach around them for (estimator inputs on the batch, traces on rollouts,
forward counts on the policy)."""

import torch

from rlvr.batch import Rollouts, TrainBatch, concat_rollouts
from rlvr.builder.components import build_components
from rlvr.config import load_config
from rlvr.protocols import PolicyModel, RolloutEngine, Task, Tracker
from rlvr.trainer.sync import rl_step

FAST = ["rollout.prompts_per_step=2", "rollout.group_size=4", "rollout.max_new_tokens=6", "trainer.steps=1",
        "task.heldout_size=4", "trainer.threads=1"]


def test_built_components_satisfy_the_protocols(tmp_path):
    from rlvr.tracking.tracker import JsonlTracker

    for overrides in (FAST, [*FAST, "model.kind=diffusion", "model.path=", "estimator.name=trace"]):
        c = build_components(load_config(None, overrides))
        assert isinstance(c.policy, PolicyModel) and isinstance(c.engine, RolloutEngine)
        assert isinstance(c.task, Task)
    assert isinstance(JsonlTracker(tmp_path), Tracker)


def test_the_diffusion_trace_reaches_the_estimator_through_the_batch():
    """The `trace` estimator replays the sampler's commit order: the engine puts it on Rollouts,
    rl_step copies it to the TrainBatch, and the policy reads it there (no lookup by row hash)."""
    config = load_config(None, [*FAST, "model.kind=diffusion", "model.path=", "estimator.name=trace",
                                "rollout.window=full", "rollout.temperature=1.0"])
    c = build_components(config)
    ids = torch.tensor([[1, 2, 3], [1, 2, 3]])
    out = c.engine(ids, torch.ones_like(ids), torch.tensor([5, 6]), temperature=1.0)
    assert out.trace is not None and out.trace.shape == out.completion_ids.shape
    batch = TrainBatch(out.prompt_ids, out.prompt_mask, out.completion_ids, out.completion_mask,
                       advantages=torch.zeros_like(out.completion_mask), trace=out.trace)
    with torch.no_grad():
        logp, _ = c.policy.batch_logprobs(batch)
    assert torch.allclose(logp, out.logprobs, atol=1e-5)  # the replay scores exactly what was sampled
    metrics, _ = rl_step(c, 1)
    assert metrics["perf/forwards_per_update"] > 0  # counted by the policy, not a module global


def test_rollouts_keep_their_trace_through_select_and_concat():
    def rows(n, width, trace):
        return Rollouts(torch.ones(n, 2, dtype=torch.long), torch.ones(n, 2, dtype=torch.long),
                        torch.ones(n, width, dtype=torch.long), torch.ones(n, width), torch.zeros(n, width),
                        torch.zeros(n, dtype=torch.bool), trace=trace, forwards=3)

    a, b = rows(2, 3, torch.arange(6).view(2, 3)), rows(1, 2, torch.tensor([[7, 8]]))
    both = concat_rollouts([a, b], pad_id=0)
    assert both.trace.tolist() == [[0, 1, 2], [3, 4, 5], [7, 8, 0]] and both.forwards == 6
    assert both.select(torch.tensor([2, 0])).trace.tolist() == [[7, 8, 0], [0, 1, 2]]
    assert concat_rollouts([a, rows(1, 2, None)], pad_id=0).trace is None


def test_remax_baseline_comes_from_the_rollout_stage():
    from rlvr.trainer.collect import collect

    c = build_components(load_config(None, [*FAST, "algo.advantage=remax", "algo.dynamic_sampling=false"]))
    got = collect(c, 1)
    assert got.baseline_rewards is not None and got.baseline_rewards.shape == (2,)
    metrics, _ = rl_step(c, 1)
    assert "loss/policy" in metrics
