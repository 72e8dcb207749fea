"""Logit statistics through the policy seam: the logsumexp, the sampled token's logit and Σπ² that
ShiQ and the optimal token baseline read come from the forward that gives the log-probs, equal a
direct softmax of the model's logits on every path (packed fast path, chunked head, plain
forward), carry the right gradients, and cost nothing for a loss that asks for none."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from rlvr.algos._advantage_core import AdvantageInputs
from rlvr.algos._registry import ADVANTAGE_NEEDS, OBJECTIVE_NEEDS, needs_of
from rlvr.algos.advantages import ADVANTAGES, optimal_token_baseline
from rlvr.algos.objectives import OBJECTIVES
from rlvr.algos.offpolicy import shiq_loss
from rlvr.builder import build
from rlvr.config import REGISTRY, load_config
from rlvr.errors import ConfigError
from rlvr.models import policy as policy_module
from rlvr.models.policy import CausalPolicy, sequence_inputs
from rlvr.trainer.step import micro_batch_loss

PROMPTS = ["3 5 2>13:", "1 2 3>6:", "9 9 9>729:", "4 4 1>17:"]
FAST = ["model.path=", "rollout.prompts_per_step=2", "rollout.group_size=4", "rollout.max_new_tokens=6",
        "task.heldout_size=4", "trainer.threads=1", "trainer.thread_mode=ops"]
TEMPERATURE = 0.7


def _direct(model, batch):
    """(logits / T at the positions predicting each completion token (B, Tc, V), valid (B, Tc)):
    the plain `transformers` forward, no rlvr code in between."""
    ids, attention, positions = sequence_inputs(batch.prompt_ids, batch.prompt_mask, batch.completion_ids)
    width = batch.completion_ids.shape[1]
    logits = model(input_ids=ids, attention_mask=attention, position_ids=positions).logits
    return logits[:, -width - 1:-1].float() / TEMPERATURE, batch.completion_mask > 0


def _paths(model, monkeypatch):
    """name -> a policy on each head path: packed fast path, chunked LM head, plain forward."""
    return {"fast": lambda: CausalPolicy(model, temperature=TEMPERATURE),
            "chunked": lambda: (monkeypatch.setattr(policy_module, "CHUNK_ELEMENTS", 64),
                                CausalPolicy(model, temperature=TEMPERATURE))[1],
            "plain": lambda: CausalPolicy(model, temperature=TEMPERATURE, fast=False)}


@pytest.mark.parametrize("path", ["fast", "chunked", "plain"])
def test_logit_stats_equal_a_direct_softmax(tiny_model, make_train_batch, monkeypatch, path):
    batch = make_train_batch(tiny_model, PROMPTS * 2)
    policy = _paths(tiny_model, monkeypatch)[path]()
    with torch.no_grad():
        logp, _, stats = policy.batch_token_stats(batch, stats=("logsumexp", "logit", "sum_pi_squared"))
        alone, _ = policy.batch_logprobs(batch)
        logits, valid = _direct(tiny_model, batch)
    assert torch.equal(logp, alone)  # asking for stats does not change the log-probs
    picked = logits.gather(-1, batch.completion_ids[..., None]).squeeze(-1)
    expected = {"logsumexp": logits.logsumexp(-1), "logit": picked,
                "sum_pi_squared": (logits.softmax(-1) ** 2).sum(-1)}
    for name, want in expected.items():
        torch.testing.assert_close(stats[name][valid], want[valid], rtol=1e-5, atol=1e-5, msg=name)
    torch.testing.assert_close(stats["logit"] - stats["logsumexp"], logp)  # logit = log-prob + logsumexp
    assert 0 < float(stats["sum_pi_squared"][valid].min()) and float(stats["sum_pi_squared"].max()) <= 1


def test_logsumexp_and_logit_gradients_match_the_plain_forward(tiny_model, make_train_batch, monkeypatch):
    batch = make_train_batch(tiny_model, PROMPTS * 2)
    g = torch.Generator().manual_seed(3)
    shape = batch.completion_mask.shape
    w1, w2 = torch.randn(shape, generator=g), torch.randn(shape, generator=g)
    grads = {}
    for name, make in _paths(tiny_model, monkeypatch).items():
        tiny_model.zero_grad()
        _, _, stats = make().batch_token_stats(batch, stats=("logsumexp", "logit"))
        ((stats["logsumexp"] * w1 + stats["logit"] * w2) * batch.completion_mask).sum().backward()
        grads[name] = torch.cat([p.grad.flatten() for p in tiny_model.parameters() if p.grad is not None])
    assert grads["plain"].norm() > 0
    for name in ("fast", "chunked"):
        assert (grads[name] - grads["plain"]).norm() <= 1e-4 * grads["plain"].norm(), name


class _Spy:
    """A policy that records which seam the update step used."""

    forwards = 0
    exact_logprobs = True

    def __init__(self, policy):
        self.policy, self.calls = policy, []

    def parameters(self):
        return self.policy.parameters()

    def begin_step(self, seed):
        pass

    def batch_logprobs(self, batch, *, with_entropy=False):
        self.calls.append("logprobs")
        return self.policy.batch_logprobs(batch, with_entropy=with_entropy)

    def batch_token_stats(self, batch, *, with_entropy=False, stats=()):
        self.calls.append(("stats", tuple(stats)))
        return self.policy.batch_token_stats(batch, with_entropy=with_entropy, stats=stats)


def _counts(batch):
    return {"num_tokens": float(batch.completion_mask.sum()), "num_seqs": float(len(batch))}


def test_an_objective_that_declares_nothing_asks_for_nothing(tiny_model, make_train_batch):
    batch = make_train_batch(tiny_model, PROMPTS * 2)
    spy = _Spy(CausalPolicy(tiny_model))
    micro_batch_loss(spy, batch, build.build_loss(load_config(None, FAST)), **_counts(batch))
    assert spy.calls == ["logprobs"]


def test_shiq_gets_the_logsumexp_of_the_same_forward(tiny_model, make_train_batch):
    """The update step's ShiQ loss, with its logsumexp from the one forward of the step, equals
    `shiq_loss` evaluated on a direct softmax of the model's logits."""
    batch = make_train_batch(tiny_model, PROMPTS * 2)
    mask = batch.completion_mask
    g = torch.Generator().manual_seed(5)
    batch.ref_logsumexp = (torch.rand(mask.shape, generator=g) + 2.0) * mask
    rewards = torch.tensor([1.0, 0.0, 0.1, 1.0, 0.0, 0.0, 1.0, float("nan")])
    last = mask.cumsum(-1).argmax(-1)
    batch.token_rewards = torch.zeros_like(mask).scatter(1, last[:, None], rewards[:, None].nan_to_num(0.0))
    batch.token_rewards[7] = float("nan")  # an unscorable row: no loss
    config = load_config(None, [*FAST, "algo.objective=shiq", "algo.shiq_beta=0.2", "algo.aggregation=token_sum"])
    spec = build.build_loss(config)
    spy = _Spy(CausalPolicy(tiny_model, temperature=TEMPERATURE))
    loss, sums = micro_batch_loss(spy, batch, spec, **_counts(batch))
    assert spy.calls == [("stats", ("logsumexp",))]  # one forward: log-probs and logsumexp together
    with torch.no_grad():
        logits, _ = _direct(tiny_model, batch)
    logp = torch.log_softmax(logits, -1).gather(-1, batch.completion_ids[..., None]).squeeze(-1)
    keep = mask.clone()
    keep[7] = 0.0
    want = shiq_loss(logp, batch.ref_logp, logits.logsumexp(-1), batch.ref_logsumexp,
                     batch.token_rewards.nan_to_num(0.0), keep, beta=0.2).sum()
    torch.testing.assert_close(loss.detach(), want, rtol=1e-5, atol=1e-6)
    assert sums["shiq_abs_residual"] > 0


