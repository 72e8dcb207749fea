"""Several reward functions reach an advantage that normalises each on its own (GDPO): the
verifier's per-function scores travel from `RewardSum` through the rollout phase into
`AdvantageInputs`, only for estimators that declare they read them."""

import json
import math

import pytest
import torch

from rlvr.algos._advantage_core import whiten
from rlvr.algos._registry import needs_of
from rlvr.algos.advantages import ADVANTAGES, AdvantageInputs
from rlvr.builder import build
from rlvr.cli import main
from rlvr.config import load_config
from rlvr.errors import ConfigError
from rlvr.rewards.runner import RewardRunner, RewardSum
from rlvr.trainer.collect import Collected, scored
from rlvr.types import Example


def right(prompt, completion, **example):  # the rare success: one completion in four
    return float(completion == "a")


def formatted(prompt, completion, **example):  # the common one: two in four
    return float(completion in ("a", "b"))


class _Task:
    def is_correct(self, completion, example):
        return completion == "a"


TEXTS = ["a", "b", "c", "d"]  # right = [1, 0, 0, 0], formatted = [1, 1, 0, 0]: one group of G = 4


def _collected(reward) -> Collected:
    s = scored(reward, _Task(), [Example(prompt="q", answer="a")] * 4, TEXTS)
    return Collected([], None, TEXTS, s.rewards, s.correct, s.metrics, components=s.components,
                     component_weights=s.weights)


def _inputs(got: Collected, estimator: str) -> AdvantageInputs:
    needs = needs_of(ADVANTAGES[estimator])
    return AdvantageInputs(rewards=got.rewards, group_size=4, response_mask=torch.ones(4, 1),
                           **got.component_inputs(needs))


def test_gdpo_normalises_each_reward_function_where_grpo_normalises_their_sum():
    got = _collected(RewardSum([right, formatted], [1.0, 1.0]))
    assert got.components.tolist() == [[1.0, 1.0], [0.0, 1.0], [0.0, 0.0], [0.0, 0.0]]
    gdpo, metrics = ADVANTAGES["gdpo"](_inputs(got, "gdpo"), adv_eps=0.0)
    grpo, _ = ADVANTAGES["grpo"](_inputs(got, "grpo"), adv_eps=0.0)
    assert metrics["reward_components"] == 2.0
    # right: mean 1/4, Bessel std 1/2 -> [3, -1, -1, -1] / 2; formatted: mean 1/2, std 1/sqrt(3)
    total = torch.tensor([3.0, -1.0, -1.0, -1.0]) / 2 + torch.tensor([1.0, 1.0, -1.0, -1.0]) * math.sqrt(3) / 2
    expected_gdpo = total / math.sqrt(float((total**2).sum()) / 3)  # batch mean is 0; Bessel std over 4
    expected_grpo = (torch.tensor([2.0, 1.0, 0.0, 0.0]) - 0.75) / math.sqrt(11 / 12)  # the sum [2, 1, 0, 0]
    torch.testing.assert_close(gdpo[:, 0].float(), expected_gdpo)
    torch.testing.assert_close(grpo[:, 0], expected_grpo)
    # the rare success weighs more once each function is normalised alone: 1.332 against 1.306
    torch.testing.assert_close((gdpo[:, 0] - grpo[:, 0]).float(), expected_gdpo - expected_grpo)
    assert (gdpo[0, 0] - grpo[0, 0]).item() == pytest.approx(0.0264, abs=5e-4)


def test_one_reward_function_gives_no_components_and_gdpo_is_grpo_whitened():
    got = _collected(RewardSum([right]))
    assert got.components is None and got.component_inputs(needs_of(ADVANTAGES["gdpo"])) == {}
    # several groups and ragged masks: whitening is over the valid tokens of the batch
    g = torch.Generator().manual_seed(0)
    rewards = torch.randint(0, 3, (12,), generator=g).float()
    mask = (torch.arange(5)[None, :] < torch.randint(1, 6, (12,), generator=g)[:, None]).float()
    inp = AdvantageInputs(rewards=rewards, group_size=4, response_mask=mask)
    grpo, _ = ADVANTAGES["grpo"](inp)
    gdpo, _ = ADVANTAGES["gdpo"](inp)
    torch.testing.assert_close(gdpo, whiten(grpo, mask, adv_eps=1e-6))
    one = AdvantageInputs(rewards=rewards, group_size=4, response_mask=mask, reward_components=rewards[:, None])
    torch.testing.assert_close(ADVANTAGES["gdpo"](one)[0], gdpo)  # one explicit component: the same


def test_only_estimators_that_declare_them_receive_the_components():
    got = _collected(RewardSum([right, formatted], [1.0, 0.5]))
    assert got.component_weights.tolist() == [1.0, 0.5]
    assert set(got.component_inputs(needs_of(ADVANTAGES["gdpo"]))) == {"reward_components", "reward_weights"}
    assert got.component_inputs(needs_of(ADVANTAGES["grpo"])) == {}
    assert build.build_advantage(load_config(None, ["algo.advantage=gdpo"])).needs == needs_of(ADVANTAGES["gdpo"])


def test_gdpo_with_one_reward_component_warns_in_one_line_and_refuses_unscored_shaping(capsys):
    task_reward = RewardRunner(right, name="task")
    build.check_reward_components(load_config(None, ["algo.advantage=gdpo"]), task_reward)
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "algo.advantage=gdpo" in err and "reward.fn" in err
    two = RewardSum([right, formatted])
    build.check_reward_components(load_config(None, ["algo.advantage=gdpo"]), two)
    build.check_reward_components(load_config(None, ["algo.advantage=grpo"]), task_reward)
    assert capsys.readouterr().err == ""
    with pytest.raises(ConfigError, match="^algo.advantage: gdpo .*algo.overlong_buffer=0"):
        build.check_reward_components(load_config(None, ["algo.advantage=gdpo", "algo.overlong_buffer=4"]), two)


def test_gdpo_trains_on_two_reward_functions_and_logs_each(tmp_path, capsys):
    (tmp_path / "r.py").write_text(
        "def plus(prompt, completion, **example):\n"
        "    return float('+' in completion)\n"
        "def short(prompt, completion, **example):\n"
        "    return 1.0 / (1 + len(completion))\n")
    code = main(["train", f"reward.fn={tmp_path / 'r.py'}:plus, 0.5*{tmp_path / 'r.py'}:short",
                 "algo.advantage=gdpo", "trainer.steps=3", "trainer.eval_every=0", "trainer.save_every=0",
                 f"trainer.out_dir={tmp_path}", "trainer.name=gdpo", "rollout.prompts_per_step=4",
                 "rollout.group_size=4", "trainer.threads=1", "algo.dynamic_sampling=false",
                 "task.heldout_size=4", "rollout.decode_engine=eager", "trainer.kernels=eager"])
    assert code == 0, capsys.readouterr().err
    assert "warning" not in capsys.readouterr().err
    rows = [json.loads(line) for line in (tmp_path / "gdpo" / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in rows if "adv/reward_components" in m]
    assert len(steps) == 3 and all(m["adv/reward_components"] == 2.0 for m in steps)
    for m in steps:  # each function's mean is logged; the reward is their weighted sum
        assert 0 <= m["reward/plus/mean"] <= 1 and 0 < m["reward/short/mean"] <= 1
        assert m["reward/mean"] == pytest.approx(m["reward/plus/mean"] + 0.5 * m["reward/short/mean"], rel=1e-5)
