"""Agents in the trainer: the loss never sees observation tokens, and `rlvr sft` / `rlvr train`
run on an agent task end to end."""

import json
import random

import torch

from rlvr.agents.batch import to_rollouts
from rlvr.agents.collect import demonstrations, rollout_batch
from rlvr.agents.envs.calculator import Calculator
from rlvr.batch import TrainBatch
from rlvr.builder.build import build_loss
from rlvr.cli import main
from rlvr.config import Config
from rlvr.engines.torch_ar import generate
from rlvr.models.policy import CausalPolicy
from rlvr.trainer.step import micro_batch_loss


class _Recording(CausalPolicy):
    """Keeps the log-prob tensor of the last call so its gradient can be read."""

    def batch_logprobs(self, batch, *, with_entropy=False):
        logp, entropy = super().batch_logprobs(batch, with_entropy=with_entropy)
        logp.retain_grad()
        self.last = logp
        return logp, entropy


def test_loss_gradient_is_zero_on_every_observation_token(tokenizer, tiny_model):
    task = Calculator(heldout_size=4)
    trajs = demonstrations(task, tokenizer, task.sample(6, random.Random(0)), random.Random(1))
    assert any(t.counts.get("tool_calls") for t in trajs)  # some rows hold observations
    r = to_rollouts(trajs, tokenizer.pad_token_id)
    adv = torch.linspace(-1, 1, len(trajs))[:, None] * r.completion_mask
    batch = TrainBatch(r.prompt_ids, r.prompt_mask, r.completion_ids, r.completion_mask, adv)  # on-policy
    policy = _Recording(tiny_model, fast=False)
    spec = build_loss(Config())
    spec = type(spec)(**{**spec.__dict__, "entropy_coef": 0.01})  # the entropy bonus must not see them either
    loss, _ = micro_batch_loss(policy, batch, spec, num_tokens=float(r.completion_mask.sum()), num_seqs=len(trajs))
    loss.backward()
    grad = policy.last.grad
    assert torch.all(grad[r.completion_mask == 0] == 0)
    assert (grad[r.completion_mask == 1] != 0).float().mean() == 1
    obs = torch.tensor([[1.0 if m == 0 else 0.0 for m in t.mask[t.prompt_len:]] + [0.0] * (r.completion_ids.shape[1]
                        - len(t.ids) + t.prompt_len) for t in trajs])
    assert obs.sum() > 0 and torch.all(grad[obs > 0] == 0)


def test_engine_rollout_logprobs_match_the_policy(tokenizer, tiny_model):
    """Behaviour log-probs of a sampled multi-turn batch equal the trainer's recomputation on
    every trained token (the importance ratio starts at exactly 1 where it should)."""
    import functools

    task = Calculator(heldout_size=4)
    engine = functools.partial(generate, tiny_model, max_new_tokens=12, eos_id=tokenizer.eos_token_id,
                               pad_id=tokenizer.pad_token_id, engine="eager")
    got = rollout_batch(engine, tokenizer, task, task.sample(6, random.Random(0)), torch.arange(6), temperature=1.0)
    r = got.rollouts
    logp, _ = CausalPolicy(tiny_model, fast=False).token_logprobs(r.prompt_ids, r.prompt_mask, r.completion_ids)
    assert torch.allclose(logp * r.completion_mask, r.logprobs * r.completion_mask, atol=1e-4)


def test_sft_then_train_on_an_agent_task(tmp_path, capsys):
    common = ["recipes/agent_calculator.yaml", "model.path=", "task.heldout_size=4", "trainer.threads=1",
              "trainer.kernels=eager", "trainer.eval_samples=0"]
    assert main(["sft", *common, "sft.steps=2", "sft.batch_size=4", "--out", str(tmp_path / "ws")]) == 0
    for advantage in ("grpo", "gigpo"):
        code = main(["train", *common[:1], f"model.path={tmp_path / 'ws'}", *common[2:], "trainer.steps=1",
                     "trainer.eval_every=0", "rollout.prompts_per_step=2", "rollout.group_size=4",
                     f"algo.advantage={advantage}", f"trainer.out_dir={tmp_path}", f"trainer.name={advantage}"])
        assert code == 0, capsys.readouterr().err
        last = json.loads((tmp_path / advantage / "metrics.jsonl").read_text().splitlines()[-1])
        assert last["agent/turns_mean"] >= 1 and 0 <= last["agent/drifted"] <= 1  # an untrained model samples specials
        assert 0 <= last["eval/heldout_accuracy"] <= 1
        assert last["agent/trained_tokens"] <= last["agent/action_tokens_mean"] * 8
