"""Off-policy expert rows: they reach the expert objective with their own mask and behaviour
log-probs, the on-policy gradient is untouched at μ = 0, and a run with them trains."""

import json
from functools import partial

import pytest
import torch

from rlvr.algos.aggregate import AGGREGATIONS
from rlvr.algos.hybrid import sft
from rlvr.algos.objectives import ppo_clip
from rlvr.models.policy import CausalPolicy
from rlvr.tasks.countdown import Countdown
from rlvr.trainer.expert import ExpertSource, expert_part, extend
from rlvr.trainer.step import LossSpec, micro_batch_loss

PROMPTS = ["3 5 2>13:", "1 2 3>6:", "9 9 9>729:", "4 4 1>17:"] * 2
EXPERT = [("7 2>14:", "7*2"), ("8 1 3>12:", "8+1+3"), ("6 6>36:", "6*6")]


class _Ex:
    def __init__(self, prompt):
        self.prompt = prompt


def _merged(tiny_model, tokenizer, make_train_batch, mu, *, keep_onpolicy=False, token_units=False):
    batch = make_train_batch(tiny_model, PROMPTS, with_old=False)
    batch.ref_logp = None
    part = expert_part(tokenizer, [_Ex(p) for p, _ in EXPERT], [s for _, s in EXPERT])
    merged = extend(batch, part, onpolicy_rewards=torch.tensor([0.0, 1.0] * 4), expert_rewards=torch.ones(3), mu=mu,
                    keep_onpolicy=keep_onpolicy, token_units=token_units, pad_id=tokenizer.pad_token_id,
                    logprobs=lambda kind, part: None)
    return batch, part, merged


def _grad(model, batch, spec):
    model.zero_grad()
    loss, sums = micro_batch_loss(CausalPolicy(model), batch, spec, num_tokens=float(batch.completion_mask.sum()),
                                  num_seqs=float((batch.completion_mask.sum(-1) > 0).sum()))
    loss.backward()
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]), sums


def test_expert_rows_reach_the_expert_objective_with_their_mask(tiny_model, tokenizer, make_train_batch):
    batch, part, merged = _merged(tiny_model, tokenizer, make_train_batch, 0.5)
    assert merged.expert.tolist() == [False] * len(PROMPTS) + [True] * len(EXPERT)
    seen = {}

    def recording(logp, old_logp, expert_logp, advantages, mask):
        seen.update(rows=logp.shape[0], mask=mask.clone(), expert_logp=expert_logp.clone(), adv=advantages.clone())
        return sft(logp, old_logp, expert_logp, advantages, mask)

    spec = LossSpec(objective=ppo_clip, aggregation=AGGREGATIONS["seq_mean_token_mean"], kl_estimator=None,
                    entropy_coef=0.0, expert=recording)
    _, sums = _grad(tiny_model, merged, spec)
    width = seen["mask"].shape[1]
    assert seen["rows"] == len(EXPERT)
    assert torch.equal(seen["mask"][:, :part.completion_mask.shape[1]], part.completion_mask)
    assert seen["mask"][:, part.completion_mask.shape[1]:].sum() == 0 and width == merged.completion_ids.shape[1]
    assert seen["mask"].sum(-1).tolist() == [4.0, 6.0, 4.0]  # solution characters + EOS
    assert torch.equal(seen["expert_logp"], torch.zeros_like(seen["expert_logp"]))  # a deterministic expert
    assert (seen["adv"].sum(-1) > 0).all()  # reward 1 beats the step's mean of 0.5
    total = float(merged.completion_mask.sum())
    assert sums["expert_token_frac"] == pytest.approx(float(part.completion_mask.sum()))
    assert sums["expert_token_frac"] / total < 1


@pytest.mark.parametrize("aggregation", ["seq_mean_token_mean", "token_mean"])
def test_on_policy_gradient_is_unchanged_at_zero_expert_weight(tiny_model, tokenizer, make_train_batch, aggregation):
    batch, _, merged = _merged(tiny_model, tokenizer, make_train_batch, 0.0, token_units=aggregation == "token_mean")
    spec = LossSpec(objective=partial(ppo_clip, clip_low=0.2, clip_high=0.2), aggregation=AGGREGATIONS[aggregation],
                    kl_estimator=None, entropy_coef=0.01, expert=sft)
    alone, _ = _grad(tiny_model, batch, LossSpec(**{**spec.__dict__, "expert": None}))
    mixed, _ = _grad(tiny_model, merged, spec)
    assert alone.norm() > 0
    assert (alone - mixed).norm() / alone.norm() < 1e-6
    _, _, half = _merged(tiny_model, tokenizer, make_train_batch, 0.5, token_units=aggregation == "token_mean")
    moved, _ = _grad(tiny_model, half, spec)
    assert (alone - moved).norm() / alone.norm() > 1e-2  # the expert term does move the gradient


def test_full_expert_weight_is_sft_on_the_expert_rows(tiny_model, tokenizer, make_train_batch):
    _, part, merged = _merged(tiny_model, tokenizer, make_train_batch, 1.0)
    spec = LossSpec(objective=ppo_clip, aggregation=AGGREGATIONS["seq_mean_token_mean"], kl_estimator=None,
                    entropy_coef=0.0, expert=sft)
    mixed, _ = _grad(tiny_model, merged, spec)
    tiny_model.zero_grad()
    logp, _ = CausalPolicy(tiny_model).batch_logprobs(part)
    m = part.completion_mask
    (-((logp * m).sum(-1) / m.sum(-1)).mean()).backward()  # mean over rows of each row's mean NLL
    alone = torch.cat([p.grad.flatten() for p in tiny_model.parameters() if p.grad is not None])
    assert (alone - mixed).norm() / alone.norm() < 1e-6


def test_expert_source_pool_is_fixed_and_draws_are_per_step():
    task = Countdown(ordered=True)
    source = ExpertSource(task, seed=3, per_step=4, pool_size=6)
    again = ExpertSource(task, seed=3, per_step=4, pool_size=6)
    pool = {ex.prompt for ex in source.pool}
    assert len(source.pool) == 6 and pool == {ex.prompt for ex in again.pool}
    draws = [source.draw(step) for step in range(1, 6)]
    assert all({ex.prompt for ex in d} <= pool and len({ex.prompt for ex in d}) == 4 for d in draws)
    assert [ex.prompt for ex in source.draw(2)] == [ex.prompt for ex in again.draw(2)]  # resume-safe
    examples, texts = source.solutions(draws[0])
    assert all(task.is_correct(t, ex) for ex, t in zip(examples, texts))


def test_a_run_with_expert_rows_trains_and_logs_them(tmp_path, capsys):
    from rlvr.cli import main

    code = main(["train", "trainer.steps=2", "trainer.eval_every=0", f"trainer.out_dir={tmp_path}",
                 "trainer.name=ex", "rollout.prompts_per_step=2", "rollout.group_size=4", "task.heldout_size=8",
                 "expert.per_step=3", "expert.pool_size=4", "expert.objective=rlplus", "trainer.minibatches=2",
                 "trainer.threads=1", "algo.dynamic_sampling=false"])
    assert code == 0, capsys.readouterr().err
    last = json.loads((tmp_path / "ex" / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["expert/rows"] == 3 and last["expert/accuracy"] == 1.0 and last["expert/mu"] == 0.5
    assert 0 < last["actor/expert_token_frac"] < 1 and last["actor/expert_mis_ratio"] > 0
