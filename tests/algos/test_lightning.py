"""LightningRL's advantage (rlvr.algos.lightning): hand-computed values, the filter and the NLL bonus."""

import json

import pytest
import torch

from rlvr.algos._advantage_core import AdvantageInputs
from rlvr.algos.advantages import get_advantage
from rlvr.algos.lightning import lightning, tokens_per_forward
from rlvr.cli import main
from rlvr.config import load_config
from rlvr.errors import ConfigError

# Window L = 4. Group 0: rows committing in 4, 2, 1 and 4 steps (1, 2, 4 and 1 tokens per forward).
# Group 1: four correct rows, each in 2 steps (no spread in either reward).
TRACE = torch.tensor([[0, 1, 2, 3], [0, 0, 1, 1], [0, 0, 0, 0], [3, 2, 1, 0],
                      [0, 1, 0, 1], [1, 0, 1, 0], [0, 0, 1, 1], [1, 1, 0, 0]])
REWARDS = torch.tensor([1.0, 1.0, 0.1, 0.0, 1.0, 1.0, 1.0, 1.0])


def _inputs(rewards=REWARDS):
    return AdvantageInputs(rewards=rewards, group_size=4, response_mask=torch.ones(8, 4), trace=TRACE)


def test_tokens_per_forward_is_window_over_steps():
    assert tokens_per_forward(TRACE).tolist() == [1.0, 2.0, 4.0, 1.0, 2.0, 2.0, 2.0, 2.0]


def test_hand_computed_advantage():
    # task reward, group 0: [1, 1, .1, 0], mean .525, Bessel std .55 -> [.8636, .8636, -.7727, -.9545]
    # speed reward c·tpf: [1, 2, 0, 0], mean .75, std sqrt(11/12) = .9574 -> [.2611, 1.3056, -.7833, -.7833]
    # sum with λ = .5: [.9942, 1.5164, -1.1644, -1.3462]; whitened over the kept group's 16 tokens
    # (mean 0, std sqrt(4·Σx²/15) = 1.3121): [.7577, 1.1557, -.8874, -1.0260]; + β = .1 on the correct rows.
    # Group 1 is dropped (advantage 0), its correct rows keep the bonus .1.
    adv, metrics = lightning(_inputs(), speed_weight=0.5, nll_coef=0.1)
    expected = torch.tensor([0.8577, 1.2557, -0.8874, -1.0260, 0.1, 0.1, 0.1, 0.1])
    torch.testing.assert_close(adv, expected[:, None].expand(8, 4), atol=1e-4, rtol=0)
    assert metrics["lightning/kept_groups"] == 0.5
    assert metrics["lightning/tpf_correct"] == pytest.approx((1 + 2 + 2 * 4) / 6)


def test_unfiltered_group_joins_the_whitening():
    # group 1's sum is 0; over 32 tokens the std is sqrt(4·Σx²/31) = .9127: row 0 .9942 / .9127 = 1.0893
    adv, metrics = lightning(_inputs(), speed_weight=0.5, nll_coef=0.0, tpf_filter=False)
    torch.testing.assert_close(adv[:, 0], torch.tensor([1.0893, 1.6614, -1.2758, -1.4750, 0, 0, 0, 0]),
                               atol=1e-4, rtol=0)
    assert metrics["lightning/kept_groups"] == 1.0


def test_speed_weight_zero_ranks_equally_correct_rows_equally_and_speed_separates_them():
    slow_fast = lightning(_inputs(), speed_weight=1.0)[0][:, 0]
    plain = lightning(_inputs(), speed_weight=0.0)[0][:, 0]
    assert plain[0] == plain[1]  # both correct: the task reward alone cannot tell them apart
    assert slow_fast[1] > slow_fast[0]  # the faster correct row (2 tokens per forward) gets more


def test_registered_and_needs_the_trace():
    assert get_advantage("lightning") is lightning
    with pytest.raises(ValueError, match="trace"):
        lightning(AdvantageInputs(rewards=REWARDS, group_size=4, response_mask=torch.ones(8, 4)))


def test_config_needs_a_diffusion_model():
    with pytest.raises(ConfigError, match="algo.advantage"):
        load_config(None, ["algo.advantage=lightning"])


@pytest.mark.slow
def test_recipe_trains_and_logs_tokens_per_forward(tmp_path, capsys):
    args = ["train", "recipes/dllm_lightning_countdown.yaml", "trainer.steps=3", "trainer.threads=1",
            "trainer.save_every=0", "trainer.eval_samples=0", "trainer.eval_every=0", f"trainer.out_dir={tmp_path}",
            "trainer.name=run"]
    assert main(args) == 0, capsys.readouterr().err
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()][1:]
    assert len(steps) == 3
    for s in steps:  # threshold decoding of a 16-token window: between 1 and 16 tokens per forward, never exactly 1
        assert 1.0 < s["adv/lightning/tpf_mean"] <= 16.0
        assert 0.0 <= s["adv/lightning/kept_groups"] <= 1.0
