"""`rlvr dpo`: DPO (or IPO) on preference pairs, the policy and a frozen reference both through
the `PolicyModel` seam (`batch_logprobs` of a `TrainBatch`). On a masked-diffusion model this is
VRPO (LLaDA 1.5) with no branch here: the policy's likelihood estimator gives ELBO estimates
(`estimator.name=elbo_mc`, `estimator.n` draws, antithetic when set), and policy and reference
are seeded alike each step (`begin_step`), so both estimates share their masks (common random
numbers: at policy = reference every margin is exactly 0).

Each step: B pairs -> one batch of 2B rows [chosen; rejected] -> sequence log-likelihoods
(sum over completion tokens, EOS included) of policy and reference -> `dpo_loss` -> AdamW.
Evaluations log the held-out pairs' accuracy (policy's implicit reward ranks chosen first) and,
for pairs made from the task, the greedy held-out accuracy on the task.
"""

from __future__ import annotations

import copy
import random

import torch

from rlvr.agents.task import is_agent_task
from rlvr.algos.preference import DPO_LOSSES, dpo_loss
from rlvr.batch import TrainBatch
from rlvr.builder import build
from rlvr.codec import completion_batch, encode_prompts
from rlvr.config import Config
from rlvr.config.commands_schema import preference_lr
from rlvr.errors import ConfigError
from rlvr.preference.pairs import Pair
from rlvr.preference.run import PreferenceRun, check_pairs_fit, split_pairs
from rlvr.trainer.evaluate import greedy_accuracy

__all__ = ["dpo", "pair_batch", "sequence_logprobs"]


def pair_batch(tokenizer, pairs: list[Pair]) -> TrainBatch:
    """2B rows: the chosen completions, then the rejected ones, each after its prompt."""
    prompts = [p.prompt for p in pairs] * 2
    completions = [p.chosen for p in pairs] + [p.rejected for p in pairs]
    prompt_ids, prompt_mask = encode_prompts(tokenizer, prompts)
    completion_ids, completion_mask = completion_batch(tokenizer, completions)
    return TrainBatch(prompt_ids, prompt_mask, completion_ids, completion_mask, torch.zeros_like(completion_mask))


def sequence_logprobs(policy, batch: TrainBatch) -> torch.Tensor:
    """(2B,) Σ_t log π(y_t | ...) over each row's completion tokens, through the PolicyModel seam."""
    logp, _ = policy.batch_logprobs(batch)
    return (logp * batch.completion_mask).sum(-1)


def pair_loss(policy, reference, batch: TrainBatch, *, beta: float, loss_type: str):
    """`dpo_loss` of one pair batch: (loss, metrics)."""
    policy_logp = sequence_logprobs(policy, batch)
    with torch.no_grad():
        ref_logp = sequence_logprobs(reference, batch)
    tokens = batch.completion_mask.sum(-1)
    n = len(batch) // 2
    return dpo_loss(policy_logp[:n], ref_logp[:n], policy_logp[n:], ref_logp[n:], beta=beta, loss_type=loss_type,
                    chosen_tokens=tokens[:n], rejected_tokens=tokens[n:])


def _evaluate(config, policy, reference, tokenizer, heldout, task, engine) -> dict:
    p = config.preference
    out = {}
    if heldout:
        with torch.no_grad():
            _, m = pair_loss(policy, reference, pair_batch(tokenizer, heldout), beta=p.beta, loss_type=p.loss)
        out["eval/heldout_pair_accuracy"] = m["accuracy"]
    if not p.data:
        out["eval/heldout_accuracy"] = greedy_accuracy(engine, tokenizer, task, task.heldout(),
                                                       agent=is_agent_task(task))
    return out


def dpo(config: Config, *, command: list[str], echo=print) -> dict:
    """Train `config.model` with DPO on `config.preference`'s pairs in a new run directory;
    returns the last metrics line."""
    p = config.preference
    if p.loss not in DPO_LOSSES:
        raise ConfigError(f"preference.loss: unknown {p.loss!r}; choose one of {', '.join(DPO_LOSSES)}")
    if config.model.lora.r:
        raise ConfigError("model.lora.r: rlvr dpo trains the whole model; set model.lora.r=0")
    torch.manual_seed(config.seed)
    model, tokenizer = build.build_model(config)
    task = build.build_task(config, tokenizer)
    train_pairs, heldout = split_pairs(config, task)
    check_pairs_fit(train_pairs + heldout, tokenizer, model)
    reference_model = copy.deepcopy(model).eval().requires_grad_(False)
    policy, reference = build.build_policy(config, model), build.build_policy(config, reference_model)
    engine = build.build_engine(config, model, tokenizer)
    optimizer, scheduler = build.build_optimizer(model.parameters(), lr=preference_lr(p, "dpo"), warmup_steps=0,
                                                 total_steps=p.steps)
    run, rng = PreferenceRun(config, "dpo", command, echo=echo), random.Random(config.seed)

    def step_loss(step: int):
        policy.begin_step(config.seed * 100_003 + step)  # estimators: one mask draw for policy and reference
        reference.begin_step(config.seed * 100_003 + step)
        batch = pair_batch(tokenizer, rng.sample(train_pairs, min(p.batch_size, len(train_pairs))))
        return pair_loss(policy, reference, batch, beta=p.beta, loss_type=p.loss)

    return run.train(model, tokenizer, optimizer, scheduler, step_loss,
                     lambda: _evaluate(config, policy, reference, tokenizer, heldout, task, engine), kind="dpo")
