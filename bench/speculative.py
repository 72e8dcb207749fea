"""SPEC-RL's speculative rollouts against plain sampling on a finite Countdown train set.

    python bench/speculative.py                                   # 60 steps, seeds 0 1 2
    python bench/speculative.py --steps 6 --seeds 0 --out /tmp/spec

Both conditions train GRPO from the same warm start on the same `task.train_size` prompts (drawn
once, then drawn from with replacement, so a prompt comes round every few steps); `spec_rl` drafts
each row from its prompt's previous completion and verifies it under the current policy
(`rollout.speculative`, ℓ = 1, residual first token: exactly on policy); `spec_rl_l2` keeps more
of each draft (ℓ = 2, off policy) and `spec_rl_fresh` draws the first token after a rejection from
p (SPEC-RL's rule as described, biased). Per condition, mean ± 95%
CI over seeds: newly generated tokens per step (`rollout/spec_new_tokens`; plain sampling generates
every completion token), completion tokens per step, the reused fraction, step seconds (rollout
and whole step; load-dependent on a shared machine) and the final greedy held-out accuracy.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from rlvr.tracking.stats import mean_ci

CONDITIONS = {"plain": [], "spec_rl": ["rollout.speculative=true"],
              "spec_rl_l2": ["rollout.speculative=true", "rollout.spec_lenience=2"],
              "spec_rl_fresh": ["rollout.speculative=true", "rollout.spec_first_token=fresh"]}


def train(name: str, seed: int, overrides: list[str], out: Path) -> None:
    """One `rlvr train` run into out/<name>/s<seed> (skipped if already finished)."""
    run = out / name / f"s{seed}"
    if (run / "run.json").exists() and '"finished"' in (run / "run.json").read_text():
        return
    cmd = [sys.executable, "-m", "rlvr.cli", "train", f"seed={seed}", f"trainer.out_dir={run.parent}",
           f"trainer.name={run.name}", *CONDITIONS[name], *overrides]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{name} seed {seed} failed:\n{done.stderr[-2000:]}")


def summary(run: Path) -> dict[str, float]:
    """Per-step means of one run's costs, and its final held-out accuracy."""
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in lines if m["step"] > 0]

    def mean(key: str, default: str | None = None) -> float:
        return sum(m.get(key, m.get(default, 0.0)) for m in steps) / len(steps)

    return {"new tokens / step": mean("rollout/spec_new_tokens", "batch/generated_tokens"),
            "completion tokens / step": mean("batch/generated_tokens"),
            "reused fraction": mean("rollout/spec_reuse_frac"),
            "rollout s / step": mean("time/rollout_s"), "step s": mean("time/step_s"),
            "final held-out accuracy": [m for m in lines if "eval/heldout_accuracy" in m][-1]["eval/heldout_accuracy"]}


def cell(values: list[float]) -> str:
    mean, half = mean_ci(values)
    digits = 0 if abs(mean) >= 10 else 3
    return f"{mean:.{digits}f} ± {half:.{digits}f}" if half == half else f"{mean:.{digits}f}"


def table(out: Path, names: list[str], seeds: list[int]) -> str:
    rows = {n: [summary(out / n / f"s{s}") for s in seeds] for n in names}
    columns = list(rows[names[0]][0])
    lines = ["| condition | " + " | ".join(columns) + " |", "|" + "---|" * (len(columns) + 1)]
    for n in names:
        lines.append(f"| {n} | " + " | ".join(cell([r[c] for r in rows[n]]) for c in columns) + " |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--train-size", type=int, default=64)
    p.add_argument("--conditions", nargs="+", default=list(CONDITIONS), choices=list(CONDITIONS))
    p.add_argument("--out", type=Path, default=Path("runs/bench_speculative"))
    p.add_argument("overrides", nargs="*", help="extra key=value overrides for every run")
    args = p.parse_args()
    overrides = [f"task.train_size={args.train_size}", f"trainer.steps={args.steps}",
                 f"trainer.eval_every={args.steps}", "trainer.save_every=0", *args.overrides]
    for seed in args.seeds:
        for name in args.conditions:
            train(name, seed, overrides, args.out)
            print(f"{name:<8} seed {seed} done", flush=True)
    print(table(args.out, args.conditions, args.seeds))


if __name__ == "__main__":
    main()
