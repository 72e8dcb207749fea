"""Samplers compared at equal generated tokens on mixed-difficulty Countdown buckets.

    python bench/curricula.py                              # every sampler, 3 seeds
    python bench/curricula.py --steps 6 --seeds 0 --samplers uniform mopps --out /tmp/curricula

Each sampler trains from the same warm start on the buckets of `--buckets` (one source each, so
DUMP has something to choose between); `dapo_refill` is uniform draws with DAPO's filter
refilling for up to 4 rounds; `dots_replay` is DOTS with a quarter of each batch replayed from
recent groups. Every run logs the completion tokens it generated per step
(`batch/generated_tokens`, dropped groups included), so runs are compared at the same token
budget, the smallest total any run generated, not at the same optimiser step: held-out accuracy
at that budget (the last evaluation at or before it), overall and per bucket, the dead-group
fraction (groups whose verdicts all agree, all solved or none, counted before any filter), tokens
per step and the summed step seconds (load-dependent on a shared machine), mean ± 95% CI over
seeds; then DUMP's source mix early and late and the posterior samplers' step-level calibration,
and `curves.png` (held-out accuracy against generated tokens).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from rlvr.tracking.stats import mean_ci

SAMPLERS = {"uniform": [], "dapo_refill": ["algo.max_sampling_rounds=4"], "mopps": ["sampler.name=mopps"],
            "vade": ["sampler.name=vade"], "dump": ["sampler.name=dump"], "gvm": ["sampler.name=gvm"],
            "coba": ["sampler.name=coba"], "dots": ["sampler.name=dots"],
            "dots_replay": ["sampler.name=dots", "rollout.replay_fraction=0.25"]}


def train(name: str, seed: int, overrides: list[str], out: Path) -> float:
    """One `rlvr train` run into out/<name>/s<seed>; its wall seconds (0 if already finished)."""
    run = out / name / f"s{seed}"
    if (run / "run.json").exists() and '"finished"' in (run / "run.json").read_text():
        return 0.0
    cmd = [sys.executable, "-m", "rlvr.cli", "train", f"seed={seed}", f"trainer.out_dir={run.parent}",
           f"trainer.name={run.name}", *SAMPLERS[name], *overrides]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{name} seed {seed} failed:\n{done.stderr[-2000:]}")
    return time.perf_counter() - t0


PREFIX = "eval/heldout_accuracy/"  # one key per bucket


def curve(run: Path) -> dict:
    """One run's series: cumulative generated tokens at each evaluation (`at`), the held-out
    accuracies there (`accuracy`, overall under "" and per bucket), and per step the dead-group
    fraction, tokens, step seconds and the rest of its metrics (`steps`)."""
    tokens, out = 0.0, {"at": [], "accuracy": [], "dead": [], "tokens": [], "step_s": [], "steps": []}
    for m in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()):
        tokens += m.get("batch/generated_tokens", 0.0)
        if m["step"] > 0:  # every generated group, a filter's dropped ones included
            out["dead"].append(m["batch/solve_tie_group_frac"])
            out["tokens"].append(m["batch/generated_tokens"])
            out["step_s"].append(m["time/step_s"])
            out["steps"].append(m)
        if "eval/heldout_accuracy" in m:
            out["at"].append(tokens)
            out["accuracy"].append({"": m["eval/heldout_accuracy"],
                                    **{k[len(PREFIX):]: v for k, v in m.items() if k.startswith(PREFIX)}})
    return out


def mean_of(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def at_budget(at: list[float], accuracy: list[dict], budget: float) -> dict:
    """Held-out accuracies of the last evaluation at or before `budget` tokens."""
    return [a for t, a in zip(at, accuracy) if t <= budget][-1]


def cell(values: list[float], digits: int = 3) -> str:
    mean, half = mean_ci(values)
    return f"{mean:.{digits}f} ± {half:.{digits}f}" if half == half else f"{mean:.{digits}f}"


def table(out: Path, names: list[str], seeds: list[int]) -> str:
    curves = {(n, s): curve(out / n / f"s{s}") for n in names for s in seeds}
    budget = min(c["at"][-1] for c in curves.values())
    buckets = [k for k in curves[names[0], seeds[0]]["accuracy"][-1] if k]
    columns = ["sampler", "held-out accuracy at the budget", *buckets, "dead-group fraction", "tokens / step",
               "step seconds / run"]
    lines = [f"token budget: {budget:.0f} generated completion tokens per run (the smallest total)", "",
             "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for n in names:
        acc = [at_budget(curves[n, s]["at"], curves[n, s]["accuracy"], budget) for s in seeds]
        cells = [cell([a[k] for a in acc]) for k in ["", *buckets]]
        dead = [mean_of(curves[n, s]["dead"]) for s in seeds]
        per_step = [mean_of(curves[n, s]["tokens"]) for s in seeds]
        wall = [sum(curves[n, s]["step_s"]) for s in seeds]
        lines.append(f"| {n} | " + " | ".join(cells) + f" | {cell(dead)} | {cell(per_step, 0)} | {cell(wall, 1)} |")
    return "\n".join(lines + [""] + sampler_lines(curves, names, seeds))


def sampler_lines(curves: dict, names: list[str], seeds: list[int]) -> list[str]:
    """What the samplers say about themselves: DUMP's source mix in the first and last fifth of the
    run, and the posterior samplers' step-level calibration, mean ± 95% CI over seeds."""
    lines = []
    for n in names:
        steps = [curves[n, s]["steps"] for s in seeds]
        fifth = max(len(steps[0]) // 5, 1)
        shares = sorted({k for m in steps[0] for k in m if k.startswith("sampler/source_share/")})
        for k in shares:
            first = [mean_of([m.get(k, 0.0) for m in run[:fifth]]) for run in steps]
            last = [mean_of([m.get(k, 0.0) for m in run[-fifth:]]) for run in steps]
            lines.append(f"- {n} {k.rsplit('/', 1)[1]}: share {cell(first)} in the first {fifth} steps, "
                         f"{cell(last)} in the last {fifth}")
        rho = [mean_of([m["sampler/calibration_spearman"] for m in run if "sampler/calibration_spearman" in m])
               for run in steps]
        if all(r == r for r in rho):
            lines.append(f"- {n} sampler/calibration_spearman (predicted vs the step's G verdicts): {cell(rho)}")
    return lines


def plot(out: Path, names: list[str], seeds: list[int]) -> Path:
    """curves.png: held-out accuracy against cumulative generated tokens, mean over seeds (each
    evaluation placed at the seeds' mean token count)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for n in names:
        runs = [curve(out / n / f"s{s}") for s in seeds]
        k = min(len(r["at"]) for r in runs)
        x = [mean_of([r["at"][i] for r in runs]) for i in range(k)]
        y = [mean_of([r["accuracy"][i][""] for r in runs]) for i in range(k)]
        ax.plot(x, y, marker="o", ms=3, lw=1.5, label=n)
    ax.set_xlabel("generated completion tokens")
    ax.set_ylabel(f"held-out accuracy (mean of {len(seeds)} seeds)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=3)
    fig.tight_layout()
    fig.savefig(out / "curves.png", dpi=110)
    return out / "curves.png"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--samplers", nargs="+", default=list(SAMPLERS), choices=list(SAMPLERS))
    p.add_argument("--buckets", default="3:1-20,3:21-60,4:1-40,4:41-99")
    p.add_argument("--out", type=Path, default=Path("runs/bench_curricula"))
    p.add_argument("overrides", nargs="*", help="extra key=value overrides for every run")
    args = p.parse_args()
    overrides = [f"task.countdown.buckets={args.buckets}", f"trainer.steps={args.steps}",
                 f"trainer.eval_every={max(args.steps // 6, 1)}", "trainer.save_every=0", *args.overrides]
    for name in args.samplers:
        for seed in args.seeds:
            print(f"{name:<12} seed {seed}  {train(name, seed, overrides, args.out):6.1f}s", flush=True)
    print(table(args.out, args.samplers, args.seeds))
    print(f"curves: {plot(args.out, args.samplers, args.seeds)}")


if __name__ == "__main__":
    main()
