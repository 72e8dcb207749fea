"""Every dLLM recipe from the same warm start and budget, 3 seeds, plus the sampler trade-off.

    python bench/dllm.py                              # Countdown, default budget
    python bench/dllm.py --task sudoku --steps 100

Table 1: held-out accuracy (greedy; avg@k and pass@k of k = 8 samples at the rollout temperature)
and reward, final and AUC, mean ± 95% CI over seeds; wall time per run, seconds per step,
forwards per update and peak memory (from the runs' metrics); then greedy accuracy at equal training
time: gain per training minute, and the accuracy each recipe had reached within the fastest recipe's
training seconds (summed `time/step_s`, evaluation excluded; load-dependent like every timing here).
Table 2: greedy held-out accuracy of the warm start against tokens committed per forward
(steps N = L, L/2, L/4; block lengths L and L/2).

The Countdown diffu_grpo recipe decodes one completion per group greedily
(`rollout.greedy_in_group=true`, docs/results/dllm.md §4c); the other recipes do not. For a comparison
of the estimators alone put every recipe under the same scheme, e.g.
`python bench/dllm.py rollout.greedy_in_group=false` (or `=true`).
"""

from __future__ import annotations

import argparse
import resource
import time
from pathlib import Path

import torch
from _sweep import REPO, equal_time_table, recipe_groups, report, run_sweep

from rlvr.builder import build
from rlvr.config import load_config
from rlvr.trainer.evaluate import greedy_accuracy

# the methods with a recipe on both tasks (others, e.g. block or topd on Countdown, run when named)
RECIPES = ["diffu_grpo", "coupled_grpo", "espo", "bgpo", "spg", "wd1", "trace", "justgrpo", "igpo", "pbpo",
           "lightning", "cj_grpo", "gdsd", "dmpo", "dipo", "erils"]


def sampler_tradeoff(recipe: Path, overrides: list[str] = ()) -> str:
    """Greedy held-out accuracy of the recipe's warm start for several (steps, block) settings."""
    base = load_config(recipe, list(overrides))
    if base.trainer.threads:
        torch.set_num_threads(base.trainer.threads)
    length = base.rollout.max_new_tokens
    model, tokenizer = build.build_model(base)
    task = build.build_task(base, tokenizer)
    rows = ["| steps N | block B | tokens/forward | held-out acc | s/eval |", "|---|---|---|---|---|"]
    for steps in (length, length // 2, length // 4):
        for block in (length, length // 2):
            if steps % (length // block):
                continue
            cfg = load_config(recipe, [*overrides, f"rollout.diffusion_steps={steps}", f"rollout.block_length={block}"])
            engine = build.build_engine(cfg, model, tokenizer)
            t0 = time.perf_counter()
            acc = greedy_accuracy(engine, tokenizer, task, task.heldout(), agent=False)
            rows.append(f"| {steps} | {block} | {length / steps:.0f} | {acc:.3f} | {time.perf_counter() - t0:.1f} |")
    return "\n".join(rows) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", choices=["countdown", "sudoku"], default="countdown")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--recipes", nargs="+", default=RECIPES)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--eval-samples", type=int, default=8,
                   help="k samples per held-out problem at each evaluation: avg@k and pass@k beside greedy "
                        "(0 = greedy only)")
    p.add_argument("--eval-every", type=int, default=None,
                   help="steps between held-out evaluations (default: a third of --steps)")
    p.add_argument("overrides", nargs="*", help="extra key=value overrides for every run")
    args = p.parse_args()
    out = args.out or Path(f"runs/bench_dllm_{args.task}")
    recipes = [f"recipes/dllm_{r}_{args.task}.yaml" for r in args.recipes]
    for name, recipe in zip(args.recipes, recipes):
        if not (REPO / recipe).exists():  # e.g. an override typed after --recipes, which takes the rest
            shipped = (REPO / "recipes").glob(f"dllm_*_{args.task}.yaml")
            valid = sorted(r.stem[len("dllm_"):-len(args.task) - 1] for r in shipped)
            p.error(f"--recipes: no recipe {recipe} for {name!r}; valid: {', '.join(valid)} "
                    "(put key=value overrides before --recipes)")
    overrides = [f"trainer.steps={args.steps}", f"trainer.eval_every={args.eval_every or max(args.steps // 3, 1)}",
                 "trainer.save_every=0", f"trainer.eval_samples={args.eval_samples}", *args.overrides]
    run_sweep(recipes, args.seeds, overrides, out)
    sampled = ["eval/heldout_sampled_accuracy", "eval/heldout_pass_at_k"] if args.eval_samples else []
    print(report(out, ["eval/heldout_accuracy", *sampled, "reward/mean", "time/step_s", "perf/forwards_per_update",
                       "perf/peak_rss_mb"],
                 ["eval/heldout_accuracy", "reward/mean"]))
    print(equal_time_table(recipe_groups(out)))
    print(sampler_tradeoff(REPO / recipes[0], args.overrides))
    print(f"bench process peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


if __name__ == "__main__":
    main()
