"""Exact resume: a run stopped at 5 random steps and resumed each time logs exactly what an
uninterrupted run logs, whether it was SIGKILLed, SIGTERMed (it stops after the step, exit 143)
or ran out of disk (a tmpfs filled up under it: one-line error, exit 2, the space freed, resumed).

Deterministic settings: CPU, `trainer.threads=1` (one intra-op thread, so reductions have one
order), fixed seeds; wall-clock keys (`time/*`, `perf/*`) are the only ones allowed to differ.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

STEPS = 30
WALL_CLOCK = ("time/", "perf/")


def _overrides(out_dir: Path, name: str) -> list[str]:
    # The packaged warm start, not a fresh model: a fresh model scores 0 everywhere, so every
    # advantage and gradient is 0 and optimizer/scheduler state would go untested.
    return ["model.path=rlvr:countdown-warmstart", "rollout.prompts_per_step=2", "rollout.group_size=4",
            f"trainer.steps={STEPS}", "trainer.save_every=1", "trainer.eval_every=10", "task.heldout_size=40",
            "trainer.threads=1", f"trainer.out_dir={out_dir}", f"trainer.name={name}", "seed=3"]


def _train(*args: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
    return subprocess.Popen([sys.executable, "-m", "rlvr.cli", "train", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finish(proc: subprocess.Popen) -> None:
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out


def _last_step(metrics: Path) -> int:
    if not metrics.exists():
        return -1
    last = -1
    for line in metrics.read_text().splitlines():
        try:
            last = json.loads(line)["step"]
        except (json.JSONDecodeError, KeyError):
            pass  # a line being written right now
    return last


def _strip(lines: list[dict]) -> list[dict]:
    return [{k: v for k, v in line.items() if not k.startswith(WALL_CLOCK)} for line in lines]


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _first_difference(a: list[dict], b: list[dict]) -> str:
    for x, y in zip(a, b):
        keys = sorted(k for k in set(x) | set(y) if x.get(k) != y.get(k))
        if keys:
            return f"step {x.get('step')}: keys {keys}"
    return f"lengths {len(a)} vs {len(b)}"


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> Path:
    """The uninterrupted run every stopped one is compared with."""
    root = tmp_path_factory.mktemp("straight")
    _finish(_train(*_overrides(root, "straight")))
    return root / "straight"


@pytest.fixture
def disk(tmpfs) -> Path:
    """A 64 MiB tmpfs: room for the run and its checkpoints, and a disk the test can fill."""
    return tmpfs("64m")


def _stop(proc: subprocess.Popen, how: str, run: Path, fill_disk) -> None:
    """Stop the run the way `how` says and check it ended as documented."""
    if how == "sigkill":
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
        return
    if how == "sigterm":
        proc.send_signal(signal.SIGTERM)
    else:
        fill_disk(run.parent)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == (143 if how == "sigterm" else 2), out
    assert "Traceback" not in out
    if how == "diskfull":
        assert out.splitlines()[-1].startswith("error: disk full: no space left"), out
        (run.parent / "filler").unlink()
    info = json.loads((run / "run.json").read_text())
    assert info["status"] == ("interrupted" if how == "sigterm" else "failed")
    assert not list((run / "checkpoints").glob(".tmp_*"))


@pytest.mark.slow
@pytest.mark.parametrize("how", ["sigkill", "sigterm", "diskfull"])
def test_stopped_at_five_random_steps_then_resume_matches_uninterrupted(how, straight, tmp_path, request, fill_disk):
    root = request.getfixturevalue("disk") if how == "diskfull" else tmp_path
    stops = sorted(random.Random(2024).sample(range(2, STEPS - 1), 5))
    run = root / "stopped"
    proc = _train(*_overrides(root, "stopped"))
    stopped_at = []
    for target in stops:
        while _last_step(run / "metrics.jsonl") < target:
            assert proc.poll() is None, f"run ended before the stop at step {target}: {proc.stdout.read()}"
            time.sleep(0.02)
        _stop(proc, how, run, fill_disk)
        stopped_at.append(_last_step(run / "metrics.jsonl"))
        proc = _train("--resume", str(run))
    _finish(proc)
    print(f"{how}: stopped at steps {stopped_at} (targets {stops})")
    killed_at = stopped_at

    got, want = _read(run / "metrics.jsonl"), _read(straight / "metrics.jsonl")
    assert sum(m.get("actor/grad_norm", 0.0) > 0 for m in want) >= STEPS // 2, "too few real updates to test"
    assert [m["step"] for m in got] == list(range(STEPS + 1)), f"duplicate or missing steps (killed at {killed_at})"
    difference = _first_difference(_strip(got), _strip(want))
    assert _strip(got) == _strip(want), f"killed at {killed_at}; first difference: {difference}"
    assert _read(run / "samples.jsonl") == _read(straight / "samples.jsonl")
    assert json.loads((run / "run.json").read_text())["status"] == "finished"
