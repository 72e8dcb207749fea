"""What the data-parallel learner tests share: a torchrun launch of `rlvr train` (`-m rlvr`), a run's
metrics and checkpointed weights, and the comparisons of two runs to float tolerance."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

SRC = Path(__file__).resolve().parents[2] / "src"
WARM_START = SRC / "rlvr" / "assets" / "countdown-warmstart"
SMALL = ["trainer.save_every=0", "trainer.eval_every=0", "rollout.prompts_per_step=4", "rollout.group_size=4",
         "task.heldout_size=2", "rollout.max_new_tokens=12"]
EVERY_STEP = [*SMALL[1:], "trainer.save_every=1"]  # SMALL with a checkpoint each step (a key given twice is refused)


def torchrun(*args: str, ranks: int = 2) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}",
                           "-m", "rlvr", "train", *args],
                          env=env, capture_output=True, text=True, timeout=300)


def run_metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def checkpoint_weights(run: Path, step: int) -> dict[str, torch.Tensor]:
    return load_file(str(run / "checkpoints" / f"step_{step:06d}" / "model.safetensors"))


def same_lines(a: list[dict], b: list[dict], rel: float = 1e-5, abs_tol: float = 1e-6) -> None:
    """Equal step lines to float tolerance, timings and machine counters aside."""
    assert [m["step"] for m in a] == [m["step"] for m in b]
    for x, y in zip(a, b):
        keys = {k for k in x.keys() & y.keys() if not k.startswith(("time/", "perf/"))}
        assert "actor/grad_norm" in keys or "critic/value_loss" in keys or x["step"] == 0  # a step that trained
        off = {k: (x[k], y[k]) for k in keys if not math.isclose(x[k], y[k], rel_tol=rel, abs_tol=abs_tol)}
        assert not off, (x["step"], off)


def same_weights(a: dict, b: dict, start: dict, rel: float = 1e-5) -> None:
    """Every tensor equal to `rel` relative (norm of the difference over the norm), where the steps
    moved each tensor by far more than that."""
    assert a.keys() == b.keys()
    for name in a:
        assert float((a[name] - b[name]).float().norm()) <= rel * float(b[name].float().norm()), name
    moved = max(float((b[k] - start[k]).float().norm() / start[k].float().norm()) for k in start if k in b)
    assert moved > 10 * rel  # ten times the tolerance at least


def warm_start() -> dict[str, torch.Tensor]:
    """The default model's weights before training."""
    return load_file(str(WARM_START / "model.safetensors"))
