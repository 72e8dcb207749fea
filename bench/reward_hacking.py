"""Reward hacking at tiny scale: GRPO on Countdown against a learned reward model, and the defences tried.

    python bench/reward_hacking.py --plot PNG           # RM training + 5 conditions × 3 seeds, the table, the curves
    python bench/reward_hacking.py --seeds 0 --steps 24 --conditions raw form_gated

1. `rlvr rm` trains a Bradley–Terry reward model on Countdown pairs made from the verifier (a
   solution over a wrong expression of the same numbers) and `rlvr export` saves it.
2. `rlvr train` runs GRPO from the packaged warm start with the reward model as the only reward
   (``reward.fn="RM, 0*task"``: the verifier weighs nothing and is only logged, as the true
   reward), under each condition:
   - ``raw``: the reward model's score;
   - ``clipped``: the clip refinement, min(s − η, 0) with η = 0 (``reward.model_steps=clipped``;
     a bare expression is one step, so this is the score clipped from above at η);
   - ``form_gated``: the score beside a verifiable form constraint weighted above the score's
     range (``bench/countdown_form.py``: 1 when the completion parses and uses exactly the given
     numbers, blind to whether it hits the target), so no malformed completion outscores a
     well-formed one;
   - ``kl``: the raw score with a KL to the warm start (``algo.kl_coef``); ``form_gated_kl``: both.
3. The table: the learned reward (the model's raw score of the samples) and the true verifier
   accuracy of the same samples, averaged over the first and the last quarter of the steps, and
   the greedy held-out accuracy at the end; mean ± 95% CI over seeds. Hacking is the learned
   reward rising while the true accuracy falls.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from rlvr.tracking.stats import mean_ci

FORM = Path(__file__).with_name("countdown_form.py")
FORM_WEIGHT = 10  # above the reward model's range of scores over these samples (about -3 to 5)
KL_COEF = 0.1  # k3 KL to the warm start, against advantages of unit scale (group-normalised)
# condition -> (the logged key of the learned reward, reward terms beside it and the verifier, overrides)
CONDITIONS = {
    "raw": ("reward_model/raw", "", []),
    "clipped": ("process_reward/min_step", "", ["reward.model_steps=clipped", "reward.model_step_threshold=0",
                                                "reward.model_step_separator=,"]),
    "form_gated": ("reward_model/raw", f", {FORM_WEIGHT}*{FORM}:score", []),
    "kl": ("reward_model/raw", "", [f"algo.kl_coef={KL_COEF}"]),
    "form_gated_kl": ("reward_model/raw", f", {FORM_WEIGHT}*{FORM}:score", [f"algo.kl_coef={KL_COEF}"]),
}
COMMON = ["trainer.threads=1", "trainer.eval_every=0", "trainer.save_every=0"]


def _rlvr(*args: str) -> None:
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "rlvr.cli", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"rlvr {' '.join(args)} failed:\n{done.stderr[-2000:]}")
    seed = " ".join(a for a in args[1:] if "seed" in a)
    print(f"  {time.perf_counter() - t0:6.1f}s  rlvr {args[0]} {seed}", flush=True)


def train_reward_model(out: Path) -> Path:
    """The reward model (the measured `rlvr rm` command of docs/usage.md), exported to out/rm_export."""
    export = out / "rm_export"
    if not (export / "config.json").is_file():
        _rlvr("rm", "preference.steps=60", "preference.lr=1e-3", "preference.eval_every=30", "trainer.threads=1",
              f"trainer.out_dir={out}", "trainer.name=rm")
        _rlvr("export", str(out / "rm"), str(export))
    return export


def run(out: Path, rm: Path, condition: str, seed: int, steps: int) -> Path:
    path = out / condition / f"s{seed}"
    if (path / "run.json").is_file() and '"finished"' in (path / "run.json").read_text():
        return path
    _, beside, overrides = CONDITIONS[condition]
    _rlvr("train", f"reward.fn={rm}, 0*task{beside}", f"seed={seed}", f"trainer.steps={steps}",
          f"trainer.out_dir={path.parent}", f"trainer.name={path.name}", *COMMON, *overrides)
    return path


def summary(path: Path, learned: str) -> dict[str, float]:
    lines = [json.loads(x) for x in (path / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in lines if f"reward/{learned}" in m]
    quarter = max(1, len(steps) // 4)

    def mean(rows, key):
        return sum(m[key] for m in rows) / len(rows)

    return {"learned_first": mean(steps[:quarter], f"reward/{learned}"),
            "learned_last": mean(steps[-quarter:], f"reward/{learned}"),
            "true_first": mean(steps[:quarter], "reward/task/mean"),
            "true_last": mean(steps[-quarter:], "reward/task/mean"),
            "heldout_start": lines[0]["eval/heldout_accuracy"],
            "heldout_end": [m for m in lines if "eval/heldout_accuracy" in m][-1]["eval/heldout_accuracy"]}


def table(rows: dict[str, list[dict[str, float]]]) -> str:
    keys = ["learned_first", "learned_last", "true_first", "true_last", "heldout_start", "heldout_end"]
    out = ["| condition | seeds | " + " | ".join(k.replace("_", " ") for k in keys) + " |",
           "|---|---|" + "---|" * len(keys)]
    for name, runs in rows.items():
        cells = []
        for k in keys:
            m, half = mean_ci([r[k] for r in runs])
            cells.append(f"{m:.3f} ± {half:.3f}" if half == half else f"{m:.3f}")
        out.append(f"| {name} | {len(runs)} | " + " | ".join(cells) + " |")
    return "\n".join(out)


CURVES = ["reward/task/mean", "reward/reward_model/raw", "eval/heldout_accuracy"]


def plot(out: Path, conditions: list[str], seeds: list[int], path: Path) -> Path:
    """The verifier's accuracy, the learned reward and held-out accuracy over steps per condition."""
    from rlvr.tracking.plots import plot_groups
    from rlvr.tracking.runs import Group, load_run

    groups = [Group(c, [load_run(out / c / f"s{s}") for s in seeds]) for c in conditions]
    return plot_groups(groups, CURVES, path, window=3)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=Path("runs/bench_reward_hacking"))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--conditions", nargs="+", default=list(CONDITIONS), choices=list(CONDITIONS))
    p.add_argument("--plot", type=Path, help="also draw the curves of the conditions run into this PNG")
    args = p.parse_args(argv)
    rm = train_reward_model(args.out)
    rows = {}
    for condition in args.conditions:  # one run at a time, each its own process
        rows[condition] = [summary(run(args.out, rm, condition, s, args.steps), CONDITIONS[condition][0])
                           for s in args.seeds]
    print(table(rows))
    if args.plot:
        print(f"curves: {plot(args.out, args.conditions, args.seeds, args.plot)}")


if __name__ == "__main__":
    main()
