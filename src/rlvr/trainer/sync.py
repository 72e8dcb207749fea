"""The synchronous RL loop: task -> rollouts -> verifier -> advantages -> update, every step.

`train()` owns the run directory and the schedule (eval, samples, checkpoints, resume);
`rl_step()` is one step of the algorithm and reads as the algorithm's diagram would.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import random
import resource
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import load_file

from rlvr.algos._registry import needs_of
from rlvr.algos.advantages import AdvantageInputs
from rlvr.algos.correction import importance_correction
from rlvr.algos.kl import adaptive_kl_coef
from rlvr.algos.shaping import overlong_penalty
from rlvr.batch import TrainBatch
from rlvr.config import Config, data_files, derived_batch_numbers, dump_yaml, to_dict
from rlvr.protocols import WeightSyncEngine
from rlvr.tracking.progress import Progress
from rlvr.tracking.run_dir import (
    RunDir,
    StopSignals,
    atomic_write_text,
    disk_errors,
    finish_manifest,
    manifest,
    now,
    recorded_exit,
)
from rlvr.tracking.tracker import check_trackers, make_trackers
from rlvr.trainer.checkpoint import (
    latest_checkpoint,
    load_state,
    remove_stale_temps,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from rlvr.trainer.collect import Produced, produce, sample_seeds
from rlvr.trainer.components import Components, build_components
from rlvr.trainer.critic import critic_step, critic_values
from rlvr.trainer.evaluate import greedy_accuracy, sampled_scores
from rlvr.trainer.expert import add_expert_rows
from rlvr.trainer.logit_stats import no_grad_outputs, old_pass, reference_pass, reward_tokens
from rlvr.trainer.proximal import fusable, gap_metrics, placed
from rlvr.trainer.runtime import Runtime
from rlvr.trainer.step import optimizer_step

TRAIN_PROBE_SEED = 20_240_601  # fixed training-distribution probe for the memorisation check
# Decoupled PPO (AReaL): a stale batch's tokens are reweighted by pi_prox / pi_behav, uncapped unless
# algo.rollout_correction names a cap (TIS) or a mask (MIS).
BEHAVIOUR_WEIGHTS = functools.partial(importance_correction, correction_cap=math.inf)


def _shaped_rewards(c: Components, rewards: torch.Tensor, batch: TrainBatch, lengths: torch.Tensor):
    """Task reward + DAPO overlong penalty - β·KL (when KL lives in the reward)."""
    a = c.config.algo
    shaped = rewards.clone()
    if a.overlong_buffer > 0:
        shaped = shaped + overlong_penalty(lengths, max_length=c.config.rollout.max_new_tokens,
                                           overlong_buffer=a.overlong_buffer, overlong_factor=a.overlong_factor)
    if c.reference is not None and c.loss.reward_kl is not None:
        shaped = shaped - c.loss.kl_coef * reward_kl(c.loss.reward_kl, batch)
    return shaped


def reward_kl(estimator, batch: TrainBatch) -> torch.Tensor:
    """(B,) sum over completion tokens of `algo.kl_estimator` between the behaviour policy (old
    log-probs, else the sampler's) and the reference: the KL that `kl_placement=reward` charges."""
    behaviour = batch.old_logp if batch.old_logp is not None else batch.rollout_logp
    keep = batch.completion_mask > 0
    per_token = estimator(behaviour.detach(), batch.ref_logp.detach(), old_logp=behaviour.detach()).detach()
    return torch.where(keep, per_token, torch.zeros_like(per_token)).sum(-1)


def _minibatches(num_groups: int, count: int, group_size: int, generator: torch.Generator, extra: int = 0):
    """Row indices of `count` minibatches of whole groups, in a seeded random order; the `extra`
    rows after the groups (expert rows) are split over the minibatches in order."""
    order = torch.randperm(num_groups, generator=generator)
    tails = torch.tensor_split(num_groups * group_size + torch.arange(extra), count)
    for groups, tail in zip(torch.tensor_split(order, count), tails):
        yield torch.cat([(groups[:, None] * group_size + torch.arange(group_size)).flatten(), tail])


def rl_step(c: Components, step: int, produced: Produced | None = None) -> tuple[dict[str, float], list[dict]]:
    """One step of the algorithm. Returns (metrics, a few sample records).

    `produced`: the step's batch from an asynchronous rollout side (None = roll out here). A batch
    sampled by an older policy version (`produced.staleness` > 0) is trained with the decoupled
    PPO objective: the clip is centred on the proximal policy (this learner's weights before the
    update, recomputed as old_logp) and each token is weighted by pi_prox / pi_behav."""
    cfg, r, t, a = c.config, c.config.rollout, c.config.trainer, c.config.algo
    produced = produced or produce(c, step)
    got = produced.got
    rollouts, rewards = got.rollouts, got.rewards
    timings, t0 = {"rollout": produced.rollout_s}, now()
    forwards_before = c.policy.forwards

    mask = rollouts.completion_mask
    if a.overlong_filter:  # DAPO: a truncated completion has no verdict on its ending; drop it from the loss
        mask = mask * (~rollouts.truncated)[:, None].float()
    batch = TrainBatch(rollouts.prompt_ids, rollouts.prompt_mask, rollouts.completion_ids, mask,
                       advantages=torch.zeros_like(mask), rollout_logp=rollouts.logprobs, trace=rollouts.trace)
    for policy in (c.policy, c.reference):  # common random numbers: one step seed, shared
        if policy is not None:
            policy.begin_step(int(sample_seeds(cfg.seed, step, 1)[0]))
    synced = isinstance(c.engine, WeightSyncEngine)  # its log-probs come from its own copy of the weights
    stale = produced.staleness > 0
    foreign = synced or r.engine == "vllm"  # vLLM's log-probs, also from an async rollout side's engine
    on_policy = t.ppo_epochs == 1 and t.minibatches == 1 and not a.rollout_correction and not foreign and not stale
    weigh = (c.loss.correction or BEHAVIOUR_WEIGHTS) if a.rollout_correction or stale else None
    kept = [] if not on_policy and fusable(c) else None  # pi_prox from the update's own forward (proximal.py)
    # The old-policy pass, with what the advantage estimator declared (the optimal token baseline's Σπ²).
    batch.old_logp, behaviour_inputs = old_pass(c.policy, batch, c.advantage.estimate, t.micro_batch_size, c.rows,
                                                needed=not on_policy and kept is None)
    if batch.old_logp is not None and weigh is not None:
        batch.loss_weights = weigh(batch.old_logp, rollouts.logprobs, mask)[0]
    if c.reference is not None:  # its log-probs, and its logsumexp when the objective declared it (ShiQ)
        reference_pass(c.reference, batch, c.loss.objective, t.micro_batch_size, c.rows)
    old_values = critic_values(c.critic, batch, t.micro_batch_size) if c.critic is not None else None
    shaped = _shaped_rewards(c, rewards, batch, rollouts.lengths)
    if "token_rewards" in needs_of(c.loss.objective):  # an objective that learns from rewards, not advantages
        batch.token_rewards = reward_tokens(shaped, mask)
    inputs = AdvantageInputs(rewards=shaped, group_size=r.group_size, response_mask=mask, values=old_values,
                             baseline_rewards=got.baseline_rewards, **_turn_inputs(got.turns), **behaviour_inputs,
                             **got.component_inputs(c.advantage.needs))
    batch.advantages, adv_metrics = c.advantage.estimate(inputs)
    returns = c.advantage.returns(inputs) if c.critic is not None else None
    expert_metrics = {}
    if c.expert is not None:  # off-policy expert rows after the groups (trainer/expert.py)
        batch, expert_metrics = add_expert_rows(c, batch, rewards, step, lambda policy, part, stats: no_grad_outputs(
            policy, part, t.micro_batch_size, c.rows, stats))
    timings["logprob"], t0 = now() - t0, now()

    updates: list[dict] = []
    generator = torch.Generator().manual_seed(produced.minibatch_seed)
    train_policy = c.critic is None or step > a.critic_warmup_steps
    for _ in range(t.ppo_epochs):
        for rows in _minibatches(len(rewards) // r.group_size, t.minibatches, r.group_size, generator,
                                 extra=len(batch) - len(rewards)):
            m = {}
            if c.critic is not None:
                m.update(critic_step(c.critic, c.critic_optimizer, batch.select(rows), old_values[rows], returns[rows],
                                     value_clip=a.value_clip, micro_batch_size=t.micro_batch_size,
                                     grad_clip=cfg.optim.grad_clip))
            if train_policy:
                spec = c.loss if kept is None else dataclasses.replace(c.loss, proximal_weights=weigh)
                m.update(optimizer_step(c.policy, c.optimizer, c.scheduler, batch.select(rows), spec,
                                        micro_batch_size=t.micro_batch_size, grad_clip=cfg.optim.grad_clip,
                                        rows=c.rows, keep=kept))
            updates.append(m)
    timings["update"] = now() - t0
    if kept is not None:
        batch.old_logp = placed(kept, rows, mask)
    old_logp = None if batch.old_logp is None else batch.old_logp[:len(mask)]  # the engine's rows (not expert)
    gap, behaviour = gap_metrics(old_logp, rollouts.logprobs, mask, weigh)
    if synced:
        timings["weight_sync"] = push_weights(c)
    forwards = c.policy.forwards - forwards_before

    metrics = _step_metrics(rewards, got.correct, rollouts, r.group_size, timings, batch)
    metrics.update(got.metrics)
    metrics.update({f"rollout/{k}": v for k, v in gap.items()})
    metrics.update(produced.selector_metrics)
    if stale:  # how far the behaviour policy is from the proximal one, and how much the weights cut
        metrics.update({"async/behaviour_kl_k3": behaviour["mismatch_k3"],
                        "async/weight_clip_frac": behaviour["correction_clip_frac"]})
    if got.turns is not None:  # the loss sees only sampled tokens: say how many it trained on
        metrics["agent/trained_tokens"] = float(mask.sum())
    if forwards:  # module forwards (dLLM estimators); the fused causal fast path bypasses the module
        metrics["perf/forwards_per_update"] = forwards / max(sum(1 for m in updates if "actor/grad_norm" in m), 1)
    metrics["perf/peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    metrics.update({f"adv/{k}": v for k, v in adv_metrics.items()})
    metrics.update(expert_metrics)
    for key in sorted({k for m in updates for k in m}):
        metrics[key] = sum(m.get(key, 0.0) for m in updates) / len(updates)
    _adapt_kl(c, metrics, len(batch))
    stride = max(1, len(got.group) // max(t.samples_per_step, 1))
    # An unscorable or failed sample is NaN here; JSON has no NaN, so samples.jsonl says null.
    samples = [{"step": step, "prompt": got.group[i].prompt, "completion": got.texts[i],
                "reward": float(rewards[i]) if math.isfinite(float(rewards[i])) else None}
               for i in range(0, len(got.group), stride)][:t.samples_per_step]
    return metrics, samples


def push_weights(c: Components) -> float:
    """Send the trainer's weights (LoRA: merged) to an engine that holds its own copy, tagged with
    the optimizer-step count; returns the seconds it took. Rollouts come only at the start of a step,
    so one push after a step's last optimizer step serves every rollout that follows it."""
    from rlvr.models.lora import merged_weights

    t0 = now()
    c.engine.push_weights(merged_weights(c.model), version=c.scheduler.last_epoch)
    return now() - t0


def _turn_inputs(turns) -> dict:
    """Agent tasks: the per-turn tensors the turn-level advantages read."""
    if turns is None:
        return {}
    return {"turn_index": turns.turn_index, "turn_rewards": turns.rewards, "turn_states": turns.states,
            "turn_valid": turns.valid}


def _adapt_kl(c: Components, metrics: dict, n: int) -> None:
    """Adaptive KL controller (PPO-style): move β toward the target per-sequence KL."""
    a = c.config.algo
    if c.reference is not None:
        metrics["kl/coef"] = c.loss.kl_coef
    if c.reference is None or a.kl_target is None or "actor/kl" not in metrics:
        return
    seq_kl = metrics["actor/kl"] * metrics["response/length_mean"]
    c.loss = dataclasses.replace(c.loss, kl_coef=adaptive_kl_coef(c.loss.kl_coef, seq_kl, n, kl_target=a.kl_target,
                                                                   kl_horizon=a.kl_horizon))


def _step_metrics(rewards, correct, rollouts, group_size, timings, batch) -> dict[str, float]:
    grouped = rewards.view(-1, group_size)
    scored = rewards[~torch.isnan(rewards)]
    lengths = rollouts.lengths
    completion_tokens = float(lengths.sum())
    train_tokens = completion_tokens + float(batch.prompt_mask.sum())
    metrics = {
        "reward/mean": float(scored.mean()) if len(scored) else 0.0,  # over scorable samples
        "reward/std": float(scored.std()) if len(scored) > 1 else 0.0,
        "reward/scorable_frac": len(scored) / max(len(rewards), 1),
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
    heldout = c.task.heldout()
    metrics = {"eval/heldout_accuracy": greedy_accuracy(c.engine, c.tokenizer, c.task, heldout),
               "eval/train_accuracy": greedy_accuracy(c.engine, c.tokenizer, c.task, probe)}
    if c.config.trainer.eval_samples:
        metrics["eval/heldout_sampled_accuracy"], metrics["eval/heldout_pass_at_k"] = sampled_scores(
            c.engine, c.tokenizer, c.task, heldout, samples=c.config.trainer.eval_samples,
            temperature=c.config.rollout.temperature)
    return {**metrics, "time/eval_s": now() - t0}


class SyncSteps:
    """The synchronous schedule: each step rolls out with the current weights, then trains.

    The loop's other schedule, `rlvr.trainer.async_loop.AsyncSteps`, offers the same three methods."""

    def __init__(self, c: Components):
        self.c = c

    def step(self, step: int) -> tuple[dict[str, float], list[dict]]:
        return rl_step(self.c, step)

    def rollout_state(self) -> dict:
        """The prompt RNG (and selector) as of the last trained step: what its checkpoint records."""
        c = self.c
        return {"task_rng": c.rng.getstate(), "selector": c.selector.state_dict() if c.selector else None}

    def close(self) -> None:
        pass


def make_steps(c: Components, start: int):
    """`SyncSteps`, or with `trainer.max_staleness` set or `trainer.backend=ray` the asynchronous schedule."""
    t = c.config.trainer
    if t.max_staleness is None and t.backend == "local":
        return SyncSteps(c)
    from rlvr.trainer.async_loop import AsyncSteps

    return AsyncSteps(c, start)


def _checkpoint(c: Components, run: RunDir, step: int, rollout_state: dict) -> Path:
    state = {"optimizer": c.optimizer.state_dict(), "scheduler": c.scheduler.state_dict(),
             "rng": rng_state(), "task_rng": rollout_state["task_rng"], "kl_coef": c.loss.kl_coef}
    if c.critic is not None:
        state["critic"] = c.critic.state_dict()
        state["critic_optimizer"] = c.critic_optimizer.state_dict()
    if c.selector is not None:
        state["selector"] = rollout_state["selector"]
    return save_checkpoint(run.checkpoints, step, c.model, c.tokenizer, state, keep_last=c.config.trainer.keep_last)


def _resume(c: Components, run: RunDir) -> int:
    """Load the newest checkpoint into `c`; returns its step (0 if there is none)."""
    remove_stale_temps(run.checkpoints)
    checkpoint = latest_checkpoint(run.checkpoints, verify=True)
    if checkpoint is None:  # stopped before its first checkpoint: it starts over, its logs with it
        run.truncate_after(-1)
        return 0
    state = load_state(checkpoint)
    if c.config.model.lora.r:  # the checkpoint holds the adapter; the base is rebuilt as loaded
        from rlvr.models.lora import load_adapter

        load_adapter(c.model, checkpoint)
    else:
        c.model.load_state_dict(load_file(str(checkpoint / "model.safetensors")), strict=False)
        if hasattr(c.model, "tie_weights"):  # HF drops tied copies on save; re-tie after loading
            c.model.tie_weights()
    c.optimizer.load_state_dict(state["optimizer"])
    c.scheduler.load_state_dict(state["scheduler"])
    if c.critic is not None:
        c.critic.load_state_dict(state["critic"])
        c.critic_optimizer.load_state_dict(state["critic_optimizer"])
    if c.selector is not None:
        c.selector.load_state_dict(state["selector"])
    c.loss = dataclasses.replace(c.loss, kl_coef=state["kl_coef"])
    set_rng_state(state["rng"])
    c.rng.setstate(state["task_rng"])
    if isinstance(c.engine, WeightSyncEngine):  # it was started from the initial weights
        push_weights(c)
    run.truncate_after(state["step"])
    return state["step"]


ENDING_KEYS = ("status", "exit_status", "ended", "duration_s", "error", "signal")


def _start_run(config: Config, run: RunDir, command: list[str], start: int, provenance: dict,
               config_changes: dict | None = None) -> None:
    run.create()
    atomic_write_text(run.path / "config.yaml", dump_yaml(config))  # never torn: --resume reads it
    if start:  # how the run ended last time moves to `earlier_ends`: this record describes the run going on
        info = run.read_json("run.json")
        ended = {key: info.pop(key) for key in ENDING_KEYS if key in info}
        info = {**info, "resumed_at": start, "earlier_ends": [*info.get("earlier_ends", []), ended]}
    else:
        info = {**manifest(command, config.seed, config=to_dict(config), data_files=data_files(config)), **provenance}
    if config_changes:  # a resume allowed to change the config: what changed, when, by which command
        info["config_changes"] = [*info.get("config_changes", []), {
            "resumed_at": start, "command": command,
            "changes": {key: {"from": old, "to": new} for key, (old, new) in config_changes.items()}}]
    run.write_json("run.json", {**info, "status": "running"})


def train(config: Config, run: RunDir, *, command: list[str], resume: bool = False, echo=print,
          runtime: Runtime | None = None, callbacks: Sequence = (), provenance: dict | None = None,
          config_changes: dict | None = None, **objects) -> dict:
    """Run (or resume) the RL loop in `run`. Returns the final metrics line.

    `runtime`: what `rlvr.trainer.runtime.configure_process` set up (None = this process as it is).
    `callbacks`: objects with any of `on_step_end`, `on_evaluate`, `on_checkpoint` (see
    `rlvr.protocols.Callback`). `provenance`: extra run.json entries describing what the config
    does not (an in-memory dataset, reward functions passed as objects). `objects`:
    `model`/`tokenizer`, `task`, `reward` passed to `build_components` instead of the ones the
    config names. `config_changes`: {key: (old, new)} a resume was allowed to make, recorded in run.json.

    A resumed run with no steps left says so in one line and returns its recorded final line."""
    torch.manual_seed(config.seed)
    check_trackers(_tracker_names(config))  # before anything is built or written
    with StopSignals(echo) as stop:  # SIGTERM/SIGINT: finish the step, checkpoint, record `interrupted`
        c = build_components(config, runtime=runtime, **objects)
        engine = c.engine  # the loop may wrap it; the one built here is closed at the end (vLLM)
        try:
            try:
                with disk_errors(run, "resuming the run" if resume else "starting the run"):
                    run.create()
                    run.reserve()  # first: a resume on a full disk stops before it changes anything
                    start = _resume(c, run) if resume else 0
                    if start >= config.trainer.steps:
                        echo(nothing_left_message(run.path, start, config.trainer.steps))
                        return run.read_json("run.json").get("final") or {"step": start}
                    _start_run(config, run, command, start, provenance or {}, config_changes)
            except BaseException:
                if not resume:  # a run that could not start leaves no empty directory behind
                    run.remove_if_empty()
                raise
            with recorded_exit(run), disk_errors(run, "training"):
                steps = make_steps(c, start)
                try:
                    line = _loop(c, run, start, echo, list(callbacks), stop, steps)
                finally:
                    steps.close()
            if stop.received:
                finish_manifest(run, "interrupted", exit_status=stop.exit_status, signal=stop.received,
                                final=line, runtime=_runtime_facts(c))
                stop.check(line.get("step"))
            finish_manifest(run, "finished", exit_status=0, final=line, runtime=_runtime_facts(c))
        finally:
            run.release()
            if hasattr(engine, "close"):
                engine.close()
    return line


def _tracker_names(config: Config) -> list[str]:
    return [n.strip() for n in config.trainer.trackers.split(",") if n.strip()]


def nothing_left_message(path: Path, step: int, steps: int) -> str:
    return (f"nothing to train: '{path}' is at step {step} of trainer.steps={steps}; "
            f"pass trainer.steps=N with N > {step} to continue it")


def _runtime_facts(c: Components) -> dict:
    """What ran, where the config only says what was asked for: torch's intra-op threads, the
    row workers, whether the allocator keeps freed memory, and the causal sampler's decode
    engine, with the reasons it fell back to eager ops if the C++ extension could not run."""
    threads = {"torch_threads": torch.get_num_threads(), "row_workers": c.rows.workers if c.rows else 0,
               "heap_kept": c.heap_kept}
    if c.config.model.kind == "diffusion":
        return threads
    from rlvr.kernels import native

    return {**threads, "rollout_engine": c.config.rollout.engine, "decode_engine": c.config.rollout.decode_engine,
            "decode_engine_fallbacks": native.fallbacks()}


def _notify(callbacks: list, hook: str, *args) -> bool:
    """Call `hook(*args)` on every callback that defines it; False if any asks to stop."""
    results = [getattr(cb, hook)(*args) for cb in callbacks if hasattr(cb, hook)]
    return all(result is not False for result in results)


def _loop(c: Components, run: RunDir, start: int, echo, callbacks: list, stop: StopSignals, steps) -> dict:
    config, t = c.config, c.config.trainer
    trackers = make_trackers(_tracker_names(config), run.path, resume_step=start if start else None)
    for tracker in trackers:
        tracker.log_config(to_dict(config))
    probe = c.task.sample(len(c.task.heldout()), random.Random(TRAIN_PROBE_SEED))
    if start == 0:
        for key, value in derived_batch_numbers(config).items():
            echo(f"  {key:<42} {value}")
        if config.algo.dynamic_sampling:
            echo("  (upper bounds: groups whose rewards all tie are dropped before the update)")
        first = evaluate(c, probe)
        for tracker in trackers:
            tracker.log_metrics(0, first)
        sampled = first.get("eval/heldout_sampled_accuracy")
        echo(f"warm start: held-out accuracy {first['eval/heldout_accuracy']:.3f}, "
             f"train-probe accuracy {first['eval/train_accuracy']:.3f}"
             + (f", held-out sampled accuracy {sampled:.3f}" if sampled is not None else ""))
    progress = Progress(total=t.steps, initial=start, echo=echo)
    line = {}
    for step in range(start + 1, t.steps + 1):
        if stop.received:  # came before the first step (while building or evaluating)
            break
        metrics, samples = steps.step(step)
        evaluated = step == t.steps or (t.eval_every and step % t.eval_every == 0)
        if evaluated:
            metrics.update(evaluate(c, probe))
        if not all(math.isfinite(metrics.get(k, 0.0)) for k in ("loss/policy", "actor/grad_norm")):
            raise FloatingPointError(f"non-finite loss at step {step}; lower optim.lr or raise algo.adv_eps")
        for tracker in trackers:
            tracker.log_metrics(step, metrics)
        for record in samples:
            run.append(run.samples_file, record)
        progress.update(step, metrics)
        line = {"step": step, **metrics}
        go_on = _notify(callbacks, "on_step_end", step, metrics)
        if evaluated:
            go_on = _notify(callbacks, "on_evaluate", step,
                            {k: v for k, v in metrics.items() if k.startswith("eval/")}) and go_on
        if step == t.steps or not go_on or stop.received or (t.save_every and step % t.save_every == 0):
            go_on = _notify(callbacks, "on_checkpoint", step,
                            _checkpoint(c, run, step, steps.rollout_state())) and go_on
        if stop.received:
            echo(f"stopped by {stop.received} after step {step}; --resume continues from its checkpoint")
            break
        if not go_on:
            echo(f"stopped by a callback after step {step}")
            break
    progress.close()
    for tracker in trackers:
        tracker.close()
    return line
