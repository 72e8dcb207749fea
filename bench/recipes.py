"""Every GRPO-family recipe on Countdown from the same warm start and budget, 3 seeds.

    python bench/recipes.py                       # default budget (see --steps)
    python bench/recipes.py --steps 300 --seeds 0 1 2 --out runs/bench_recipes

Prints held-out accuracy (final and area under the curve) and reward AUC as mean ± 95% CI
over seeds, wall time, response length and entropy; writes curves.png beside the runs.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from _sweep import report, run_sweep

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
    p.add_argument("overrides", nargs="*", help="extra key=value overrides for every run")
    args = p.parse_args()
    overrides = [f"trainer.steps={args.steps}", f"trainer.eval_every={max(args.steps // 4, 1)}",
                 "trainer.save_every=0", *args.overrides]
    run_sweep([f"recipes/{r}_countdown.yaml" for r in args.recipes], args.seeds, overrides, args.out)
    print(report(args.out, args.metrics,
                 ["eval/heldout_accuracy", "reward/mean", "response/length_mean", "actor/entropy"]))


if __name__ == "__main__":
    main()