def test_otb_reads_the_trainers_sum_pi_squared(monkeypatch):
    """rl_step with the optimal token baseline: the old-policy pass hands the estimator Σπ² and
    log-probs equal to a direct softmax of the model's logits on the sampled tokens, and the
    batch's advantages are the estimator's on those inputs."""
    from rlvr.builder.components import build_components
    from rlvr.trainer import sync

    # The shipped warm start (not a random model): some completions earn a reward, so advantages are not all 0.
    fast = [o for o in FAST[1:] if not o.startswith("rollout.prompts_per_step=")]
    config = load_config(None, [*fast, "algo.advantage=optimal_token_baseline", "rollout.prompts_per_step=4",
                                f"rollout.temperature={TEMPERATURE}", "algo.dynamic_sampling=false"])
    c = build_components(config)
    seen = {}

    def spy(inp):
        seen["inputs"] = inp
        return c_estimate(inp)

    c_estimate = c.learner.advantage.estimate
    c = dataclasses.replace(c, learner=dataclasses.replace(
        c.learner, advantage=dataclasses.replace(c.learner.advantage, estimate=spy)))
    monkeypatch.setattr(sync, "optimizer_step", lambda policy, opt, sched, batch, spec, **kw: seen.update(batch=batch)
                        or {})
    monkeypatch.setattr(sync, "_minibatches", lambda groups, count, size, generator, extra=0: [
        torch.arange(groups * size)])  # the rows in their order, so the batch lines up with the inputs
    sync.rl_step(c, 1)
    inp, batch = seen["inputs"], seen["batch"]
    assert batch.old_logp is None  # the on-policy shortcut still holds for the loss
    with torch.no_grad():
        logits, valid = _direct(c.learner.model, batch)
    probs = logits.softmax(-1)
    torch.testing.assert_close(inp.sum_pi_squared[valid], (probs ** 2).sum(-1)[valid], rtol=1e-5, atol=1e-6)
    direct_logp = torch.log_softmax(logits, -1).gather(-1, batch.completion_ids[..., None]).squeeze(-1)
    torch.testing.assert_close(inp.old_logp[valid], direct_logp[valid], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(batch.advantages, optimal_token_baseline(inp, zero_tail=True)[0])
    assert batch.advantages.abs().sum() > 0


def test_a_run_with_the_optimal_token_baseline_trains(tmp_path, capsys):
    from rlvr.cli import main

    code = main(["train", "trainer.steps=3", "trainer.eval_every=0", f"trainer.out_dir={tmp_path}", "trainer.name=otb",
                 *FAST[1:], "algo.advantage=optimal_token_baseline_multi_turn", "trainer.minibatches=2",
                 "algo.dynamic_sampling=false"])
    assert code == 0, capsys.readouterr().err
    lines = [json.loads(line) for line in (tmp_path / "otb" / "metrics.jsonl").read_text().splitlines()[1:]]
    assert all(torch.isfinite(torch.tensor(line["loss/policy"])) for line in lines)
    assert any(line["actor/grad_norm"] > 0 for line in lines)


def _expert_logp(c, examples, texts) -> float:
    from rlvr.trainer.expert import expert_part

    part = expert_part(c.rollout.tokenizer, examples, texts)
    with torch.no_grad():
        logp, _ = c.learner.policy.batch_logprobs(part)
    return float((logp * part.completion_mask).sum() / part.completion_mask.sum())


def test_shiq_trains_on_expert_rows_and_raises_their_likelihood():
    """The ShiQ recipe end to end (tiny model, a pool of 4 expert problems): finite losses, a
    reference built with kl_coef 0, and the expert solutions' mean log-prob rises."""
    from rlvr.builder.components import build_components
    from rlvr.trainer.sync import rl_step

    config = load_config("recipes/shiq_countdown.yaml", [*FAST, "expert.per_step=4", "expert.pool_size=4",
                                                         "optim.lr=3e-3", "optim.warmup_steps=0"])
    c = build_components(config)
    # ShiQ's own reference; the expert rows go through shiq
    assert c.learner.reference is not None and c.learner.loss.expert is None
    examples, texts = c.learner.expert.solutions(c.learner.expert.pool)
    before = _expert_logp(c, examples, texts)
    losses = [rl_step(c, step)[0]["loss/policy"] for step in range(1, 9)]
    after = _expert_logp(c, examples, texts)
    assert all(torch.isfinite(torch.tensor(losses)))
    assert after > before + 0.1, (before, after)


def test_declared_needs_are_data_the_trainer_knows():
    for name, fn in OBJECTIVES.items():
        assert needs_of(fn) <= set(OBJECTIVE_NEEDS) <= set(REGISTRY["algo.objective"].data), name
    fields = {f.name for f in dataclasses.fields(AdvantageInputs)}
    for name, fn in ADVANTAGES.items():
        assert needs_of(fn) <= set(ADVANTAGE_NEEDS) <= fields, name
    assert needs_of(OBJECTIVES["shiq"]) and needs_of(ADVANTAGES["optimal_token_baseline"])
    assert not needs_of(OBJECTIVES["ppo_clip"]) and not needs_of(ADVANTAGES["grpo"])


@pytest.mark.parametrize("overrides, message", [
    (["algo.objective=shiq", "model.kind=diffusion"], "algo.objective: shiq reads the logits' logsumexp"),
    (["algo.advantage=optimal_token_baseline", "model.kind=diffusion"], "algo.advantage: the optimal token baseline"),
    (["algo.objective=shiq", "algo.shiq_beta=0"], "algo.shiq_beta: must be > 0"),
])
def test_entries_that_need_logits_are_refused_where_there_are_none(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, ["model.path=", *overrides])


def test_shiq_resolves_its_beta_through_the_config():
    config = load_config(None, ["algo.objective=shiq"])
    assert config.algo.shiq_beta == 0.1 and config.algo.clip_low is None
    assert build.build_loss(load_config(None, ["algo.objective=shiq", "algo.shiq_beta=0.3"])
                            ).objective.keywords == {"shiq_beta": 0.3}


def test_shiq_gradient_through_the_logits_matches_finite_differences():
    """The registered objective differentiated through logp and logsumexp of the same logits
    (float64 gradcheck: the future-KL and soft-value terms carry gradient to every position)."""
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 5, (3, 4), generator=g)
    mask = torch.tensor([[1.0, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]])
    ref_logits = torch.randn(3, 4, 5, generator=g, dtype=torch.float64)
    ref_logp = torch.log_softmax(ref_logits, -1).gather(-1, tokens[..., None]).squeeze(-1)
    rewards = torch.zeros(3, 4, dtype=torch.float64)
    rewards[0, 3], rewards[1, 1] = 1.0, 0.5

    def loss(logits):
        logp = torch.log_softmax(logits, -1).gather(-1, tokens[..., None]).squeeze(-1)
        out, _ = OBJECTIVES["shiq"](logp, logp.detach(), torch.zeros_like(logp), mask.double(),
                                    logsumexp=logits.logsumexp(-1), ref_logp=ref_logp,
                                    ref_logsumexp=ref_logits.logsumexp(-1), token_rewards=rewards, shiq_beta=0.3)
        return out.sum()

    logits = torch.randn(3, 4, 5, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(loss, (logits,))
    loss(logits).backward()
    assert logits.grad[2, 1:].abs().sum() == 0 and logits.grad[0, 0].abs().sum() > 0  # padding gets nothing
