"""Fake run directories with synthetic metrics: the tracking tools need no training to test.

Imported as `fake_runs` (pytest puts this folder on sys.path; tests/ has no __init__.py)."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

from rlvr.config import dump_yaml, load_config


def make_run(root: Path, name: str, *, seed: int, overrides: tuple[str, ...] = (), steps: int = 40,
             rate: float = 0.05, eval_every: int = 10, status: str = "finished") -> Path:
    """A run directory as `rlvr train` writes it; accuracy rises like 1 - exp(-rate·step) plus noise."""
    run = root / name
    (run / "checkpoints").mkdir(parents=True)
    config = load_config(None, [f"seed={seed}", f"trainer.steps={steps}", f"trainer.out_dir={root}", *overrides])
    (run / "config.yaml").write_text(dump_yaml(config))
    rng = random.Random(f"{name}-{seed}")
    lines, samples = [], []
    for step in range(steps + 1):
        level = 1 - math.exp(-rate * step)
        line = {"step": step}
        if step:
            line.update({"reward/mean": min(1.0, max(0.0, level + rng.gauss(0, 0.08))), "time/step_s": rng.random()})
            samples += [{"step": step, "prompt": f"Numbers: 3 4 {step % 9 + 1}\nTarget: 12\n",
                         "completion": "3*4" if i % 2 else f"<bad {step}>", "reward": float(i % 2)} for i in range(4)]
        if step % eval_every == 0 or step == steps:
            line["eval/heldout_accuracy"] = min(1.0, max(0.0, level * 0.8 + rng.gauss(0, 0.03)))
        lines.append(line)
    (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    (run / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    (run / "run.json").write_text(json.dumps({"command": ["rlvr", "train"], "seed": seed, "git_sha": "0123456789abcdef",
                                              "git_dirty": False, "started": "2026-01-01T00:00:00+00:00",
                                              "status": status, "final": lines[-1]}))
    return run


def tiny_run_args(steps: int) -> list[str]:
    """`rlvr train` arguments for a real run of a 1-layer model in seconds, a checkpoint every step."""
    return ["model.path=", "model.hidden_size=16", "model.num_layers=1", "model.num_heads=2",
            "model.intermediate_size=32", "rollout.prompts_per_step=2", "rollout.group_size=2",
            "rollout.max_new_tokens=4", "task.heldout_size=2", "trainer.threads=1", f"trainer.steps={steps}",
            "trainer.eval_every=0", "trainer.save_every=1"]
