"""Exact resume of every sampler's state through the CLI: a run SIGKILLed after a step and
resumed logs what the uninterrupted run logs (the sampler's posteriors, windows, averages and
generators, and the rollout-replay buffer, are in each checkpoint; wall-clock keys are the only
ones allowed to differ)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlvr.sampling import SAMPLERS

STEPS = 5
WALL_CLOCK = ("time/", "perf/")
SOURCED = ["task.countdown.buckets=3:1-20,4:1-50"]  # dump chooses between sources


def _args(root: Path, name: str, sampler: str) -> list[str]:
    sampler, _, replay = sampler.partition("+")
    extra = (SOURCED if sampler == "dump" else []) + (["rollout.replay_fraction=0.5"] if replay else [])
    return [f"sampler.name={sampler}", *extra, "rollout.prompts_per_step=2", "rollout.group_size=4",
            f"trainer.steps={STEPS}", "trainer.save_every=1", "trainer.eval_every=0", "task.heldout_size=20",
            "trainer.threads=1", f"trainer.out_dir={root}", f"trainer.name={name}", "seed=4"]


def _train(*args: str, kill_after: Path | None = None) -> None:
    """`rlvr train ARGS` to the end, or SIGKILLed once `kill_after` (a checkpoint) exists and a
    step past it has been logged."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
    proc = subprocess.Popen([sys.executable, "-m", "rlvr.cli", "train", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if kill_after is None:
        out, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, out
        return
    metrics = kill_after.parent.parent / "metrics.jsonl"
    while not kill_after.exists() or len(_lines(metrics)) < 3:
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stdout.close()


def _lines(path: Path) -> list[dict]:
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            out.append({k: v for k, v in json.loads(line).items() if not k.startswith(WALL_CLOCK)})
        except json.JSONDecodeError:
            pass  # a line being written right now
    return out


@pytest.mark.slow
@pytest.mark.parametrize("sampler", [*sorted(set(SAMPLERS) - {"uniform"}), "dots+replay"])
def test_a_sigkilled_run_resumes_every_samplers_state_exactly(sampler, tmp_path):
    _train(*_args(tmp_path, "straight", sampler))
    run = tmp_path / "killed"
    _train(*_args(tmp_path, "killed", sampler), kill_after=run / "checkpoints" / "step_000002")
    _train("--resume", str(run))
    straight, resumed = _lines(tmp_path / "straight" / "metrics.jsonl"), _lines(run / "metrics.jsonl")
    assert [m["step"] for m in resumed] == list(range(STEPS + 1))
    assert resumed == straight
    assert any(k.startswith(("selection/", "sampler/")) for k in straight[-1])  # the sampler reported
