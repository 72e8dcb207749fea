"""A training run: build its components and plans from the config, then run the loop in its directory.

This module owns the run directory's life: `opened` makes (or claims) and locks it, removes it
again when a run that could not start left nothing in it, and releases it; `train()` writes what
it holds (config.yaml, run.json, resume, signals, the exit record). The builder
(`builder.components`) is the one place that reads the config, and the loop (`trainer.loop`) runs
what it built.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch

from rlvr.builder.components import build_components
from rlvr.builder.plans import tracker_names
from rlvr.config import Config, data_files, dump_yaml, to_dict
from rlvr.runtime.process import Runtime
from rlvr.tracking.run_dir import (
    RunDir,
    StopSignals,
    atomic_write_text,
    disk_errors,
    finish_manifest,
    manifest,
    recorded_exit,
)
from rlvr.tracking.tracker import check_trackers
from rlvr.trainer.loop import make_steps, nothing_left_message, resume_run, run_loop, runtime_facts

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


def default_run_dir(config: Config, stem: str) -> Path:
    """Where a run not given a directory goes: `trainer.out_dir/trainer.name`, or `<stem>_s<seed>`."""
    return Path(config.trainer.out_dir) / (config.trainer.name or f"{stem}_s{config.seed}")


def unused(path: Path) -> Path:
    """`path`, or `path-2`, `path-3` ... when it exists: the name `opened(..., claim=True)` would take now
    (it takes the first free one when the run starts: never an earlier run's)."""
    candidate, suffix = path, 2
    while candidate.exists():
        candidate = path.with_name(f"{path.name}-{suffix}")
        suffix += 1
    return candidate


@contextlib.contextmanager
def opened(run: RunDir | Path, *, resume: bool, claim: bool = False, new: bool = False) -> Iterator[RunDir]:
    """The run directory `run`, made and locked before anything is read for a resume or written
    (`claim`: a default name, taken in one step, `-2`, `-3` ... where taken; `new`: refused if it
    already holds a run), removed again when a run that could not start (not `resume`) left
    nothing in it, and released at the end. Inside an outer `opened` of the same directory (its
    lock already held here) it only yields it: the outer one owns its life."""
    if isinstance(run, RunDir) and run.lock.held:
        yield run
        return
    what = "resuming the run" if resume else "starting the run"
    with disk_errors(run if isinstance(run, RunDir) else RunDir(run), what):
        if claim:
            run = RunDir.claim(run.path if isinstance(run, RunDir) else run)
        else:
            run = run if isinstance(run, RunDir) else RunDir(run)
            run.create(new=new)
    try:
        yield run
    except BaseException:
        if not resume:  # a run that could not start leaves no empty directory behind
            run.remove_if_empty()
        raise
    finally:
        run.release()


def train(config: Config, run: RunDir, *, command: list[str], resume: bool = False, echo=print,
          runtime: Runtime | None = None, callbacks: Sequence = (), provenance: dict | None = None,
          config_changes: dict | None = None, trust_pickle: bool = False, **objects) -> dict:
    """Run (or resume) the RL loop in `run`. Returns the final metrics line.

    `runtime`: what `rlvr.runtime.process.configure_process` set up (None = this process as it is).
    `callbacks`: objects with any of `on_step_end`, `on_evaluate`, `on_checkpoint` (see
    `rlvr.protocols.Callback`). `provenance`: extra run.json entries describing what the config
    does not (an in-memory dataset, reward functions passed as objects). `objects`:
    `model`/`tokenizer`, `task`, `reward` passed to `build_components` instead of the ones the
    config names. `config_changes`: {key: (old, new)} a resume was allowed to make, recorded in run.json.
    `trust_pickle`: a resume loads the checkpoint's pickled files with the full pickle (code), as
    `--trust-pickle` asks; else as data only (`rlvr.runtime.safe_load`).

    A resumed run with no steps left says so in one line and returns its recorded final line."""
    torch.manual_seed(config.seed)
    check_trackers(tracker_names(config))  # before anything is built or written
    shard = (runtime or Runtime()).shard  # data-parallel learners: a lost rank is one line (`failures`)
    # SIGTERM/SIGINT: finish the step, checkpoint, record `interrupted`
    with StopSignals(echo) as stop, shard.failures():
        c = build_components(config, runtime=runtime, **objects)
        engine = c.rollout.engine  # the loop may wrap it; the one built here is closed at the end (vLLM)
        try:
            with opened(run, resume=resume):
                with disk_errors(run, "resuming the run" if resume else "starting the run"):
                    run.reserve()  # first: a resume on a full disk stops before it changes anything
                    start = resume_run(c, run, trust_pickle=trust_pickle) if resume else 0
                    if start >= config.trainer.steps:
                        echo(nothing_left_message(run.path, start, config.trainer.steps))
                        return run.read_json("run.json").get("final") or {"step": start}
                    _start_run(config, run, command, start, provenance or {}, config_changes)
                with recorded_exit(run), disk_errors(run, "training"), shard.failures():
                    steps = make_steps(c, start)
                    try:
                        line = run_loop(c, run, start, echo, list(callbacks), stop, steps)
                    finally:
                        steps.close()
                if stop.received:
                    finish_manifest(run, "interrupted", exit_status=stop.exit_status, signal=stop.received,
                                    final=line, runtime=runtime_facts(c))
                    stop.check(line.get("step"))
                finish_manifest(run, "finished", exit_status=0, final=line, runtime=runtime_facts(c))
        finally:
            if hasattr(engine, "close"):
                engine.close()
    return line



