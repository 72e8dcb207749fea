"""Paired greedy held-out comparison: each run's final checkpoint against the model it started from.

    python bench/paired_heldout.py runs/dllm_diffu_grpo_countdown_s0 runs/dllm_diffu_grpo_countdown_s1 ...
    python bench/paired_heldout.py --heldout-size 360 RUN...   # the whole held-out bucket of the recipes' Countdown

Both are scored on the same held-out problems with the run's own sampler, so a problem counts as
*fixed* (wrong at the start, right at the end) or *broken* (the reverse). Prints per run the final
accuracy and the two counts, then the pooled counts and a one-sided sign test of "no change"
(binomial with p = 1/2 over the discordant problems). Flips within a run are not independent, so
the p-value is optimistic; it is a check on a mean gain, not a proof. The runs must share their
starting model and task (the first run's config is used to score the start).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch

from rlvr.builder import build
from rlvr.config import load_config
from rlvr.trainer.evaluate import greedy_verdicts


def verdicts(config) -> list[bool]:
    model, tokenizer = build.build_model(config)
    task = build.build_task(config, tokenizer)
    return greedy_verdicts(build.build_engine(config, model, tokenizer), tokenizer, task, task.heldout(), agent=False)


def sign_test(fixed: int, broken: int) -> float:
    """P(at least `fixed` of the discordant problems are fixes | fixes and breaks equally likely)."""
    n = fixed + broken
    return sum(math.comb(n, k) for k in range(fixed, n + 1)) / 2 ** n if n else 1.0


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("runs", nargs="+", type=Path, help="run directories (with config.yaml and checkpoints/)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--heldout-size", type=int, default=None,
                   help="score on this many held-out problems instead of the runs' task.heldout_size (a larger "
                        "set shrinks the evaluation's own noise; the bucket stays disjoint from training)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    size = [] if args.heldout_size is None else [f"task.heldout_size={args.heldout_size}"]
    start = verdicts(load_config(args.runs[0] / "config.yaml", size))
    print(f"start: held-out greedy accuracy {sum(start) / len(start):.3f} ({len(start)} problems)")
    print("\n| run | checkpoint | accuracy | fixed | broken |\n|---|---|---|---|---|")
    total_fixed = total_broken = 0
    for run in args.runs:
        checkpoint = sorted((run / "checkpoints").glob("step_*"))[-1]
        final = verdicts(load_config(run / "config.yaml", [*size, f"model.path={checkpoint}"]))
        fixed = sum(1 for a, b in zip(start, final) if b and not a)
        broken = sum(1 for a, b in zip(start, final) if a and not b)
        total_fixed, total_broken = total_fixed + fixed, total_broken + broken
        print(f"| {run.name} | {checkpoint.name} | {sum(final) / len(final):.3f} | {fixed} | {broken} |")
    print(f"\npooled: {total_fixed} fixed, {total_broken} broken; one-sided sign test "
          f"p = {sign_test(total_fixed, total_broken):.3f}")


if __name__ == "__main__":
    main()
