"""Partial rollouts in the asynchronous loop (`trainer.partial_rollouts`): a weight update reaches
the batch in flight, each token keeps its own version and behaviour log-prob through the loss, and
tokens staler than `trainer.max_token_staleness` are masked out of it."""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
import types

import pytest
import torch
from _async_runs import TINY, _assert_same_run, _lines, _run

from rlvr.config import load_config
from rlvr.errors import ConfigError
from rlvr.trainer.token_staleness import staleness_metrics, token_staleness, within_bound


def _plus_reward(tmp_path) -> str:
    """A reward the random tiny model earns at once (the share of '+' signs), so every step learns."""
    (tmp_path / "plus.py").write_text("def score(prompt, completion, **example):\n"
                                      "    return completion.count('+') / max(1, len(completion))\n")
    return f"reward.fn={tmp_path / 'plus.py'}:score"


@pytest.fixture
def slow_swaps(monkeypatch):
    """The sampler, at its second check for newer weights in batch j, waits (5 s at most) for the
    version the learner publishes after training batch j-1 when the batch began before it: so the
    update lands mid-batch on a machine of any speed, not only where sampling is the slower side."""
    from rlvr.engines import snapshot

    real_call, real_swap = snapshot.SnapshotEngine.__call__, snapshot.SnapshotEngine._swap
    batches = []  # per batch: [its index, the version it began at, checks so far]

    def call(self, *args, **kwargs):
        batches.append([len(batches), self.policy_version, 0])
        return real_call(self, *args, **kwargs)

    def swap(self):
        batch = batches[-1]
        batch[2] += 1
        if batch[2] == 2 and batch[1] < batch[0]:  # began before the version the learner is making now
            deadline = time.monotonic() + 5
            while real_swap(self) <= batch[1] and time.monotonic() < deadline:
                time.sleep(0.01)
        return real_swap(self)

    monkeypatch.setattr(snapshot.SnapshotEngine, "__call__", call)
    monkeypatch.setattr(snapshot.SnapshotEngine, "_swap", swap)


def _tiny(*overrides: str) -> list[str]:
    """The shared tiny run's overrides with `overrides` in place of its own of the same keys."""
    keys = {o.partition("=")[0] for o in overrides}
    return [o for o in TINY if o.partition("=")[0] not in keys] + list(overrides)


def _nudged(model: torch.nn.Module, seed: int) -> dict:
    """`model`'s weights plus seeded noise (another policy version)."""
    g = torch.Generator().manual_seed(seed)
    return {k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in model.state_dict().items()}


@pytest.mark.parametrize("bound", [2, 1])
def test_a_batch_mixing_two_versions_trains_each_token_by_its_own_version(monkeypatch, bound):
    """Completions sampled by version 0 for 3 tokens, then version 1 (swapped mid-generation),
    trained by the learner at version 2: each token's recorded version and behaviour log-prob are its
    own version's (checked against the trainer's forward under that version), the decoupled weights
    the loss applies are exp(pi_prox - pi_behav(version of the token)), and with the per-token bound
    at 1 the version-0 tokens (2 stale) are out of the loss mask."""
    from rlvr.builder.components import build_components
    from rlvr.engines.snapshot import frozen_copy
    from rlvr.engines.torch_ar import Swaps, generate
    from rlvr.trainer import sync
    from rlvr.trainer.collect import produce, stale_by
    from rlvr.trainer.logit_stats import no_grad_outputs

    c = build_components(load_config(None, _tiny("trainer.threads=1", "rollout.max_new_tokens=8",
                                                 "rollout.group_size=4", "rollout.temperature=1.0")))
    model, tok = c.learner.model, c.rollout.tokenizer
    weights = {0: {k: v.clone() for k, v in model.state_dict().items()}, 1: _nudged(model, 1), 2: _nudged(model, 2)}
    live = frozen_copy(model)  # the sampler's own copy (the policy's forward hooks stay on the policy)

    def engine(prompt_ids, prompt_mask, seeds, *, temperature):
        live.load_state_dict(weights[0])
        polls = []

        def poll() -> int:  # version 1 is published after the first chunk of 3 tokens
            polls.append(1)
            if len(polls) == 2:
                live.load_state_dict(weights[1])
            return min(len(polls) - 1, 1)

        return generate(live, prompt_ids, prompt_mask, seeds, max_new_tokens=8, eos_id=tok.eos_token_id,
                        pad_id=tok.pad_token_id, temperature=temperature, swaps=Swaps(poll, every=3))

    produced = produce(dataclasses.replace(c.rollout, engine=engine), 3, 0)
    rollouts = produced.got.rollouts
    valid = rollouts.completion_mask > 0
    assert ((rollouts.versions == 1) & valid).any() and ((rollouts.versions == 0) & valid).any()
    ages = token_staleness(rollouts, produced.version, 2)
    assert torch.equal(ages, torch.where(valid, 2 - rollouts.versions, -1))
    produced = dataclasses.replace(produced, staleness=stale_by(produced, 3), within_bound=within_bound(ages, bound))
    assert produced.staleness == 2 and (produced.within_bound is None) == (bound == 2)

    model.load_state_dict(weights[2])  # the learner, two updates on
    real, seen = sync.optimizer_step, {}

    def capture(policy, optimizer, scheduler, batch, spec, **kwargs):
        seen["batch"], applied = batch, []
        weigh = spec.proximal_weights
        if weigh is not None:  # pi_prox from the update's own forward: record the weights it gets
            spec = dataclasses.replace(spec, proximal_weights=lambda *a: applied.append(weigh(*a)[0]) or weigh(*a))
        out = real(policy, optimizer, scheduler, batch, spec, **kwargs)
        seen["weights"] = torch.cat(applied) if applied else batch.loss_weights
        return out

    monkeypatch.setattr(sync, "optimizer_step", capture)
    metrics, _ = sync.rl_step(c, 3, produced)
    monkeypatch.undo()
    batch = seen["batch"]
    # the trainer's own log-probs of the batch under each version, with the step's weights restored after
    logp, whole = {}, dataclasses.replace(batch, completion_mask=rollouts.completion_mask)  # every token's
    for version in (0, 1, 2):
        model.load_state_dict(weights[version])
        logp[version] = no_grad_outputs(c.learner.policy, whole, 64)["logp"]
    behaviour = torch.where(rollouts.versions == 0, logp[0], logp[1])
    torch.testing.assert_close(rollouts.logprobs * valid, behaviour * valid, atol=2e-5, rtol=0)
    kept = valid & ((ages <= bound) if bound < 2 else valid)
    assert torch.equal(batch.completion_mask > 0, kept)
    expected = torch.where(kept, torch.exp(logp[2] - behaviour), torch.zeros_like(behaviour))
    torch.testing.assert_close(seen["weights"] * kept, expected, atol=1e-4, rtol=1e-4)
    # the version-1 tokens' weights differ from what version 0's log-probs would give: versions matter
    wrong = torch.where(kept & (rollouts.versions == 1), torch.exp(logp[2] - logp[0]), expected)
    assert (wrong - expected).abs().max() > 1e-3
    assert metrics["async/behaviour_kl_k3"] > 0


