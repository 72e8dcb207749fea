"""Turn-level advantages: hand-computed GiGPO vectors, turn_return's single-turn equivalence,
and the loss gradient on observation tokens (exactly zero)."""

import pytest
import torch

from rlvr.algos.advantages import AdvantageInputs, get_advantage, grpo
from rlvr.algos.turn_advantages import discounted_returns


def _inputs(turn_index, rewards, states, valid, group_size=4, mask=None):
    turn_index = torch.tensor(turn_index)
    mask = (turn_index >= 0).float() if mask is None else torch.tensor(mask, dtype=torch.float32)
    r = torch.tensor(rewards)
    return AdvantageInputs(rewards=(r * torch.tensor(valid)).sum(-1), group_size=group_size, response_mask=mask,
                           turn_index=turn_index, turn_rewards=r, turn_states=torch.tensor(states),
                           turn_valid=torch.tensor(valid))


# Four guess-number episodes of one prompt. Every episode starts in state 0; episodes 0 and 1
# reach state 1, episode 2 state 2 (seen once), episode 3 stops after one turn.
# tokens per row: 2 of turn 0, 1 observation token of turn 0 (mask 0), 2 of turn 1.
GROUP = dict(
    turn_index=[[0, 0, 0, 1, 1], [0, 0, 0, 1, 1], [0, 0, 0, 1, 1], [0, 0, -1, -1, -1]],
    mask=[[1, 1, 0, 1, 1], [1, 1, 0, 1, 1], [1, 1, 0, 1, 1], [1, 1, 0, 0, 0]],
    rewards=[[0.0, 1.0], [0.0, 0.0], [0.0, 1.0], [0.0, 0.0]],
    states=[[0, 1], [0, 1], [0, 2], [0, -1]],
    valid=[[True, True], [True, True], [True, True], [True, False]],
)


def test_gigpo_hand_computed_without_std():
    # R = [1, 0, 1, 0], mean 0.5 -> A^E = [.5, -.5, .5, -.5]
    # gamma .5: G = [[.5, 1], [0, 0], [.5, 1], [0]]
    # anchor state 0 (4 turns): mean .25 -> [.25, -.25, .25, -.25]; state 1: [1, 0] mean .5 -> [.5, -.5];
    # state 2 is a singleton -> 0.  Token = A^E + A^S of its turn; observation tokens 0.
    adv, m = get_advantage("gigpo")(_inputs(**GROUP), gamma=0.5, omega=1.0, std_normalize=False)
    expected = [[0.75, 0.75, 0, 1.0, 1.0], [-0.75, -0.75, 0, -1.0, -1.0], [0.75, 0.75, 0, 0.5, 0.5],
                [-0.75, -0.75, 0, 0, 0]]
    assert torch.allclose(adv, torch.tensor(expected), atol=1e-6)
    assert m["anchor_frac"] == pytest.approx(6 / 7)
    assert m["anchor_size_mean"] == pytest.approx((4 * 4 + 2 * 2 + 1) / 7)


def test_gigpo_with_std_and_omega():
    adv, _ = get_advantage("gigpo")(_inputs(**GROUP), gamma=0.5, omega=0.5, std_normalize=True, adv_eps=0.0)
    std_e = torch.tensor([1.0, 0, 1, 0]).std().item()        # Bessel, = 0.57735
    std_s0 = torch.tensor([0.5, 0, 0.5, 0]).std().item()      # = 0.288675
    std_s1 = torch.tensor([1.0, 0.0]).std().item()            # = 0.707107
    assert adv[0, 0].item() == pytest.approx(0.5 / std_e + 0.5 * 0.25 / std_s0)
    assert adv[0, 3].item() == pytest.approx(0.5 / std_e + 0.5 * 0.5 / std_s1)
    assert adv[2, 3].item() == pytest.approx(0.5 / std_e)  # singleton state: the episode term only


def test_discounted_returns():
    out = discounted_returns(torch.tensor([[1.0, 2.0, 4.0], [1.0, 9.0, 9.0]]),
                             torch.tensor([[True, True, True], [True, False, False]]), 0.5)
    assert out.tolist() == [[1 + 1 + 1, 2 + 2, 4], [1, 0, 0]]


def test_turn_return_with_one_turn_is_grpo():
    rewards = torch.tensor([[1.0], [0.0], [0.0], [1.0], [1.0], [0.5], [0.0], [0.25]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 0, 0]] * 2, dtype=torch.float32)
    inp = AdvantageInputs(rewards=rewards[:, 0], group_size=4, response_mask=mask,
                          turn_index=torch.where(mask > 0, 0, -1), turn_rewards=rewards,
                          turn_states=torch.zeros(8, 1, dtype=torch.long),
                          turn_valid=torch.ones(8, 1, dtype=torch.bool))
    a, _ = get_advantage("turn_return")(inp, gamma=0.9)
    b, _ = grpo(inp)
    assert torch.allclose(a, b, atol=1e-6)


def test_turn_advantages_need_turn_tensors():
    inp = AdvantageInputs(rewards=torch.zeros(4), group_size=4, response_mask=torch.ones(4, 2))
    with pytest.raises(ValueError, match="agent task"):
        get_advantage("gigpo")(inp)
