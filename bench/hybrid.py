"""Hybrid on-/off-policy methods on Countdown from the shipped warm start, 3 seeds:
CHORD and RL-PLUS against SFT-then-RL on the same scarce expert pool, and NFT against GRPO;
also any one-stage recipe against GRPO at the same budget (RPG's KL surrogate: `--methods grpo rpg`).

    python bench/hybrid.py --steps 100 --sft-steps 30 --out runs/bench_hybrid --in-process trainer.threads=1
    python bench/hybrid.py --steps 150 --out runs/bench_rpg --in-process trainer.threads=1 --methods grpo rpg \
        --paired grpo

Every method sees the same budget of `--steps` updates. `sft_then_rl` is two processes: the
SFT stage (`recipes/sft_pool_countdown.yaml`, μ = 1 on the expert pool, `--sft-steps` steps) and
then GRPO from its checkpoint for the remaining steps; its expert pool is the one
`chord`/`rlplus` use (`expert.pool_size`, drawn from the run's seed). Prints the final greedy
held-out accuracy and its area under the curve as mean ± 95% CI over seeds, and writes
curves.png beside the runs; `--paired BASE` adds each method's final held-out accuracy per seed
and its difference to BASE's on the same seed (mean ± 95% CI). Any other
`recipes/<method>_countdown.yaml` runs the same way, e.g. `--methods shiq grpo` (ShiQ on the same
pool, against GRPO on the same on-policy stream).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import time
from pathlib import Path

from _sweep import REPO, report

from rlvr.tracking.stats import mean_ci

ONE_STAGE = ["grpo", "nft", "chord", "rlplus"]


def _finished(run: Path) -> bool:
    return (run / "run.json").exists() and '"finished"' in (run / "run.json").read_text()


def _train(recipe: str, run: Path, seed: int, overrides: list[str], *, in_process: bool) -> None:
    """One `rlvr train` run: its own process, or (`in_process`, one interpreter start for the
    whole sweep on a crowded machine) `rlvr.cli.main` called here."""
    args = ["train", str(REPO / recipe), f"seed={seed}", f"trainer.out_dir={run.parent}", f"trainer.name={run.name}",
            *overrides]
    t0 = time.perf_counter()
    run.parent.mkdir(parents=True, exist_ok=True)
    if in_process:
        from rlvr.cli import main as cli_main

        with open(run.parent / f"{run.name}.log", "w") as log, contextlib.redirect_stdout(log):
            code = cli_main(args)
        if code != 0:
            raise SystemExit(f"{recipe} seed {seed} failed with exit status {code}")
    else:
        done = subprocess.run([sys.executable, "-m", "rlvr.cli", *args], capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"{recipe} seed {seed} failed:\n{done.stderr[-2000:]}")
    print(f"{run.parent.name}/{run.name:<8} {time.perf_counter() - t0:6.1f}s", flush=True)


def sft_then_rl(seed: int, steps: int, sft_steps: int, common: list[str], out: Path, *, in_process: bool) -> None:
    """SFT on the expert pool, then GRPO from its last checkpoint (two runs). The SFT stage keeps
    its recipe's one tiny on-policy group (weight 0)."""
    stage1 = out / "sft_stage" / f"s{seed}"
    if not _finished(stage1):
        sft_common = [o for o in common if not o.startswith("rollout.prompts_per_step=")]
        _train("recipes/sft_pool_countdown.yaml", stage1, seed, [*sft_common, f"trainer.steps={sft_steps}"],
               in_process=in_process)
    checkpoint = sorted((stage1 / "checkpoints").glob("step_*"))[-1]
    stage2 = out / "sft_then_rl" / f"s{seed}"
    if not _finished(stage2):
        _train("recipes/grpo_countdown.yaml", stage2, seed,
               [*common, f"trainer.steps={steps - sft_steps}", f"model.path={checkpoint}"], in_process=in_process)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--sft-steps", type=int, default=30)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--methods", nargs="+", default=[*ONE_STAGE, "sft_then_rl"])
    p.add_argument("--out", type=Path, default=Path("runs/bench_hybrid"))
    p.add_argument("--in-process", action="store_true", help="every run in this interpreter (saves start-up time)")
    p.add_argument("--paired", metavar="METHOD", help="also print final held-out accuracy minus METHOD's, by seed")
    p.add_argument("overrides", nargs="*", help="extra key=value overrides for every run")
    args = p.parse_args()
    common = ["trainer.save_every=0", "rollout.prompts_per_step=4", "algo.dynamic_sampling=false",
              "optim.schedule=constant", *args.overrides]
    common.append(f"trainer.eval_every={max(args.steps // 4, 1)}")
    for seed in args.seeds:  # seed-major: a partial sweep still has every method at the first seeds
        for method in args.methods:
            if method == "sft_then_rl":
                sft_then_rl(seed, args.steps, args.sft_steps, common, args.out, in_process=args.in_process)
                continue
            run = args.out / f"{method}_countdown" / f"s{seed}"
            if not _finished(run):
                _train(f"recipes/{method}_countdown.yaml", run, seed, [*common, f"trainer.steps={args.steps}"],
                       in_process=args.in_process)
    print(report(args.out, ["eval/heldout_accuracy", "reward/mean"],
                 ["eval/heldout_accuracy", "reward/mean", "actor/entropy"]))
    if args.paired:
        print(paired_final(args.out, args.paired, args.methods, args.seeds))


def _final_heldout(out: Path, method: str, seed: int) -> float:
    run = out / (method if method == "sft_then_rl" else f"{method}_countdown") / f"s{seed}"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [m["eval/heldout_accuracy"] for m in rows if "eval/heldout_accuracy" in m][-1]


def paired_final(out: Path, base: str, methods: list[str], seeds: list[int]) -> str:
    """Final greedy held-out accuracy per seed, and each method minus `base` on the same seed."""
    lines = [f"| method | final held-out ({', '.join(f's{s}' for s in seeds)}) | mean ± 95% CI | "
             f"− {base} (paired by seed) |", "|---|---|---|---|"]
    ref = [_final_heldout(out, base, s) for s in seeds]
    for method in methods:
        finals = [_final_heldout(out, method, s) for s in seeds]
        mean, half = mean_ci(finals)
        diff = "(reference)" if method == base else "{:+.3f} ± {:.3f}".format(
            *mean_ci([a - b for a, b in zip(finals, ref)]))
        lines.append(f"| {method} | {', '.join(f'{v:.3f}' for v in finals)} | {mean:.3f} ± {half:.3f} | {diff} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