def test_staleness_summary_and_bound():
    staleness = torch.tensor([[2, 2, 1, 1, -1], [0, 0, 0, -1, -1], [1, 1, 1, 1, 1]])
    keep = within_bound(staleness, 1)
    assert torch.equal(keep, (staleness <= 1).float())
    assert within_bound(staleness, 2) is None
    m = staleness_metrics(staleness, 1, 2)
    assert m["rollout/staleness_mean"] == pytest.approx(11 / 12)
    assert m["rollout/staleness_max"] == 2.0
    assert m["rollout/staleness_over_frac"] == pytest.approx(2 / 12)
    hist = [m[f"rollout/staleness_{k}_frac"] for k in range(3)]
    assert hist == pytest.approx([3 / 12, 7 / 12, 2 / 12])
    assert m["rollout/staleness_mixed_rows_frac"] == pytest.approx(1 / 3)  # only the first row spans versions


def test_partial_rollouts_run_learns_with_updates_reaching_batches_in_flight(tmp_path, capsys, slow_swaps):
    """η = 1 with the sampler slowed between chunks, so the learner's update lands mid-batch: the
    completions then span two versions, no token is more than η stale, and the reward rises."""
    run = _run(tmp_path, capsys, "partial", *_tiny("rollout.group_size=4", "rollout.max_new_tokens=12"),
               _plus_reward(tmp_path), "trainer.steps=8", "trainer.threads=2", "trainer.max_staleness=1",
               "optim.lr=1e-2", "trainer.partial_rollouts=true", "trainer.partial_chunk=2")
    steps = [line for line in _lines(run) if line["step"] > 0]
    assert max(line["rollout/staleness_mixed_rows_frac"] for line in steps) > 0  # an update entered a batch
    assert all(line["rollout/staleness_max"] <= 1 and line["rollout/staleness_over_frac"] == 0 for line in steps)
    first, last = steps[:3], steps[-3:]
    assert sum(x["reward/mean"] for x in last) > 2 * sum(x["reward/mean"] for x in first) > 0


def test_staleness_zero_with_partial_rollouts_is_the_synchronous_loop(tmp_path, capsys):
    """η = 0: no update can arrive while a batch samples, so partial rollouts change nothing."""
    common = [*_tiny("rollout.max_new_tokens=6"), "trainer.threads=2", "trainer.steps=3"]
    sync_run = _run(tmp_path, capsys, "sync", *common)
    async_run = _run(tmp_path, capsys, "async", *common, "trainer.max_staleness=0", "trainer.partial_rollouts=true")
    _assert_same_run(sync_run, async_run)


