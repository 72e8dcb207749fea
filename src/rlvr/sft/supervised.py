"""Supervised warm start: teach the tiny model the task's format from procedural solutions.

The loss is the mean negative log-likelihood of completion tokens (solution + EOS) given the
prompt; prompt tokens are not trained. It stops deliberately early: RL needs a policy that is
sometimes right (reward variance within groups) but far from saturated.

With `sft.data` it trains on chat rows instead (`rlvr.sft.chat`: TRL's `messages` format, the
chat template, the loss on assistant tokens only); there is no task accuracy to report then.
"""

from __future__ import annotations

import math
import os
import random
import shutil
from pathlib import Path

import torch

from rlvr.agents.batch import to_rollouts
from rlvr.agents.collect import demonstrations
from rlvr.agents.task import is_agent_task
from rlvr.batch import TrainBatch
from rlvr.builder import build
from rlvr.builder.vision import is_vision_model
from rlvr.codec import completion_batch, encode_examples, encode_prompts
from rlvr.config import Config, dump_yaml
from rlvr.errors import ConfigError, DiskFull
from rlvr.models.block_diffusion import BlockDiffusionLM, block_diffusion_loss
from rlvr.models.causal_lm import resolve_model_path
from rlvr.models.policy import CausalPolicy
from rlvr.models.vlm import image_token_id
from rlvr.models.vlm_policy import VisionPolicy
from rlvr.safe_io import free_space, kind_of, mark_made, removable_folder, remove_made_folder, temp_folder_for
from rlvr.sft.chat import chat_rollouts, check_conversations_fit, load_conversations, sample_conversations
from rlvr.sft.diffusion import diffusion_sft, masked_diffusion_loss
from rlvr.tracking.run_dir import disk_full
from rlvr.trainer.evaluate import greedy_accuracy


def sft_loss(policy: CausalPolicy, tokenizer, prompts: list[str], completions: list[str]) -> torch.Tensor:
    prompt_ids, prompt_mask = encode_prompts(tokenizer, prompts)
    completion_ids, completion_mask = completion_batch(tokenizer, completions)
    logp, _ = policy.token_logprobs(prompt_ids, prompt_mask, completion_ids)
    return -(logp * completion_mask).sum() / completion_mask.sum()


def masked_sft_loss(policy: CausalPolicy, rollouts) -> torch.Tensor:
    """Mean NLL over the tokens with completion_mask 1 (observation tokens condition, untrained)."""
    logp, _ = policy.token_logprobs(rollouts.prompt_ids, rollouts.prompt_mask, rollouts.completion_ids,
                                    completion_mask=rollouts.completion_mask)
    return -(logp * rollouts.completion_mask).sum() / rollouts.completion_mask.sum().clamp(min=1)


def vision_sft_loss(policy: VisionPolicy, tokenizer, examples, completions: list[str]) -> torch.Tensor:
    """`sft_loss` for examples with images (a vision-language model's `VisionPrompts` encodes them)."""
    prompt_ids, prompt_mask, extras = encode_examples(tokenizer, examples)
    completion_ids, completion_mask = completion_batch(tokenizer, completions)
    logp, _ = policy.batch_logprobs(TrainBatch(prompt_ids, prompt_mask, completion_ids, completion_mask,
                                               torch.zeros_like(completion_mask), vision=extras["vision"]))
    return -(logp * completion_mask).sum() / completion_mask.sum()


def _step_loss(policy, tokenizer, task, conversations, batch_size: int, rng: random.Random) -> torch.Tensor:
    """One step's loss: chat rows (assistant turns only), scripted agent episodes (the
    demonstrator's actions only), or the task's procedural solutions."""
    if isinstance(policy, VisionPolicy):
        examples = task.sample(batch_size, rng)
        return vision_sft_loss(policy, tokenizer, examples, [task.solution(e) for e in examples])
    if conversations is not None:
        return masked_sft_loss(policy, chat_rollouts(tokenizer, sample_conversations(conversations, batch_size, rng)))
    examples = task.sample(batch_size, rng)
    if is_agent_task(task):
        return masked_sft_loss(policy, to_rollouts(demonstrations(task, tokenizer, examples, rng),
                                                   tokenizer.pad_token_id))
    return sft_loss(policy, tokenizer, [e.prompt for e in examples], [task.solution(e) for e in examples])


def _causal_sft(model, tokenizer, task, config: Config, echo) -> None:
    s = config.sft
    optimizer, scheduler = build.build_optimizer(model.parameters(), lr=s.lr, warmup_steps=s.warmup_steps,
                                                 total_steps=s.steps, schedule=s.schedule)
    policy = VisionPolicy(model, image_id=image_token_id(model)) if is_vision_model(model) else CausalPolicy(model)
    rng = random.Random(config.seed)
    conversations = load_conversations(s.data) if s.data else None
    model.train()
    for step in range(1, s.steps + 1):
        loss = _step_loss(policy, tokenizer, task, conversations, s.batch_size, rng)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 100 == 0 or step == s.steps:
            echo(f"sft step {step}/{s.steps} loss={loss.item():.4f}")


