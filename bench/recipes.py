"""Every GRPO-family recipe on Countdown from the same warm start and budget, 3 seeds.

    python bench/recipes.py                       # default budget (see --steps)
    python bench/recipes.py --steps 300 --seeds 0 1 2 --out runs/bench_recipes

Prints held-out accuracy (final and area under the curve) and reward AUC as mean ± 95% CI
over seeds, wall time, response length and entropy; writes curves.png beside the runs.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from _sweep import report, run_sweep

from rlvr.tracking.stats import mean_ci

RECIPES = ["grpo", "dr_grpo", "dapo", "gspo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "ppo",
           "lite_ppo", "cispo", "maxrl"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--recipes", nargs="+", default=RECIPES)
    p.add_argument("--out", type=Path, default=Path("runs/bench_recipes"))
    p.add_argument("--metrics", nargs="+", default=["eval/heldout_accuracy", "reward/mean"],
                   help="metrics of the table (final and AUC of each)")
    p.add_argument("--paired", metavar="RECIPE", help="also print each recipe minus RECIPE, paired by seed")
    p.add_argument("overrides", nargs="*", help="extra key=value overrides for every run")
    args = p.parse_args()
    overrides = [f"trainer.steps={args.steps}", f"trainer.eval_every={max(args.steps // 4, 1)}",
                 "trainer.save_every=0", *args.overrides]
    run_sweep([f"recipes/{r}_countdown.yaml" for r in args.recipes], args.seeds, overrides, args.out)
    print(report(args.out, args.metrics,
                 ["eval/heldout_accuracy", "reward/mean", "response/length_mean", "actor/entropy"]))
    if args.paired:
        print(paired(args.out, args.paired, args.recipes, args.seeds, args.metrics))


def paired(out: Path, base: str, recipes: list[str], seeds: list[int], metrics: list[str]) -> str:
    """Mean over the logged steps of each metric, recipe minus `base` on the same seed: mean ± 95% CI."""
    def step_mean(run: Path, key: str) -> float:
        values = [m[key] for m in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if key in m]
        return sum(values) / len(values)

    lines = [f"| recipe − {base} (paired by seed) | " + " | ".join(f"{k} (mean over steps)" for k in metrics) + " |",
             "|---|" + "---|" * len(metrics)]
    for r in (r for r in recipes if r != base):
        cells = []
        for key in metrics:
            diffs = [step_mean(out / f"{r}_countdown" / f"s{s}", key)
                     - step_mean(out / f"{base}_countdown" / f"s{s}", key) for s in seeds]
            mean, half = mean_ci(diffs)
            cells.append(f"{mean:+.4f} ± {half:.4f}")
        lines.append(f"| {r} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
