"""The update step: micro-batching never changes the gradient; the loss wiring is the algos math."""

from functools import partial

import pytest
import torch

from rlvr.algos._registry import needs_of
from rlvr.algos.aggregate import AGGREGATIONS
from rlvr.algos.kl import k3
from rlvr.algos.objectives import ppo_clip
from rlvr.models.policy import CausalPolicy
from rlvr.trainer.step import LossSpec, micro_batch_loss

PROMPTS = ["3 5 2>13:", "1 2 3>6:", "9 9 9>729:", "4 4 1>17:"] * 4


def _grads(model, batch, spec, micro_batch_size):
    model.zero_grad()
    policy = CausalPolicy(model, temperature=1.0)
    chunks = [batch.select(slice(i, i + micro_batch_size)) for i in range(0, len(batch), micro_batch_size)]
    num_tokens = float(batch.completion_mask.sum())
    num_seqs = float((batch.completion_mask.sum(-1) > 0).sum())
    for mb in chunks:
        loss, _ = micro_batch_loss(policy, mb, spec, num_tokens=num_tokens, num_seqs=num_seqs, kl_coef=0.1)
        loss.backward()
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


@pytest.mark.parametrize("aggregation", sorted(AGGREGATIONS))
def test_one_vs_four_micro_batches_same_gradient(tiny_model, make_train_batch, aggregation):
    batch = make_train_batch(tiny_model, PROMPTS)
    if "trace" in needs_of(AGGREGATIONS[aggregation]):  # step_mean: commit steps of 1, 2, 3, ... tokens per row
        rows, width = batch.completion_ids.shape
        batch.trace = (torch.arange(width)[None, :] // (1 + torch.arange(rows)[:, None] % 3)).contiguous()
    spec = LossSpec(objective=partial(ppo_clip, clip_low=0.2, clip_high=0.28),
                    aggregation=partial(AGGREGATIONS[aggregation], norm_length=10.0), kl_estimator=k3,
                    entropy_coef=0.01, aggregation_fields=tuple(needs_of(AGGREGATIONS[aggregation])))
    whole = _grads(tiny_model, batch, spec, len(batch))
    split = _grads(tiny_model, batch, spec, len(batch) // 4)
    assert whole.norm() > 0
    assert (whole - split).norm() / whole.norm() <= 1e-6


def test_on_policy_loss_is_minus_mean_advantage(tiny_model, make_train_batch):
    # With old = sg(current) the ratio is exactly 1: seq_mean_token_mean loss value = -mean_i A_i.
    batch = make_train_batch(tiny_model, PROMPTS, with_old=False)
    batch.ref_logp = None
    spec = LossSpec(objective=ppo_clip, aggregation=AGGREGATIONS["seq_mean_token_mean"], kl_estimator=None,
                    entropy_coef=0.0)
    loss, sums = micro_batch_loss(CausalPolicy(tiny_model), batch, spec,
                                  num_tokens=float(batch.completion_mask.sum()), num_seqs=float(len(batch)))
    per_seq_adv = batch.advantages.sum(-1) / batch.completion_mask.sum(-1)
    assert loss.item() == pytest.approx(-per_seq_adv.mean().item(), abs=1e-6)
    assert sums["clip_frac_low"] == 0 and sums["clip_frac_high"] == 0


def test_greedy_in_group_temperatures_and_config():
    from rlvr.config import load_config
    from rlvr.errors import ConfigError
    from rlvr.trainer.collect import row_temperatures

    r = load_config(None, ["model.kind=diffusion", "rollout.group_size=4", "rollout.temperature=0.8",
                           "rollout.greedy_in_group=true"]).rollout
    assert row_temperatures(r, 8).tolist() == pytest.approx([0.8, 0.8, 0.8, 0.0] * 2)
    assert row_temperatures(load_config(None, []).rollout, 8) == 1.0
    with pytest.raises(ConfigError, match=r"^rollout\.greedy_in_group: is implemented for model\.kind=diffusion"):
        load_config(None, ["rollout.greedy_in_group=true"])


def test_greedy_in_group_collects_the_greedy_decode_as_each_groups_last_row():
    from rlvr.builder.components import build_components
    from rlvr.config import load_config
    from rlvr.trainer.collect import collect, sample_seeds

    config = load_config("recipes/dllm_diffu_grpo_countdown.yaml",
                         ["rollout.prompts_per_step=2", "rollout.group_size=3", "rollout.greedy_in_group=true",
                          "trainer.threads=1"])
    c = build_components(config)
    got = collect(c.rollout, 1).rollouts
    r = config.rollout
    greedy = c.rollout.engine(got.prompt_ids[2::3], got.prompt_mask[2::3], torch.zeros(2, dtype=torch.long),
                              temperature=0.0)
    assert torch.equal(got.completion_ids[2::3], greedy.completion_ids)
    rows = torch.tensor([0, 1, 3, 4])  # the others are ordinary samples with their own seeds
    sampled = c.rollout.engine(got.prompt_ids[rows], got.prompt_mask[rows], sample_seeds(config.seed, 1, 6)[rows],
                       temperature=r.temperature)
    assert torch.equal(got.completion_ids[rows], sampled.completion_ids)


@pytest.mark.parametrize("workers", [1, 2])
def test_kept_log_probs_are_the_forward_before_the_update_in_row_order(tiny_model, make_train_batch, workers):
    """`optimizer_step(keep=...)` hands back the update's forward log-probs (pi_prox of a one-update
    step) in the batch's row order, micro-batches and row workers included."""
    from rlvr.runtime.rows import RowPool
    from rlvr.trainer.logit_stats import no_grad_outputs
    from rlvr.trainer.step import optimizer_step

    batch = make_train_batch(tiny_model, PROMPTS, with_old=False)
    policy = CausalPolicy(tiny_model, temperature=1.0)
    before = no_grad_outputs(policy, batch, 64)["logp"]
    spec = LossSpec(objective=ppo_clip, aggregation=AGGREGATIONS["seq_mean_token_mean"], kl_estimator=None,
                    entropy_coef=0.0)
    optimizer = torch.optim.SGD(tiny_model.parameters(), lr=0.5)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    kept = []
    optimizer_step(policy, optimizer, scheduler, batch, spec, micro_batch_size=6, grad_clip=0.0,
                   rows=RowPool(workers) if workers > 1 else None, keep=kept)
    torch.testing.assert_close(torch.cat(kept) * batch.completion_mask, before, atol=1e-5, rtol=1e-5)
    assert (no_grad_outputs(policy, batch, 64)["logp"] - before).abs().max() > 1e-4  # the update moved the policy
