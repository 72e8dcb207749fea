"""The shipped components answer through the seams of `rlvr.protocols` (called with real inputs,
their outputs' shapes and values checked), and the seams carry estimator inputs on the batch,
traces on rollouts and forward counts on the policy."""

import dataclasses
import json
import random

import pytest
import torch

from rlvr.batch import Rollouts, TrainBatch, concat_rollouts
from rlvr.builder.components import build_components
from rlvr.codec import encode_prompts
from rlvr.config import load_config
from rlvr.protocols import LogitStatsPolicy, PolicyModel, RewardFn, RolloutEngine, Task, Tracker
from rlvr.trainer.sync import rl_step
from rlvr.types import Example

FAST = ["rollout.prompts_per_step=2", "rollout.group_size=4", "rollout.max_new_tokens=6", "trainer.steps=1",
        "task.heldout_size=4", "trainer.threads=1"]


def _check_task(task) -> list[Example]:
    """Task: seeded samples, a fixed held-out set of `task.heldout_size`, a verifier that pays the
    reference answer 1.0 and a malformed completion 0.0."""
    assert isinstance(task, Task) and isinstance(task.reward, RewardFn)
    drawn = task.sample(3, random.Random(0))
    assert len(drawn) == 3 and all(isinstance(e, Example) and e.prompt and e.answer for e in drawn)
    assert drawn == task.sample(3, random.Random(0))
    heldout = task.heldout()
    assert len(heldout) == 4 and heldout == task.heldout()
    assert not {e.prompt for e in heldout} & {e.prompt for e in task.sample(200, random.Random(1))}
    ex = heldout[0]
    assert task.reward(ex.prompt, ex.answer, **dataclasses.asdict(ex)) == 1.0
    assert task.reward(ex.prompt, "((", **dataclasses.asdict(ex)) == 0.0
    assert task.is_correct(ex.answer, ex) and not task.is_correct("((", ex)
    return drawn


def _check_engine(engine, tokenizer, prompts: list[str], greedy) -> Rollouts:
    """RolloutEngine: B rows in, B completions of at most max_new_tokens (6) out, behaviour
    log-probs <= 0 on the completion mask and 0 off it; per-row seeds reproduce a row; temperature
    `greedy` (0) is greedy, so the seeds do not matter."""
    assert isinstance(engine, RolloutEngine)
    ids, mask = encode_prompts(tokenizer, prompts)
    out = engine(ids, mask, torch.tensor([5, 6]), temperature=1.0)
    rows, width = out.completion_ids.shape
    assert len(out) == rows == 2 and 0 < width <= 6 and torch.equal(out.prompt_ids, ids)
    assert out.completion_mask.shape == out.logprobs.shape == (2, width) and out.truncated.shape == (2,)
    on = out.completion_mask > 0
    assert on[:, 0].all() and torch.isfinite(out.logprobs).all()
    assert (out.logprobs[on] <= 0).all() and (out.logprobs[~on] == 0).all()
    assert torch.equal(engine(ids, mask, torch.tensor([5, 6]), temperature=1.0).completion_ids, out.completion_ids)
    first, second = (engine(ids, mask, torch.tensor(seeds), temperature=greedy).completion_ids
                     for seeds in ([1, 2], [3, 4]))
    assert torch.equal(first, second)
    return out


def _check_policy(policy, model, out: Rollouts) -> int:
    """PolicyModel: (B, Tc) log-probs of the sampled tokens equal to the engine's behaviour
    log-probs (same weights, temperature 1), entropy >= 0 when asked, the model's parameters.
    Returns the forwards it counted for the two calls."""
    assert isinstance(policy, PolicyModel)
    assert sum(p.numel() for p in policy.parameters()) == sum(p.numel() for p in model.parameters()) > 0
    batch = TrainBatch(out.prompt_ids, out.prompt_mask, out.completion_ids, out.completion_mask,
                       advantages=torch.zeros_like(out.completion_mask), trace=out.trace)
    policy.begin_step(3)
    before = policy.forwards
    with torch.no_grad():
        logp, entropy = policy.batch_logprobs(batch, with_entropy=True)
        assert policy.batch_logprobs(batch)[1] is None
    counted = policy.forwards - before
    on = out.completion_mask > 0
    assert logp.shape == entropy.shape == out.logprobs.shape
    torch.testing.assert_close(logp[on], out.logprobs[on], atol=1e-4, rtol=0)
    assert (entropy[on] >= 0).all()
    if isinstance(policy, LogitStatsPolicy):  # causal LMs: the same forward's logit statistics
        with torch.no_grad():
            same, _, stats = policy.batch_token_stats(batch, stats=("logsumexp", "logit"))
        torch.testing.assert_close(same, logp)
        torch.testing.assert_close((stats["logit"] - stats["logsumexp"])[on], logp[on], atol=1e-5, rtol=0)
    return counted


