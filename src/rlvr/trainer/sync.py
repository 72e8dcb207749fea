"""The synchronous RL loop: task -> rollouts -> verifier -> advantages -> update, every step.

`train()` owns the run directory and the schedule (eval, samples, checkpoints, resume);
`rl_step()` is one step of the algorithm and reads like the diagram in DESIGN §2.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import random
from dataclasses import dataclass

import torch

from rlvr.algos import call_with_hparams
from rlvr.algos.advantages import AdvantageInputs
from rlvr.config import Config, derived_batch_numbers, dump_yaml
from rlvr.models.policy import CausalPolicy
from rlvr.rollout.torch_ar import generate
from rlvr.tracking.progress import Progress
from rlvr.tracking.run_dir import RunDir, manifest, now
from rlvr.trainer import build
from rlvr.trainer.checkpoint import latest_checkpoint, load_state, rng_state, save_checkpoint, set_rng_state
from rlvr.trainer.evaluate import decode_completions, encode_prompts, greedy_accuracy
from rlvr.trainer.step import TrainBatch, optimizer_step

TRAIN_PROBE_SEED = 20_240_601  # fixed training-distribution probe for the memorisation check


@dataclass
class Components:
    config: Config
    model: torch.nn.Module
    tokenizer: object
    policy: CausalPolicy
    reference: CausalPolicy | None
    task: object
    optimizer: torch.optim.Optimizer
    scheduler: object
    loss: object
    advantage: object
    rng: random.Random


def build_components(config: Config) -> Components:
    model, tokenizer = build.build_model(config)
    o = config.optim
    optimizer, scheduler = build.build_optimizer(model.parameters(), lr=o.lr, warmup_steps=o.warmup_steps,
                                                 weight_decay=o.weight_decay, betas=(o.beta1, o.beta2))
    reference = None
    if config.algo.kl_coef > 0:
        frozen = copy.deepcopy(model).requires_grad_(False)
        reference = CausalPolicy(frozen, temperature=config.rollout.temperature)
    return Components(
        config=config, model=model, tokenizer=tokenizer,
        policy=CausalPolicy(model, temperature=config.rollout.temperature), reference=reference,
        task=build.build_task(config), optimizer=optimizer, scheduler=scheduler,
        loss=build.build_loss(config), advantage=build.build_advantage(config), rng=random.Random(config.seed),
    )


def sample_seeds(seed: int, step: int, count: int) -> torch.Tensor:
    """Per-completion sampling seeds, a pure function of (run seed, step, index)."""
    return (seed * 1_000_003 + step) * 65_536 + torch.arange(count, dtype=torch.long)


@torch.no_grad()
def _logprobs(policy: CausalPolicy, batch: TrainBatch, micro_batch_size: int) -> torch.Tensor:
    parts = []
    for i in range(0, len(batch), micro_batch_size):
        mb = batch.select(slice(i, i + micro_batch_size))
        parts.append(policy.token_logprobs(mb.prompt_ids, mb.prompt_mask, mb.completion_ids)[0])
    return torch.cat(parts) * batch.completion_mask


def rl_step(c: Components, step: int) -> tuple[dict[str, float], list[dict]]:
    """One step of the algorithm. Returns (metrics, a few sample records)."""
    cfg, r, t = c.config, c.config.rollout, c.config.trainer
    timings, t0 = {}, now()
    examples = c.task.sample(r.prompts_per_step, c.rng)
    group = [ex for ex in examples for _ in range(r.group_size)]  # rows p*G .. p*G+G-1 share prompt p
    prompt_ids, prompt_mask = encode_prompts(c.tokenizer, [ex.prompt for ex in group])
    rollouts = generate(c.model, prompt_ids, prompt_mask, sample_seeds(cfg.seed, step, len(group)),
                        max_new_tokens=r.max_new_tokens, eos_id=c.tokenizer.eos_token_id,
                        pad_id=c.tokenizer.pad_token_id, temperature=r.temperature, top_p=r.top_p)
    timings["rollout"], t0 = now() - t0, now()

    texts = decode_completions(c.tokenizer, rollouts)
    rewards = torch.tensor([c.task.reward(ex.prompt, text, **dataclasses.asdict(ex)) for ex, text in zip(group, texts)],
                           dtype=torch.float32)
    correct = torch.tensor([c.task.is_correct(text, ex) for ex, text in zip(group, texts)], dtype=torch.float32)
    timings["reward"], t0 = now() - t0, now()

    batch = TrainBatch(prompt_ids, prompt_mask, rollouts.completion_ids, rollouts.completion_mask,
                       advantages=torch.zeros_like(rollouts.completion_mask), rollout_logp=rollouts.logprobs)
    on_policy = t.ppo_epochs == 1 and t.minibatches == 1
    if not on_policy:
        batch.old_logp = _logprobs(c.policy, batch, t.micro_batch_size)
    if c.reference is not None:
        batch.ref_logp = _logprobs(c.reference, batch, t.micro_batch_size)
    shaped = rewards
    if c.reference is not None and cfg.algo.kl_placement == "reward":
        behaviour = batch.old_logp if batch.old_logp is not None else rollouts.logprobs
        shaped = rewards - cfg.algo.kl_coef * ((behaviour - batch.ref_logp) * batch.completion_mask).sum(-1)
    inputs = AdvantageInputs(rewards=shaped, group_size=r.group_size, response_mask=batch.completion_mask)
    batch.advantages, adv_metrics = call_with_hparams(c.advantage, inputs, hparams=c.loss.hparams)
    timings["logprob"], t0 = now() - t0, now()

    update_metrics: list[dict] = []
    rows_per_minibatch = len(batch) // t.minibatches
    for _ in range(t.ppo_epochs):
        order = torch.randperm(r.prompts_per_step, generator=torch.Generator().manual_seed(c.rng.getrandbits(62)))
        for m in range(t.minibatches):
            prompts = order[m * (r.prompts_per_step // t.minibatches):(m + 1) * (r.prompts_per_step // t.minibatches)]
            rows = (prompts[:, None] * r.group_size + torch.arange(r.group_size)).flatten()
            assert len(rows) == rows_per_minibatch
            update_metrics.append(optimizer_step(c.policy, c.optimizer, c.scheduler, batch.select(rows), c.loss,
                                                 micro_batch_size=t.micro_batch_size, grad_clip=cfg.optim.grad_clip))
    timings["update"] = now() - t0

    metrics = _step_metrics(rewards, correct, rollouts, r.group_size, timings, batch)
    metrics.update({f"adv/{k}": v for k, v in adv_metrics.items()})
    for key in update_metrics[-1] if update_metrics else {}:
        metrics[key] = sum(m.get(key, 0.0) for m in update_metrics) / len(update_metrics)
    samples = [{"step": step, "prompt": group[i].prompt, "completion": texts[i], "reward": float(rewards[i])}
               for i in range(0, len(group), max(1, len(group) // max(t.samples_per_step, 1)))][:t.samples_per_step]
    return metrics, samples


def _step_metrics(rewards, correct, rollouts, group_size, timings, batch) -> dict[str, float]:
    grouped = rewards.view(-1, group_size)
    lengths = rollouts.lengths
    completion_tokens = float(lengths.sum())
    train_tokens = completion_tokens + float(batch.prompt_mask.sum())
    metrics = {
        "reward/mean": float(rewards.mean()),
        "reward/std": float(rewards.std()) if len(rewards) > 1 else 0.0,
        "reward/accuracy": float(correct.mean()),
        "batch/zero_variance_group_frac": float((grouped.std(-1) == 0).float().mean()),
        "response/length_mean": float(lengths.mean()),
        "response/length_max": float(lengths.max()),
        "response/truncation_rate": float(rollouts.truncated.float().mean()),
        "perf/rollout_tokens_per_s": completion_tokens / max(timings["rollout"], 1e-9),
        "perf/train_tokens_per_s": train_tokens / max(timings["update"], 1e-9),
    }
    metrics.update({f"time/{k}_s": v for k, v in timings.items()})
    metrics["time/step_s"] = sum(timings.values())
    return metrics


def evaluate(c: Components, probe) -> dict[str, float]:
    t0 = now()
    n = c.config.rollout.max_new_tokens
    held = greedy_accuracy(c.model, c.tokenizer, c.task, c.task.heldout(), max_new_tokens=n)
    train = greedy_accuracy(c.model, c.tokenizer, c.task, probe, max_new_tokens=n)
    return {"eval/heldout_accuracy": held, "eval/train_accuracy": train, "time/eval_s": now() - t0}


def _checkpoint(c: Components, run: RunDir, step: int) -> None:
    state = {"optimizer": c.optimizer.state_dict(), "scheduler": c.scheduler.state_dict(),
             "rng": rng_state(), "task_rng": c.rng.getstate()}
    save_checkpoint(run.checkpoints, step, c.model, c.tokenizer, state, keep_last=c.config.trainer.keep_last)


def _resume(c: Components, run: RunDir) -> int:
    """Load the newest checkpoint into `c`; returns its step (0 if there is none)."""
    checkpoint = latest_checkpoint(run.checkpoints)
    if checkpoint is None:
        return 0
    state = load_state(checkpoint)
    from safetensors.torch import load_file

    weights = load_file(str(checkpoint / "model.safetensors"))
    c.model.load_state_dict(weights, strict=False)
    c.model.tie_weights()
    c.optimizer.load_state_dict(state["optimizer"])
    c.scheduler.load_state_dict(state["scheduler"])
    set_rng_state(state["rng"])
    c.rng.setstate(state["task_rng"])
    run.truncate_after(state["step"])
    return state["step"]


def train(config: Config, run: RunDir, *, command: list[str], resume: bool = False, echo=print) -> dict:
    """Run (or resume) the RL loop in `run`. Returns the final metrics line."""
    if config.trainer.threads:
        torch.set_num_threads(config.trainer.threads)
    torch.manual_seed(config.seed)
    c = build_components(config)
    run.create()
    (run.path / "config.yaml").write_text(dump_yaml(config))
    start = _resume(c, run) if resume else 0
    info = manifest(command, config.seed) if start == 0 else {**run.read_json("run.json"), "resumed_at": start}
    run.write_json("run.json", {**info, "status": "running"})
    if start == 0:
        for key, value in derived_batch_numbers(config).items():
            echo(f"  {key:<42} {value}")
    probe = c.task.sample(len(c.task.heldout()), random.Random(TRAIN_PROBE_SEED))
    t = config.trainer
    if start == 0:
        first = {"step": 0, **evaluate(c, probe)}
        run.append(run.metrics_file, first)
        echo(f"warm start: held-out accuracy {first['eval/heldout_accuracy']:.3f}, "
             f"train-probe accuracy {first['eval/train_accuracy']:.3f}")
    progress = Progress(total=t.steps, initial=start, echo=echo)
    line = {}
    for step in range(start + 1, t.steps + 1):
        metrics, samples = rl_step(c, step)
        if step == t.steps or (t.eval_every and step % t.eval_every == 0):
            metrics.update(evaluate(c, probe))
        line = {"step": step, **metrics}
        bad = [k for k, v in metrics.items() if not math.isfinite(v)]
        if bad:
            raise FloatingPointError(f"non-finite metrics at step {step}: {', '.join(bad)}; lower optim.lr")
        run.append(run.metrics_file, line)
        for record in samples:
            run.append(run.samples_file, record)
        progress.update(step, metrics)
        if step == t.steps or (t.save_every and step % t.save_every == 0):
            _checkpoint(c, run, step)
    progress.close()
    run.write_json("run.json", {**run.read_json("run.json"), "status": "finished", "final": line})
    return line
