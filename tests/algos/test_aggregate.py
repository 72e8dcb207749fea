"""Aggregation table and micro-batch invariance of the gradient."""

import pytest
import torch

from rlvr.algos._registry import needs_of
from rlvr.algos.aggregate import AGGREGATIONS, get_aggregation, global_counts
from rlvr.algos.objectives import OBJECTIVES

LOSS = torch.tensor([[1.0, 2.0, 3.0, 0.0], [4.0, 0.0, 0.0, 0.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]])

TRACE = torch.tensor([[0, 1, 1, 2], [0, 1, 2, 3]])  # the sampler's commit step of each token (step_mean)

# (1+2+3+4)/4 tokens = 2.5; sum 10; (6+4)/2 seqs = 5; (6/3 + 4/1)/2 = 3; 10/(2*4) = 1.25;
# step_mean: row 0 steps {1}, {2, 3} -> (1 + 2.5)/2 = 1.75, row 1 {4} -> 4: (1.75 + 4)/2 = 2.875
TABLE = {
    "token_mean": 2.5,
    "token_sum": 10.0,
    "seq_mean_token_sum": 5.0,
    "seq_mean_token_mean": 3.0,
    "seq_mean_token_sum_norm": 1.25,
    "step_mean": 2.875,
}


def _steps(name: str, rows: int = 2) -> dict:
    """The trace keyword for an aggregation that declares it, `rows` rows (padding rows: step 0)."""
    if "trace" not in needs_of(AGGREGATIONS[name]):
        return {}
    return {"trace": torch.cat([TRACE, torch.zeros(rows - 2, 4, dtype=torch.long)])}


def test_table_covers_registry():
    assert set(TABLE) == set(AGGREGATIONS)


@pytest.mark.parametrize("name", sorted(TABLE))
def test_aggregation_table(name):
    num_tokens, num_seqs = global_counts([MASK])
    assert (num_tokens, num_seqs) == (4.0, 2.0)
    out = AGGREGATIONS[name](LOSS, MASK, num_tokens=num_tokens, num_seqs=num_seqs, norm_length=4.0, **_steps(name))
    assert out.dim() == 0
    assert abs(out.item() - TABLE[name]) < 1e-6


@pytest.mark.parametrize("name", sorted(TABLE))
def test_padding_junk_and_empty_rows(name):
    loss = LOSS.clone()
    loss[0, 3] = float("inf")
    loss[1, 1] = float("nan")
    loss = torch.cat([loss, torch.full((1, 4), float("nan"))])  # an all-padding row
    mask = torch.cat([MASK, torch.zeros(1, 4)])
    num_tokens, num_seqs = global_counts([mask])
    assert num_seqs == 2.0  # the empty row is not counted
    out = AGGREGATIONS[name](loss, mask, num_tokens=num_tokens, num_seqs=num_seqs, norm_length=4.0,
                             **_steps(name, rows=3))
    assert abs(out.item() - TABLE[name]) < 1e-6


def test_missing_counts_raise():
    with pytest.raises(ValueError, match="num_tokens"):
        AGGREGATIONS["token_mean"](LOSS, MASK)
    with pytest.raises(ValueError, match="norm_length"):
        AGGREGATIONS["seq_mean_token_sum_norm"](LOSS, MASK, num_seqs=2.0)
    with pytest.raises(ValueError, match=r"unknown aggregation 'mean'; valid: .*token_mean"):
        get_aggregation("mean")


def _policy_batch(B=8, T=6, D=5, seed=0):
    """A tiny linear 'policy': logp = log_softmax(x @ W) gathered at sampled tokens."""
    g = torch.Generator().manual_seed(seed)
    W = torch.randn(D, 7, generator=g, dtype=torch.float64, requires_grad=True)
    x = torch.randn(B, T, D, generator=g, dtype=torch.float64)
    tokens = torch.randint(0, 7, (B, T), generator=g)
    lengths = torch.tensor([6, 1, 3, 0, 5, 2, 6, 4])[:B]  # includes a 1-token and an empty row
    mask = (torch.arange(T)[None, :] < lengths[:, None]).double()
    adv = torch.randn(B, T, generator=g, dtype=torch.float64)
    return W, x, tokens, mask, adv