def check_output_dir(out_dir: str | Path, model_path: str, *, overwrite: bool) -> None:
    """Refuse to write where it would destroy something: the base model's own folder, ever, and
    a non-empty folder unless `overwrite` (raises ConfigError before any training)."""
    out = Path(out_dir).resolve()
    base = Path(resolve_model_path(model_path)).resolve() if model_path else None
    if base is not None and (out == base or base.is_relative_to(out)):
        raise ConfigError(f"--out: '{out_dir}' holds the base model (model.path={model_path}); choose another folder")
    if kind_of(out_dir) not in (None, "a directory") or out.exists() and not out.is_dir():
        raise ConfigError(f"--out: '{out_dir}' is {kind_of(out_dir) or 'a file'}; choose a folder")
    if overwrite:  # replaces only a folder rlvr made
        removable_folder(out_dir, "--overwrite")
    elif out.is_dir() and any(out.iterdir()):
        raise ConfigError(f"--out: '{out_dir}' is not empty; choose a new folder, or pass --overwrite to replace a "
                          f"warm start rlvr made")


def sft(config: Config, out_dir: str | Path, *, overwrite: bool = False, echo=print, task=None) -> dict:
    """Train from `config.model` on task solutions; save a HF directory to `out_dir` atomically.

    `task`: a task object to warm start on instead of `config.task` (a user's `AgentTask`: its
    environment's scripted demonstrator plays the episodes, as for the shipped agent tasks).
    An existing non-empty `out_dir` is replaced only with `overwrite`; the base model's own
    folder never is (`check_output_dir`)."""
    check_output_dir(out_dir, config.model.path, overwrite=overwrite)
    if config.model.lora.r:
        raise ConfigError("model.lora.r: the supervised warm start trains the whole model; set model.lora.r=0 "
                          "(LoRA applies to rlvr train)")
    math_file = config.task.math_file if config.task.name == "math_file" else None
    if math_file is not None and not math_file.solution_key:  # said before any model is loaded
        raise ConfigError("task.math_file.solution_key: rlvr sft trains on worked solutions; set it to the row "
                          "field that holds one, e.g. task.math_file.solution_key=solution")
    torch.manual_seed(config.seed)
    model, tokenizer = build.build_model(config)
    task = build.build_task(config, tokenizer) if task is None else task
    if config.sft.data and config.model.kind == "diffusion":
        raise ConfigError("sft.data: chat SFT trains causal models; set model.kind=causal or drop sft.data")
    if config.sft.data:
        conversations = load_conversations(config.sft.data)
        chat_rollouts(tokenizer, conversations[:1])  # a missing template says so now
        check_conversations_fit(tokenizer, conversations, model)
    elif not is_agent_task(task):  # agent tasks train on scripted episodes; a task without solutions says so now
        task.solution(task.sample(1, random.Random(config.seed))[0])
    s = config.sft
    if config.model.kind == "diffusion":
        diffusion_sft(model, tokenizer, task, steps=s.steps, batch_size=s.batch_size, lr=s.lr,
                      gen_length=config.rollout.max_new_tokens, seed=config.seed, warmup_steps=s.warmup_steps,
                      schedule=s.schedule, echo=echo,
                      loss_fn=block_diffusion_loss if isinstance(model, BlockDiffusionLM) else masked_diffusion_loss)
    else:
        _causal_sft(model, tokenizer, task, config, echo)
    accuracy = math.nan  # chat rows: no task to be accurate on
    if not config.sft.data:
        engine = build.build_engine(config, model, tokenizer)
        accuracy = greedy_accuracy(engine, tokenizer, task, task.heldout(), agent=is_agent_task(task))
        echo(f"sft done: greedy held-out accuracy {accuracy:.3f}")
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_folder_for(out)  # a unique name: never a link planted beside --out
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "sft_config.yaml").write_text(dump_yaml(config))
        mark_made(tmp, "sft")
    except BaseException as err:
        full = isinstance(err, Exception) and disk_full(err, out.parent)  # before the cleanup frees space
        shutil.rmtree(tmp, ignore_errors=True)
        if full:
            raise DiskFull(f"disk full: no space left on the device of --out '{out_dir}' while writing the warm "
                           f"start (nothing was written there); free space ({free_space(out.parent)} now), then run "
                           f"rlvr sft again") from None
        raise
    try:
        remove_made_folder(out, "--overwrite")  # checked again: it may have changed during training
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    os.replace(tmp, out)
    return {"heldout_accuracy": accuracy}
