"""Dense process rewards for agents: a process reward model's score of each turn's prefix of actions becomes
that turn's reward (raw, clipped or delta) on top of the environment's, and the turn-level advantages read
it; hand-computed vectors, the prefixes a model is shown, the config's one-line errors, a run."""

from __future__ import annotations

import json

import pytest
import torch
from _reward_models import save_tiny_reward_model

from rlvr.agents.batch import turn_tensors
from rlvr.agents.collect import AgentBatch, TurnProcessReward
from rlvr.agents.rollout import Trajectory, Turn
from rlvr.algos._advantage_core import AdvantageInputs
from rlvr.algos.turn_advantages import turn_return
from rlvr.errors import ConfigError
from rlvr.models.tokenizer import char_tokenizer


class _Scores:
    """A process reward model with scripted prefix scores; it records the steps it was shown."""

    def __init__(self, scores):
        self.scores, self.seen = scores, None

    def prefix_scores(self, prompts, steps):
        self.seen = (prompts, steps)
        return self.scores


def _episode(tokenizer, actions: list[str], env_rewards: list[float]) -> Trajectory:
    """q: then each action followed by a one-character observation '.', each turn with its env reward."""
    ids = tokenizer("q:", add_special_tokens=False)["input_ids"]
    t = Trajectory(ids=list(ids), prompt_len=len(ids), turn_index=[-1] * len(ids))
    for k, (action, r) in enumerate(zip(actions, env_rewards)):
        a = tokenizer(action, add_special_tokens=False)["input_ids"]
        start = len(t.ids)
        t.ids += a + tokenizer(".", add_special_tokens=False)["input_ids"]
        t.turn_index += [k] * (len(a) + 1)
        t.turns.append(Turn(start, start + len(a), start + len(a) + 1, "done", reward=r, state_key=k))
    return t


def test_delta_process_rewards_feed_the_turn_returns_on_a_hand_vector():
    tokenizer = char_tokenizer()
    trajs = [_episode(tokenizer, ["a", "bb", "c"], [0.0, 0.0, 1.0]), _episode(tokenizer, ["d", "e"], [0.0, 1.0])]
    turns = turn_tensors(trajs)
    got = AgentBatch(trajs, None, ["", ""], torch.tensor([1.0, 1.0]), torch.ones(2), turns, {})
    model = _Scores([[0.9, 0.2, 0.7], [0.5, 0.6]])
    out = TurnProcessReward(model, how="delta", weight=0.5)(got, tokenizer, ["q:", "q:"])
    assert model.seen == (["q:", "q:"], [["a", "bb", "c"], ["d", "e"]])  # the actions, observations left out
    # delta: s_k - s_{k+1}, the last s_K: [0.7, -0.5, 0.7] and [-0.1, 0.6]; half of each on the env rewards
    assert out.turns.rewards.flatten().tolist() == pytest.approx([0.35, -0.25, 1.35, -0.05, 1.3, 0.0])
    assert out.metrics["agent/process_reward_mean"] == pytest.approx((0.7 - 0.5 + 0.7 - 0.1 + 0.6) / 5)
    mask = (out.turns.turn_index >= 0).float()
    inp = AdvantageInputs(rewards=got.rewards, group_size=2, response_mask=mask, turn_index=out.turns.turn_index,
                          turn_rewards=out.turns.rewards, turn_states=out.turns.states, turn_valid=out.turns.valid)
    adv, _ = turn_return(inp, gamma=1.0, std_normalize=False)
    # returns (gamma 1): [1.45, 1.1, 1.35] and [1.25, 1.3]; minus the group's mean at each turn index:
    # turn 0 mean 1.35 -> +0.1 / -0.1, turn 1 mean 1.2 -> -0.1 / +0.1, turn 2 row 0 alone -> 0
    per_turn = [[0.1, -0.1, 0.0], [-0.1, 0.1]]
    for b, row in enumerate(per_turn):
        for k, a in enumerate(row):
            tokens = adv[b][out.turns.turn_index[b] == k]
            assert tokens.tolist() == pytest.approx([a] * len(tokens), abs=1e-6)


def test_clipped_process_rewards_never_exceed_zero_and_a_row_must_match_its_turns():
    tokenizer = char_tokenizer()
    trajs = [_episode(tokenizer, ["a", "b"], [0.0, 1.0])]
    got = AgentBatch(trajs, None, [""], torch.ones(1), torch.ones(1), turn_tensors(trajs), {})
    out = TurnProcessReward(_Scores([[0.9, 0.2]]), how="clipped", threshold=0.5)(got, tokenizer, ["q:"])
    assert out.turns.rewards.flatten().tolist() == pytest.approx([0.0, 1.0 - 0.3])  # min(s - 0.5, 0): [0, -0.3]
    with pytest.raises(ValueError, match="row 0: 1 process rewards for 2 turns"):
        TurnProcessReward(_Scores([[0.9]]))(got, tokenizer, ["q:"])


def test_a_prm_scores_the_prefixes_of_given_steps():
    from _reward_models import tiny_reward_model

    from rlvr.rewards.reward_model import ProcessRewardModel

    model, tokenizer = tiny_reward_model()
    prm = ProcessRewardModel(model, tokenizer, separator="\n", batch_size=2)
    assert prm.prefix_scores(["q:"], [["1+2", "3*4"]]) == [pytest.approx(
        prm.step_scores(["q:"], ["1+2\n3*4"])[0], abs=1e-6)]
    assert prm.prefix_scores(["q:", "p:"], [[], ["x"]])[0] == []


@pytest.fixture
def saved_rm(tmp_path):
    return save_tiny_reward_model(tmp_path / "prm")


@pytest.mark.parametrize("overrides, message", [
    (["reward.model_turns=delta"], "reward.model_turns=delta: applies to agent tasks"),
    (["task.name=agent_guess", "reward.model_turns=sum"], "reward.model_turns: unknown 'sum'; choose one of raw"),
])
def test_bad_model_turns_are_one_line_errors(saved_rm, overrides, message):
    from rlvr.builder.build import build_reward, build_task, build_turn_reward
    from rlvr.config import load_config

    config = load_config(None, [f"reward.fn={saved_rm}", *overrides])
    task = build_task(config, char_tokenizer())
    with pytest.raises(ConfigError, match=message):
        build_turn_reward(config, task, build_reward(config, task))


def test_an_agent_run_trains_on_dense_process_rewards(tmp_path, saved_rm, capsys):
    from rlvr.cli import main

    code = main(["train", "recipes/agent_guess.yaml", "model.path=", "task.heldout_size=4", "trainer.threads=1",
                 "trainer.kernels=eager", "trainer.eval_samples=0", "trainer.steps=1", "trainer.eval_every=0",
                 "rollout.prompts_per_step=2", "rollout.group_size=2", "algo.advantage=turn_return",
                 f"reward.fn={saved_rm}", "reward.model_turns=delta", f"trainer.out_dir={tmp_path}",
                 "trainer.name=run", "algo.dynamic_sampling=false"])
    assert code == 0, capsys.readouterr().err
    last = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["agent/process_reward_mean"] != 0.0 and last["agent/turns_mean"] >= 1
