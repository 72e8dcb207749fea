"""Device honesty without a GPU: the update step creates no tensor on the host.

A tensor made by `torch.zeros(shape)` (no `device=`) inside the step is a CPU tensor; on a CUDA
run it either fails ("expected all tensors on the same device") or silently copies every step.
The Hugging Face forward cannot run on the `meta` device (its mask code reads values), so the
check is device-agnostic instead: a `TorchFunctionMode` records every factory call made directly
by rlvr code while the step runs and the test fails on any without a `device=` argument. The C++
CPU kernels are exempt: they run only for float32 CPU models (`kernels.weights.supports`).

Also here: the step under bf16 autocast on the CPU.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from _archs import bpe_tokenizer, model_config
from torch.overrides import TorchFunctionMode

import rlvr
from rlvr.algos.advantages import AdvantageInputs
from rlvr.batch import TrainBatch
from rlvr.builder import build
from rlvr.config import load_config
from rlvr.models.diffusion_policy import DiffusionPolicy
from rlvr.models.likelihood import ESTIMATORS
from rlvr.models.policy import CausalPolicy
from rlvr.models.value import ValueModel
from rlvr.trainer.critic import critic_step, critic_values
from rlvr.trainer.step import optimizer_step

SRC = Path(rlvr.__file__).resolve().parent
EXEMPT = (SRC / "kernels",)
FACTORIES = {torch.zeros, torch.ones, torch.full, torch.empty, torch.arange, torch.tensor, torch.rand, torch.randn,
             torch.randint, torch.randperm, torch.linspace, torch.eye, torch.as_tensor}


class HostFactories(TorchFunctionMode):
    """Records `file:line name` of each factory call without `device=` made directly by rlvr code."""

    def __init__(self):
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        # A 0-dim tensor is exempt: torch lets a CPU scalar tensor meet tensors on any device.
        if func in FACTORIES and kwargs.get("device") is None and out.dim() > 0:
            caller = Path(sys._getframe(1).f_code.co_filename).resolve()
            if caller.is_relative_to(SRC) and not any(caller.is_relative_to(e) for e in EXEMPT):
                self.calls.append(f"{caller.relative_to(SRC)}:{sys._getframe(1).f_lineno} {func.__name__}")
        return out


def _batch(vocab: int, rows: int = 4, seed: int = 0) -> TrainBatch:
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(5, vocab, (rows, 6), generator=g)
    mask = torch.ones_like(prompt)
    mask[0, :2] = 0
    completion = torch.randint(5, vocab, (rows, 5), generator=g)
    cmask = torch.ones(rows, 5)
    cmask[1, 3:] = 0
    logp = -torch.rand(rows, 5, generator=g)
    return TrainBatch(prompt, mask, completion, cmask, advantages=torch.randn(rows, 1, generator=g) * cmask,
                      old_logp=logp, ref_logp=logp - 0.1, rollout_logp=logp + 0.05, loss_weights=torch.ones(rows, 5))


def _step(config_overrides: list[str], policy, batch: TrainBatch) -> dict:
    config = load_config(None, ["model.path=", "algo.kl_coef=0.1", "algo.entropy_coef=0.01", *config_overrides])
    params = [p for p in policy.parameters() if p.requires_grad]
    optimizer, scheduler = build.build_optimizer(params, lr=1e-3, warmup_steps=1)
    return optimizer_step(policy, optimizer, scheduler, batch, build.build_loss(config), micro_batch_size=2,
                          grad_clip=1.0)


@pytest.mark.parametrize("objective", ["ppo_clip", "gspo", "cispo"])
def test_the_causal_update_step_makes_no_host_tensor(objective):
    tokenizer = bpe_tokenizer()
    model = __import__("transformers").AutoModelForCausalLM.from_config(model_config("qwen2", len(tokenizer)))
    batch = _batch(len(tokenizer))
    with HostFactories() as mode:
        metrics = _step([f"algo.objective={objective}"], CausalPolicy(model, fast=False), batch)
    assert metrics and mode.calls == []


def test_advantage_estimators_make_no_host_tensor():
    from rlvr.config import REGISTRY

    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0, 0.0])  # pass/fail: every estimator takes them
    mask = torch.ones(8, 3)
    turns = {"turn_index": torch.zeros(8, 3, dtype=torch.long), "turn_rewards": rewards[:, None],  # one-turn episodes
             "turn_states": torch.zeros(8, 1, dtype=torch.long), "turn_valid": torch.ones(8, 1, dtype=torch.bool)}
    for name in sorted(REGISTRY["algo.advantage"].entries()):
        if name == "gae":
            continue  # gae needs values (the critic test covers it)
        kind = ["model.kind=diffusion"] if name == "lightning" else []  # it reads the diffusion sampler's trace
        config = load_config(None, ["model.path=", f"algo.advantage={name}", "rollout.group_size=4", *kind])
        behaviour = {"old_logp": torch.full((8, 3), -0.5), "sum_pi_squared": torch.full((8, 3), 0.4),
                     "trace": torch.tensor([[0, 1, 2], [0, 0, 1]] * 4)}
        with HostFactories() as mode:
            build.build_advantage(config).estimate(AdvantageInputs(rewards=rewards, group_size=4, response_mask=mask,
                                                                   baseline_rewards=torch.tensor([0.0, 1.0]), **turns,
                                                                   **behaviour))
        assert mode.calls == [], name


def test_the_critic_makes_no_host_tensor_and_follows_the_body_dtype():
    tokenizer = bpe_tokenizer()
    model = __import__("transformers").AutoModelForCausalLM.from_config(model_config("llama", len(tokenizer)))
    batch = _batch(len(tokenizer))
    with HostFactories() as mode:
        critic = ValueModel(model.to(torch.bfloat16))
        optimizer = torch.optim.AdamW(critic.parameters(), lr=1e-3)
        old = critic_values(critic, batch, 2)
        metrics = critic_step(critic, optimizer, batch, old, torch.randn(4, 5), value_clip=0.2, micro_batch_size=2,
                              grad_clip=1.0)
    assert mode.calls == [] and metrics["critic/value_loss"] > 0 and old.dtype == torch.float32
    assert critic.head.weight.device == next(critic.body.parameters()).device


@pytest.mark.parametrize("estimator", sorted(ESTIMATORS))
def test_diffusion_likelihoods_make_no_host_tensor(estimator):
    from rlvr.models.diffusion_lm import DiffusionConfig, DiffusionLM

    model = DiffusionLM(DiffusionConfig(vocab_size=5, mask_token_id=4, eos_token_id=3, pad_token_id=0, hidden_size=16,
                                        num_layers=1, num_heads=2, intermediate_size=32))
    prompt = torch.tensor([[1, 2], [2, 1]])
    completion = torch.tensor([[1, 2, 3], [2, 3, 0]])
    policy = DiffusionPolicy(model, estimator)
    policy.begin_step(7)
    with HostFactories() as mode:
        logp, _ = policy.token_logprobs(prompt, torch.ones_like(prompt), completion, with_entropy=True,
                                        advantages=torch.tensor([1.0, -1.0]),
                                        trace=torch.tensor([[0, 2, 1], [1, 0, 2]]))
        logp.sum().backward()
    assert mode.calls == [], estimator


def test_the_step_runs_under_bfloat16_autocast_on_cpu():
    tokenizer = bpe_tokenizer()
    model = __import__("transformers").AutoModelForCausalLM.from_config(model_config("qwen2", len(tokenizer)))
    batch = _batch(len(tokenizer))
    policy = CausalPolicy(model, fast=False)
    with torch.no_grad():
        plain, _ = policy.token_logprobs(batch.prompt_ids, batch.prompt_mask, batch.completion_ids)
    calls = []
    handle = model.model.layers[0].mlp.down_proj.register_forward_hook(lambda m, i, o: calls.append(o.dtype))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with torch.no_grad():
            mixed, _ = policy.token_logprobs(batch.prompt_ids, batch.prompt_mask, batch.completion_ids)
        metrics = _step([], policy, batch)
    handle.remove()
    assert calls and set(calls) == {torch.bfloat16}  # the matmuls ran in bf16
    assert mixed.dtype == torch.float32 and next(model.parameters()).dtype == torch.float32
    assert torch.isfinite(torch.tensor(metrics["loss/policy"]))
    torch.testing.assert_close(mixed, plain, rtol=0, atol=0.1)  # bf16 rounding, not a different model
    assert not torch.equal(mixed, plain)
