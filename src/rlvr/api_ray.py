"""`Trainer.train` with `trainer.ray_learners`: the FSDP2 learner ranks as Ray actors
(`rlvr.backends.ray_learners`), each rebuilding the trainer from its config and training as one
rank of the process group, as a torchrun process does."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

from rlvr.errors import ConfigError


def train_on_ray(trainer) -> dict:
    """Run `trainer` on `trainer.ray_learners` Ray actors; rank 0's final line (a failure: one line)."""
    from rlvr.backends.ray_learners import launch
    from rlvr.runtime.process import available_cores, resolve_device

    if trainer._passed:  # objects a file or this process defines do not travel to Ray's processes
        raise ConfigError(f"{trainer._passed[0]}: trainer.ray_learners builds each rank from the config alone; "
                          "name it in the config (model.path, reward.fn, task) or start the ranks with torchrun")
    t = trainer.config.trainer
    rebuild = functools.partial(type(trainer), config=trainer.config, run_dir=trainer.run_dir, resume=trainer.resume,
                                allow_config_change=trainer._allow_change, trust_pickle=trainer.trust_pickle,
                                command=trainer.command,
                                callbacks=trainer.callbacks)
    gpus = resolve_device(t.device, trainer.config.model.kind).type == "cuda"
    threads = t.threads or max(1, available_cores() // t.ray_learners)  # each rank's CPU bundle
    rollout_cpus = t.rollout_workers * (t.threads or 1) if t.rollout_workers > 1 else 0  # rank 0's actors
    _, final, run_dir = launch(functools.partial(_train_rank, rebuild), learners=t.ray_learners, threads=threads,
                               gpus=gpus, address=t.ray_address, actor_cpus=rollout_cpus)
    trainer.run_dir = Path(run_dir)
    trainer.echo(done_line(final, trainer.run_dir))
    return final


def _train_rank(make_trainer: Callable) -> tuple[dict, str]:
    """One Ray learner rank's run: (its final line, the run directory)."""
    made = make_trainer()
    return made.train_here(), str(made.run_dir)


def done_line(final: dict, path) -> str:
    """The line a finished run ends with."""
    accuracy = final.get("eval/heldout_accuracy", float("nan"))
    return f"done: step {final.get('step')} held-out accuracy {accuracy:.3f} -> {path}"