REQUIRED = {"dro": {"dro_beta": 0.05}}  # hyperparameters without a default
# KL-Cov / Clip-Cov pick their tokens within each micro-batch (as verl does): by design not invariant
PER_MICRO_BATCH = {"kl_cov", "clip_cov"}


def _declared(objective, logits, tokens, adv, trace):
    """The data keywords an objective declared (`needs`: ShiQ's logsumexp, reference, rewards, DiPO's
    commit steps), from the same logits; a fixed perturbation of them plays the reference."""
    wanted = needs_of(OBJECTIVES[objective])
    ref_logits = 0.8 * logits.detach()
    values = {"logsumexp": logits.logsumexp(-1), "logit": logits.gather(-1, tokens[..., None]).squeeze(-1),
              "ref_logsumexp": ref_logits.logsumexp(-1),
              "ref_logp": torch.log_softmax(ref_logits, -1).gather(-1, tokens[..., None]).squeeze(-1),
              "token_rewards": adv.detach().abs(), "trace": trace}
    if {"draws", "old_draws"} & wanted:  # BGPO: two per-row "ELBO draws" (B, 2) from the same logits
        logp = torch.log_softmax(logits, -1).gather(-1, tokens[..., None]).squeeze(-1)
        draws = torch.stack([logp.sum(-1), 0.5 * logp.sum(-1)], dim=-1)
        values.update(draws=draws, old_draws=draws.detach() + 0.1)
    return {k: values[k] for k in wanted}


def _grad(name, n_micro, objective="reinforce"):
    W, x, tokens, mask, adv = _policy_batch()
    old_shift = torch.randn(mask.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * 0.2
    num_tokens, num_seqs = global_counts(mask.chunk(n_micro))
    rows, width = mask.shape  # commit steps for step_mean: rows alternate 1 and 2 tokens per step
    trace = (torch.arange(width)[None, :] // (1 + torch.arange(rows)[:, None] % 2)).contiguous()
    total = 0.0
    chunks = zip(*(t.chunk(n_micro) for t in (x, tokens, mask, adv, old_shift, trace)))
    for xs, ts, ms, advs, shift, steps in chunks:
        logits = xs @ W
        logp = torch.log_softmax(logits, dim=-1).gather(-1, ts[..., None]).squeeze(-1)
        loss_tok, _ = OBJECTIVES[objective](logp, logp.detach() + shift, advs, ms, **REQUIRED.get(objective, {}),
                                            **_declared(objective, logits, ts, advs, steps))
        extra = {"trace": steps} if "trace" in needs_of(AGGREGATIONS[name]) else {}
        part = AGGREGATIONS[name](loss_tok, ms, num_tokens=num_tokens, num_seqs=num_seqs, norm_length=6.0, **extra)
        part.backward()  # accumulate like gradient accumulation does
        total += part.item()
    return W.grad.clone(), total


@pytest.mark.parametrize("name", sorted(TABLE))
def test_micro_batch_invariance(name):
    g1, v1 = _grad(name, 1)
    for n in (2, 4, 8):
        gn, vn = _grad(name, n)
        torch.testing.assert_close(gn, g1, rtol=1e-6, atol=0)
        assert abs(vn - v1) <= 1e-6 * max(1.0, abs(v1))


@pytest.mark.parametrize("objective", sorted(set(OBJECTIVES) - PER_MICRO_BATCH))
@pytest.mark.parametrize("name", sorted(TABLE))
def test_micro_batch_invariance_through_every_objective(name, objective):
    g1, v1 = _grad(name, 1, objective)
    g2, v2 = _grad(name, 2, objective)
    torch.testing.assert_close(g2, g1, rtol=1e-6, atol=1e-12)
    assert abs(v2 - v1) <= 1e-6 * max(1.0, abs(v1))
