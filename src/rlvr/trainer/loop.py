"""The schedule around the steps: evaluation, trackers, samples, callbacks, checkpoints and resume.

`run_loop` drives a schedule (`make_steps`: the synchronous one of `trainer.sync` or the
asynchronous one of `trainer.async_loop`) as the run's `LoopPlan` says; it reads the plan and the
components, never the config (`builder.run.train` builds both).
"""

from __future__ import annotations

import math
import random
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from rlvr.kernels import native
from rlvr.models.lora import load_adapter
from rlvr.runtime.fsdp import ShardedState, full_weights, load_sharded_optimizer
from rlvr.tracking.progress import Progress
from rlvr.tracking.run_dir import RunDir, StopSignals, now
from rlvr.tracking.signal import NO_SIGNAL_STEPS, NoSignal
from rlvr.tracking.tracker import make_trackers
from rlvr.trainer.async_loop import AsyncSteps
from rlvr.trainer.checkpoint import (
    latest_checkpoint,
    load_state,
    remove_stale_temps,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from rlvr.trainer.evaluate import accuracy_by_source, greedy_accuracy, greedy_verdicts, sampled_scores
from rlvr.trainer.nonfinite import nonfinite_loss
from rlvr.trainer.parts import Components, Critic
from rlvr.trainer.sync import SyncSteps, push_weights

TRAIN_PROBE_SEED = 20_240_601  # fixed training-distribution probe for the memorisation check


def evaluate(c: Components, probe, engine=None) -> dict[str, float]:
    """Greedy held-out accuracy (overall and per source of a task with sources), train-probe
    accuracy, and sampled scores when `loop.eval_samples`, with `engine` (None = the run's: a
    schedule may evaluate through its own view of it)."""
    t0 = now()
    r = c.rollout
    engine = engine or r.engine
    agent = r.plan.agent
    heldout = r.task.heldout()
    judge = r.reward.correct  # is_correct under the verifier's deadlines, in its workers
    verdicts = greedy_verdicts(engine, r.tokenizer, r.task, heldout, agent=agent, judge=judge)
    metrics = {"eval/heldout_accuracy": sum(verdicts) / max(len(verdicts), 1),
               **{f"eval/heldout_accuracy/{s}": a for s, a in accuracy_by_source(heldout, verdicts).items()},
               "eval/train_accuracy": greedy_accuracy(engine, r.tokenizer, r.task, probe, agent=agent, judge=judge)}
    if c.loop.eval_samples:
        metrics["eval/heldout_sampled_accuracy"], metrics["eval/heldout_pass_at_k"] = sampled_scores(
            engine, r.tokenizer, r.task, heldout, agent=agent, samples=c.loop.eval_samples,
            temperature=c.loop.eval_temperature, judge=judge)
    return {**metrics, "time/eval_s": now() - t0}


def make_steps(c: Components, start: int) -> SyncSteps | AsyncSteps:
    """`SyncSteps`, or the asynchronous schedule when the builder planned one (`c.asynchronous`)."""
    return SyncSteps(c) if c.asynchronous is None else AsyncSteps(c, start)


def _checkpoint(c: Components, run: RunDir, step: int, rollout_state: dict) -> Path:
    learner = c.learner
    state = {"scheduler": learner.scheduler.state_dict(), "rng": rng_state(), "task_rng": rollout_state["task_rng"],
             "kl_coef": c.state.kl_coef}
    if learner.shards is None:  # sharded learners save the optimizer's shards beside (`ShardedState`)
        state["optimizer"] = learner.optimizer.state_dict()
    if learner.critic is not None:
        state.update(_critic_state(learner.critic))
    state["sampler"] = rollout_state["sampler"]
    if c.rollout.replay is not None:
        state["replay"] = rollout_state["replay"]
    critic_shards = learner.critic.shards if learner.critic is not None else None
    return save_checkpoint(run.checkpoints, step, learner.full_weights, c.rollout.tokenizer, state,
                           keep_last=c.loop.keep_last,
                           shards=tuple(s for s in (learner.shards, critic_shards) if s is not None),
                           writer=c.loop.writer)


def _critic_state(critic: Critic) -> dict:
    """The critic's weights, full (gathered from sharded learners: a collective), and its
    optimizer's state where one process trains it (sharded learners save its shards beside)."""
    if critic.shards is None:
        return {"critic": critic.model.state_dict(), "critic_optimizer": critic.optimizer.state_dict()}
    return {"critic": full_weights(critic.model.state_dict().items())}


def _load_critic(critic: Critic, checkpoint: Path, state: dict, trust_pickle: bool) -> None:
    """The critic's weights and optimizer state, whichever number of learners saved them."""
    optimizer = state.get("critic_optimizer")  # None: the learners saved its shards
    if critic.shards is not None:
        critic.shards.load(checkpoint, state["critic"], optimizer, trust_pickle=trust_pickle)
        return
    critic.model.load_state_dict(state["critic"])
    if optimizer is not None:
        critic.optimizer.load_state_dict(optimizer)
    else:
        load_sharded_optimizer(critic.model, critic.optimizer, checkpoint / ShardedState.CRITIC_FOLDER,
                               trust_pickle=trust_pickle)


def _load_model_and_optimizer(c: Components, checkpoint: Path, optimizer: dict | None, trust_pickle: bool) -> None:
    """The checkpoint's weights and optimizer state into `c`, whichever number of learners saved
    it: `optimizer` is the state one process saved, None where the learners saved its shards."""
    learner = c.learner
    full = learner.full_weights  # sharded learners: load their full copy first
    if c.loop.adapter_checkpoints:  # the checkpoint holds the adapter; the base is rebuilt as loaded
        load_adapter(full, checkpoint)
    else:
        full.load_state_dict(load_file(str(checkpoint / "model.safetensors")), strict=False)
        if c.loop.retie:  # HF drops tied copies on save; re-tie after loading
            full.tie_weights()
    if learner.shards is not None:  # the full copy's trained weights into the shards; the optimizer resharded
        learner.shards.load(checkpoint, {n: p.detach() for n, p in full.named_parameters() if p.requires_grad},
                            optimizer, trust_pickle=trust_pickle)
        return
    if optimizer is not None:
        learner.optimizer.load_state_dict(optimizer)
    else:  # saved by sharded learners, resumed by one process
        load_sharded_optimizer(learner.model, learner.optimizer, checkpoint / ShardedState.FOLDER,
                               trust_pickle=trust_pickle)


def resume_run(c: Components, run: RunDir, *, trust_pickle: bool = False) -> int:
    """Load the newest checkpoint into `c`; returns its step (0 if there is none). Its pickled
    files load as data only (`runtime.safe_load`) unless `trust_pickle` (`--trust-pickle`)."""
    remove_stale_temps(run.checkpoints)
    checkpoint = latest_checkpoint(run.checkpoints, verify=True, trusted=trust_pickle)
    if checkpoint is None:  # stopped before its first checkpoint: it starts over, its logs with it
        run.truncate_after(-1)
        return 0
    state = load_state(checkpoint, trust_pickle=trust_pickle)
    learner, r = c.learner, c.rollout
    configured = list(learner.scheduler.base_lrs)  # optim.* as this run's config sets them
    settings = [{k: v for k, v in group.items() if k not in ("params", "lr", "initial_lr")}
                for group in learner.scheduler.optimizer.param_groups]
    _load_model_and_optimizer(c, checkpoint, state.get("optimizer"), trust_pickle)
    learner.scheduler.load_state_dict(state["scheduler"])
    for group, setting in zip(learner.scheduler.optimizer.param_groups, settings):
        group.update(setting)  # weight decay, betas: the saved groups carry the values the run started with
    _keep_learning_rate(learner.scheduler, configured)
    if learner.critic is not None:
        _restore("critic", lambda: _load_critic(learner.critic, checkpoint, state, trust_pickle))
    if "sampler" in state:  # checkpoints written before samplers were checkpointed had uniform draws
        _restore("sampler", lambda: r.sampler.load_state_dict(state["sampler"]))
    if r.replay is not None:
        _restore("replay", lambda: r.replay.load_state_dict(state["replay"]))
    if c.plan.kl_controller is not None:  # adaptive: the coefficient is state; fixed: the config's (a changed one too)
        c.state.kl_coef = state["kl_coef"]
    set_rng_state(state["rng"])
    r.rng.setstate(state["task_rng"])
    if c.loop.push_on_resume:  # an engine with its own weights was started from the initial ones
        push_weights(learner, c.plan, r.engine)
    run.truncate_after(state["step"])
    return state["step"]


def _keep_learning_rate(scheduler, configured: list[float]) -> None:
    """The saved optimizer and schedule carry the learning rate the run started with; a resume
    allowed to change `optim.lr` continues the same schedule (its step, warmup, decay) from the
    new rate rather than silently keeping the old one."""
    if list(scheduler.base_lrs) == configured:
        return
    scheduler.base_lrs = configured
    for group, base, factor in zip(scheduler.optimizer.param_groups, configured, scheduler.lr_lambdas):
        group["initial_lr"], group["lr"] = base, base * factor(scheduler.last_epoch)


def _restore(name: str, load) -> None:
    """Load one component's saved state. A resume allowed to change the config may bring a component
    the checkpoint has no state for (a critic for `gae`, another sampler): it starts fresh, said once."""
    try:
        load()
    except (KeyError, TypeError, ValueError) as err:
        print(f"warning: the checkpoint holds no {name} state that fits this config ({type(err).__name__}: "
              f"{str(err)[:80]}); the {name} starts fresh (the config changed on resume)", file=sys.stderr)


def nothing_left_message(path: Path, step: int, steps: int) -> str:
    return (f"nothing to train: '{path}' is at step {step} of trainer.steps={steps}; "
            f"pass trainer.steps=N with N > {step} to continue it")


def runtime_facts(c: Components) -> dict:
    """What ran, where the config only says what was asked for: torch's intra-op threads, the
    row workers, whether the allocator keeps freed memory, and the causal sampler's engines
    (`loop.facts`), with the reasons the decoder fell back to eager ops if the C++ extension could
    not run."""
    rows = c.learner.rows
    threads = {"torch_threads": torch.get_num_threads(), "row_workers": rows.workers if rows else 0,
               "heap_kept": c.heap_kept}
    if not c.loop.facts:
        return threads
    return {**threads, **c.loop.facts, "decode_engine_fallbacks": native.fallbacks()}


def _notify(callbacks: list, hook: str, *args) -> bool:
    """Call `hook(*args)` on every callback that defines it; False if any asks to stop."""
    results = [getattr(cb, hook)(*args) for cb in callbacks if hasattr(cb, hook)]
    return all(result is not False for result in results)


def run_loop(c: Components, run: RunDir, start: int, echo, callbacks: list, stop: StopSignals, steps) -> dict:
    """Steps `start+1 .. loop.steps` of `steps` (a schedule of `make_steps`), with evaluation,
    trackers, samples, callbacks and checkpoints as `c.loop` says; returns the last metrics line."""
    t = c.loop
    trackers = make_trackers(list(t.trackers), run.path, resume_step=start if start else None) if t.writer else []
    for tracker in trackers:
        tracker.log_config(t.config_tree)
    task = c.rollout.task
    probe = task.sample(len(task.heldout()), random.Random(TRAIN_PROBE_SEED))
    # TRL-form rewards' `trainer_state`, for what runs before the first step (its evaluation); each step
    # then by its schedule
    c.rollout.reward.on_step_begin(start + 1, t.steps)
    if start == 0:
        for key, value in t.batch_numbers.items():
            echo(f"  {key:<42} {value}")
        if t.upper_bounds:
            echo("  (upper bounds: groups whose rewards all tie are dropped before the update)")
        first = evaluate(c, probe, steps.engine)
        for tracker in trackers:
            tracker.log_metrics(0, first)
        go_on = _notify(callbacks, "on_evaluate", 0, {k: v for k, v in first.items() if k.startswith("eval/")})
        sampled = first.get("eval/heldout_sampled_accuracy")
        echo(f"warm start: held-out accuracy {first['eval/heldout_accuracy']:.3f}, "
             f"train-probe accuracy {first['eval/train_accuracy']:.3f}"
             + (f", held-out sampled accuracy {sampled:.3f}" if sampled is not None else ""))
    else:
        go_on = True
    progress = Progress(total=t.steps, initial=start, echo=echo)
    no_signal = NoSignal(min(NO_SIGNAL_STEPS, t.steps - start),
                         ignore=frozenset() if t.reads_advantages else frozenset({"ties"}))
    line = {}
    shard = c.plan.shard
    for step in range(start + 1, t.steps + 1):
        if step == start + 1:  # one came before the first step (while building or evaluating)
            stop.adopt(shard.agree_stop(stop.received))
        if stop.received and (step == start + 1 or shard.size == 1):  # ranks stop only where they agreed
            break
        _notify(callbacks, "on_step_begin", step)
        metrics, samples = steps.step(step)  # it tells the verifier the step it scores (`trainer_state`)
        evaluated = step == t.steps or (t.eval_every and step % t.eval_every == 0)
        if evaluated:
            metrics.update(evaluate(c, probe, steps.engine))
        if not all(math.isfinite(metrics.get(k, 0.0)) for k in ("loss/policy", "actor/grad_norm")):
            raise nonfinite_loss(step, metrics, t.config_tree)
        for tracker in trackers:
            tracker.log_metrics(step, metrics)
        for record in samples if t.writer else ():
            run.append(run.samples_file, record)
        progress.update(step, metrics)
        for warning in no_signal.check(metrics):
            echo(f"warning: {warning}")
        line = {"step": step, **metrics}
        go_on = _notify(callbacks, "on_step_end", step, metrics) and go_on  # and a stop asked at step 0
        if evaluated:
            go_on = _notify(callbacks, "on_evaluate", step,
                            {k: v for k, v in metrics.items() if k.startswith("eval/")}) and go_on
        stop.adopt(shard.agree_stop(stop.received))
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
