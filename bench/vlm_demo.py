"""The tiny VLM learns count_shapes on the CPU: held-out greedy accuracy of GRPO from the packaged
warm start, over seeds, against the warm start itself.

    python bench/vlm_demo.py --out runs/vlm_demo [--seeds 0 1 2] [--steps N]

Runs `rlvr train vlm_count_shapes seed=S` for each seed, one at a time, then prints a table: the
warm start's held-out accuracy (step 0), the end's, the per-seed curve at each evaluation, and
mean ± 95% CI (Student t over seeds) of the end and of the change.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from rlvr.cli import main as rlvr
from rlvr.tracking.stats import mean_ci


def curve(run: Path) -> list[tuple[int, float]]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [(int(r["step"]), r["eval/heldout_accuracy"]) for r in rows if "eval/heldout_accuracy" in r]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/vlm_demo")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=0, help="trainer.steps (0 = the recipe's)")
    parser.add_argument("overrides", nargs="*", help="extra key=value overrides for every run")
    args = parser.parse_args()
    extra = [*([f"trainer.steps={args.steps}"] if args.steps else []), *args.overrides]
    runs, walls = [], []
    for seed in args.seeds:
        name = f"vlm_count_shapes_s{seed}"
        if not (Path(args.out) / name / "metrics.jsonl").is_file():
            t0 = time.perf_counter()
            code = rlvr(["train", "vlm_count_shapes", f"seed={seed}", f"trainer.out_dir={args.out}",
                         f"trainer.name={name}", *extra])
            if code != 0:
                raise SystemExit(code)
            walls.append(time.perf_counter() - t0)
        runs.append(curve(Path(args.out) / name))
    start = [r[0][1] for r in runs]
    end = [r[-1][1] for r in runs]
    print("| seed | held-out accuracy at each evaluation (step: accuracy) |")
    print("|---|---|")
    for seed, r in zip(args.seeds, runs):
        print(f"| {seed} | " + " ".join(f"{s}: {a:.3f}" for s, a in r) + " |")
    (m0, h0), (m1, h1) = mean_ci(start), mean_ci(end)
    dm, dh = mean_ci([b - a for a, b in zip(start, end)])
    print(f"\nwarm start {m0:.3f} ± {h0:.3f} -> after RL {m1:.3f} ± {h1:.3f}; change {dm:+.3f} ± {dh:.3f} "
          f"(mean ± 95% CI over {len(runs)} seeds)")
    if walls:
        print(f"wall seconds per run: {' / '.join(f'{w:.0f}' for w in walls)}")


if __name__ == "__main__":
    main()
