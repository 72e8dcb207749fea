"""Token-budget micro-batches: bins under the budget with each row once, balanced ranks, a one-line
error for a budget below one row, and a whole step's metrics and weights equal to row micro-batches."""

import copy
from functools import partial

import pytest
import torch

from rlvr.algos.aggregate import AGGREGATIONS
from rlvr.algos.kl import k3
from rlvr.algos.objectives import ppo_clip
from rlvr.batch import TrainBatch
from rlvr.errors import ConfigError
from rlvr.models.policy import CausalPolicy
from rlvr.runtime.distributed import Shard
from rlvr.trainer import budget
from rlvr.trainer.logit_stats import no_grad_outputs
from rlvr.trainer.step import LossSpec, optimizer_step

PROMPTS = ["3 5 2>13:", "1 2 3>6:", "9 9 9>729:", "4 4 1>17:"] * 3


def _hand_batch() -> TrainBatch:
    """Two groups of two rows (prompts of 2 and 3 tokens), completions scored up to 4, 1, 4, 2 tokens."""
    prompt_ids = torch.tensor([[0, 5, 6], [0, 5, 6], [7, 8, 9], [7, 8, 9]])
    prompt_mask = torch.tensor([[0, 1, 1], [0, 1, 1], [1, 1, 1], [1, 1, 1]])
    completion_mask = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 0, 1], [1, 1, 0, 0]]).float()
    return TrainBatch(prompt_ids, prompt_mask, torch.ones(4, 4, dtype=torch.long), completion_mask,
                      torch.zeros(4, 4))


def test_bins_hold_every_row_once_under_the_budget():
    batch = _hand_batch()
    # groups cost 2 + 4 + 1 = 7 and 3 + 4 + 2 = 9 (row 2's last scored token is its 4th)
    assert budget.token_bins(batch, 16) == [[0, 1, 2, 3]]
    assert budget.token_bins(batch, 14) == [[2, 3], [0, 1]]  # first-fit decreasing: the larger group first
    # a group over the budget is split into row runs, each with its own prompt copy: 3 + 4 | 3 + 2
    assert budget.token_bins(batch, 7) == [[0, 1], [2], [3]]


def test_budget_below_one_row_is_a_one_line_error():
    with pytest.raises(ConfigError) as err:
        budget.token_bins(_hand_batch(), 6)
    message = str(err.value)
    assert "\n" not in message and "trainer.micro_batch_tokens=6" in message and "(7 prompt" in message


def test_ranks_get_as_many_micro_batches_and_all_rows():
    batch = _hand_batch()
    shares = [budget.rank_bins(batch, 7, Shard(rank=r, size=2)) for r in range(2)]
    assert len(shares[0]) == len(shares[1]) == 2  # bins of 7, 7, 5 tokens: ranks get 7 and 7 + 5
    assert shares[0][1] is None or shares[1][1] is None
    rows = sorted(int(i) for share in shares for b in share if b is not None for i in b)
    assert rows == [0, 1, 2, 3]


def test_layout_metrics_hand_vector():
    metrics = budget.layout_metrics(_hand_batch(), forwards=2)
    # real tokens: prompts 2+2+3+3 = 10, completions 4+1+4+2 = 11; padded: 4 rows x 7 = 28
    assert metrics["perf/padding_share"] == pytest.approx(1 - 21 / 28)
    assert metrics["perf/shared_prompt_share"] == pytest.approx(5 / 21)  # one copy of each prompt repeated
    assert metrics["perf/tokens_per_micro_batch"] == pytest.approx(21 / 2)


def _step(model, batch, **micro):
    model = copy.deepcopy(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)  # the update is the (clipped) gradient itself
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    spec = LossSpec(objective=partial(ppo_clip, clip_low=0.2, clip_high=0.28),
                    aggregation=AGGREGATIONS["token_mean"], kl_estimator=k3, entropy_coef=0.01)
    keep = []
    metrics = optimizer_step(CausalPolicy(model), optimizer, scheduler, batch, spec, grad_clip=1.0, kl_coef=0.1,
                             keep=keep, **micro)
    return metrics, torch.cat([p.detach().flatten() for p in model.parameters()]), torch.cat(keep)


def test_whole_step_invariant_to_the_token_budget(tiny_model, make_train_batch):
    batch = make_train_batch(tiny_model, PROMPTS)
    longest = int((batch.prompt_mask.sum(-1) + batch.completion_mask.sum(-1)).max())
    rows, w_rows, kept_rows = _step(tiny_model, batch, micro_batch_size=len(batch))
    tokens, w_tokens, kept_tokens = _step(tiny_model, batch, micro_batch_size=len(batch),
                                          micro_batch_tokens=longest + 3)
    assert len(budget.token_bins(batch, longest + 3)) > 1  # several forwards
    assert rows.keys() == tokens.keys()
    for key, value in rows.items():
        assert tokens[key] == pytest.approx(value, rel=1e-5, abs=1e-7), key
    moved = (w_rows - torch.cat([p.detach().flatten() for p in tiny_model.parameters()])).abs().max()
    assert moved > 0 and (w_tokens - w_rows).abs().max() <= 1e-5 * moved
    assert torch.allclose(kept_tokens, kept_rows, atol=1e-6)  # kept log-probs back in batch order


def test_no_grad_pass_invariant_to_the_token_budget(tiny_model, make_train_batch):
    batch = make_train_batch(tiny_model, PROMPTS)
    policy = CausalPolicy(tiny_model)
    rows = no_grad_outputs(policy, batch, len(batch))["logp"]
    tokens = no_grad_outputs(policy, batch, len(batch), micro_batch_tokens=40)["logp"]
    assert rows.abs().sum() > 0 and torch.allclose(tokens, rows, atol=1e-6)


def test_critic_values_invariant_to_the_token_budget(tiny_model, make_train_batch):
    from rlvr.models.value import ValueModel
    from rlvr.trainer.critic import critic_values

    batch = make_train_batch(tiny_model, PROMPTS)
    critic = ValueModel(tiny_model)
    torch.nn.init.normal_(critic.head.weight, std=0.5)
    rows = critic_values(critic, batch, len(batch))
    tokens = critic_values(critic, batch, len(batch), micro_batch_tokens=40)
    assert rows.abs().sum() > 0 and torch.allclose(tokens, rows, atol=1e-6)