def test_token_bound_below_eta_masks_the_oldest_tokens(tmp_path, capsys, slow_swaps):
    """η = 1 with `max_token_staleness=0` under partial rollouts: the tokens a batch sampled one
    version back are out of the loss (`rollout/staleness_over_frac`), the ones sampled after the
    update entered it train; a batch with no token left trains nothing and the run goes on."""
    run = _run(tmp_path, capsys, "bound", *_tiny("rollout.group_size=4", "rollout.max_new_tokens=12"),
               _plus_reward(tmp_path), "trainer.steps=5", "trainer.threads=2", "trainer.max_staleness=1",
               "trainer.max_token_staleness=0", "optim.lr=1e-2", "trainer.partial_rollouts=true",
               "trainer.partial_chunk=2")
    steps = [line for line in _lines(run) if line["step"] > 0]
    assert all(line["rollout/staleness_over_frac"] == line["rollout/staleness_1_frac"] for line in steps)
    mixed = [line for line in steps if 0 < line["rollout/staleness_over_frac"] < 1]
    assert mixed and all(line["actor/grad_norm"] > 0 for line in mixed)
    whole = [line for line in steps if line["rollout/staleness_over_frac"] == 1]
    assert all("actor/grad_norm" not in line for line in whole)


@pytest.mark.parametrize("overrides, field", [
    (["trainer.partial_rollouts=true"], "trainer.partial_rollouts"),
    (["trainer.partial_rollouts=true", "trainer.max_staleness=1", "trainer.staleness=exact"],
     "trainer.partial_rollouts"),
    (["trainer.partial_rollouts=true", "trainer.max_staleness=1", "rollout.engine=vllm"], "trainer.partial_rollouts"),
    (["trainer.max_token_staleness=2", "trainer.max_staleness=1"], "trainer.max_token_staleness"),
    (["trainer.max_token_staleness=0"], "trainer.max_token_staleness"),
])
def test_partial_config_errors_name_the_field(overrides, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")) as err:
        load_config(None, overrides)
    assert "\n" not in str(err.value)


def test_in_flight_pushes_reach_the_engine_while_the_batch_samples():
    """An engine that takes pushes mid-request (servers): every version published while the batch
    samples is pushed to it then, not after the batch."""
    from rlvr.trainer.async_loop import LocalRollouts, WeightSlot
    from rlvr.trainer.plan import PartialPlan

    class Engine:
        policy_version = 0

        def __init__(self):
            self.pushed = []

        def push_in_flight(self, tensors, version):
            self.pushed.append(version)
            self.policy_version = version

    side = types.SimpleNamespace(partial=PartialPlan(in_flight=True, every=1), slot=WeightSlot(0), engine=Engine(),
                                 stop=threading.Event())
    with LocalRollouts._pushed_in_flight(side):
        for version in (1, 2):
            side.slot.publish([("w", torch.zeros(1))], version)
            deadline = time.monotonic() + 5
            while side.engine.policy_version != version and time.monotonic() < deadline:
                time.sleep(0.01)
        assert side.engine.pushed == [1, 2]  # both landed before the batch ended
    side.slot.publish([("w", torch.zeros(1))], 3)
    time.sleep(0.1)
    assert side.engine.pushed == [1, 2]  # after the batch: the next batch's start pushes, as without partial
    with contextlib.suppress(Exception):
        side.stop.set()


@pytest.mark.vllm
@pytest.mark.slow  # a race: it shows mixed versions only where the server samples slower than the learner steps
def test_partial_rollouts_on_vllm_servers_push_into_requests_in_flight(tmp_path, capsys):
    """`rollout.engine=vllm_server` with η = 1: the learner's update is pushed to the server while the
    next batch's requests run (keep-paused, resumed under the new weights), so completions span two
    versions (vLLM's `weight_versions`), no token is more than η stale, and the run trains."""
    run = _run(tmp_path, capsys, "server", "model.path=", "model.hidden_size=64", "model.num_layers=2",
               "model.num_heads=2", "model.intermediate_size=64", "model.max_seq_len=128", "rollout.prompts_per_step=2",
               "rollout.group_size=4", "rollout.max_new_tokens=96", "task.heldout_size=4", "trainer.eval_every=0",
               "trainer.steps=4", "optim.lr=3e-2", "optim.warmup_steps=1", "rollout.engine=vllm_server",
               "rollout.vllm_kv_cache_mb=16", "rollout.vllm_max_model_len=128", "rollout.server_on_crash=fail",
               _plus_reward(tmp_path), "algo.dynamic_sampling=false", "trainer.threads=2",
               "trainer.max_staleness=1", "trainer.partial_rollouts=true")
    steps = [line for line in _lines(run) if line["step"] > 0]
    seen = [{k: v for k, v in line.items() if k.startswith(("rollout/staleness", "actor/grad_norm"))} for line in steps]
    assert len(steps) == 4 and all(line["rollout/staleness_max"] <= 1 for line in steps), seen
    assert max(line["rollout/staleness_mixed_rows_frac"] for line in steps) > 0, seen
    assert any(line.get("actor/grad_norm", 0) > 0 for line in steps), seen  # a group whose rewards tie trains nothing