@pytest.mark.parametrize("kind", ["causal", "diffusion"])
def test_built_components_answer_through_the_protocols(kind):
    overrides = FAST if kind == "causal" else [*FAST, "model.kind=diffusion", "model.path=", "estimator.name=trace",
                                               "rollout.window=full"]
    c = build_components(load_config(None, overrides))
    drawn = _check_task(c.rollout.task)
    # Per-row temperatures reach only the diffusion engine (rollout.greedy_in_group is refused for
    # causal models), so the causal engine is asked for greedy with one number.
    greedy = 0.0 if kind == "causal" else torch.zeros(2)
    out = _check_engine(c.rollout.engine, c.rollout.tokenizer, [e.prompt for e in drawn[:2]], greedy)
    counted = _check_policy(c.learner.policy, c.learner.model, out)
    assert isinstance(c.learner.policy, LogitStatsPolicy) == (kind == "causal")
    # The causal policy's fused training kernels (where they build) bypass the module forward, uncounted.
    assert counted >= (0 if kind == "causal" else 2)


def test_jsonl_tracker_writes_one_line_per_call(tmp_path):
    from rlvr.tracking.tracker import JsonlTracker

    tracker = JsonlTracker(tmp_path)
    assert isinstance(tracker, Tracker) and tracker.name == "jsonl"
    tracker.log_config({"seed": 0})  # config.yaml is the trainer's: nothing written here
    tracker.log_metrics(1, {"loss/policy": 0.5, "reward/mean": 0.25})
    tracker.log_metrics(2, {"loss/policy": -0.125})
    tracker.close()
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert lines == [{"step": 1, "loss/policy": 0.5, "reward/mean": 0.25}, {"step": 2, "loss/policy": -0.125}]


def test_the_diffusion_trace_reaches_the_estimator_through_the_batch():
    """The `trace` estimator replays the sampler's commit order: the engine puts it on Rollouts,
    rl_step copies it to the TrainBatch, and the policy reads it there (no lookup by row hash)."""
    config = load_config(None, [*FAST, "model.kind=diffusion", "model.path=", "estimator.name=trace",
                                "rollout.window=full", "rollout.temperature=1.0"])
    c = build_components(config)
    ids = torch.tensor([[1, 2, 3], [1, 2, 3]])
    out = c.rollout.engine(ids, torch.ones_like(ids), torch.tensor([5, 6]), temperature=1.0)
    assert out.trace is not None and out.trace.shape == out.completion_ids.shape
    batch = TrainBatch(out.prompt_ids, out.prompt_mask, out.completion_ids, out.completion_mask,
                       advantages=torch.zeros_like(out.completion_mask), trace=out.trace)
    with torch.no_grad():
        logp, _ = c.learner.policy.batch_logprobs(batch)
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


def test_rollouts_keep_their_per_token_versions_through_concat_and_select():
    def rows(versions):
        n, width = versions.shape
        return Rollouts(torch.ones(n, 2, dtype=torch.long), torch.ones(n, 2, dtype=torch.long),
                        torch.ones(n, width, dtype=torch.long), (versions >= 0).float(), torch.zeros(n, width),
                        torch.zeros(n, dtype=torch.bool), versions=versions)

    a, b = rows(torch.tensor([[4, 4, 5], [4, 5, -1]])), rows(torch.tensor([[5, 5]]))
    both = concat_rollouts([a, b], pad_id=0)
    assert both.versions.tolist() == [[4, 4, 5], [4, 5, -1], [5, 5, -1]]  # padding is version -1
    assert both.select(torch.tensor([2, 1])).versions.tolist() == [[5, 5, -1], [4, 5, -1]]
    plain = Rollouts(*[torch.ones(1, 2, dtype=torch.long)] * 3, torch.ones(1, 2), torch.zeros(1, 2),
                     torch.zeros(1, dtype=torch.bool))
    assert concat_rollouts([a, plain], pad_id=0).versions is None


def test_remax_baseline_comes_from_the_rollout_stage():
    from rlvr.trainer.collect import collect

    c = build_components(load_config(None, [*FAST, "algo.advantage=remax", "algo.dynamic_sampling=false"]))
    got = collect(c.rollout, 1)
    assert got.baseline_rewards is not None and got.baseline_rewards.shape == (2,)
    metrics, _ = rl_step(c, 1)
    assert "loss/policy" in metrics
