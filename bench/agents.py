"""Multi-turn agents, 3 seeds per arm, one table per experiment.

    python bench/agents.py --out runs/agents                       # tool use: calculator with / without its tool
    python bench/agents.py --experiment credit --out runs/credit   # credit: trajectory- vs turn-level on guess
    python bench/agents.py ... --report                            # only the table from finished runs

`tool`: `rlvr train recipes/agent_calculator.yaml seed=S` (tool) or the same with
`task.agent_calculator.tools=false` (single turn, no tool), both from the shipped warm start.
Held-out success is sampled (temperature 1, 2 samples per problem, `eval/heldout_sampled_accuracy`)
on the 100 held-out problems; greedy is reported beside it.

`credit`: `rlvr train recipes/agent_guess.yaml seed=S algo.advantage=A` for A = grpo (the
trajectory's outcome advantage broadcast to every token), gigpo (plus the anchor-state step
advantage of the turn) and turn_return (each turn's discounted return against the group's at the
same turn index), same warm start and budget. Each final checkpoint (and the warm start) is scored on the held-out
numbers, 32 sampled episodes each at temperature 1 with fixed seeds: success within the turn limit,
mean guesses of the successful episodes (fewer is better) and mean reward (both at once).
Runs go one after the other (seed-major, so a cut-short sweep still pairs the arms).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from rlvr.tracking.stats import mean_ci

REPO = Path(__file__).resolve().parent.parent
EXPERIMENTS = {
    "tool": ("recipes/agent_calculator.yaml", {"tool": [], "notool": ["task.agent_calculator.tools=false"]}),
    "credit": ("recipes/agent_guess.yaml", {a: [f"algo.advantage={a}"] for a in ("grpo", "gigpo", "turn_return")}),
}
EVAL_SAMPLES = 32
# the trainer's own evaluations are skipped: every arm's final checkpoint is scored by `score` instead
TRAIN_EXTRA = {"tool": [], "credit": ["trainer.eval_every=0", "trainer.eval_samples=0"]}


def finished(run: Path) -> bool:
    return (run / "run.json").exists() and '"finished"' in (run / "run.json").read_text()


def train(out: Path, experiment: str, seeds: list[int], extra: list[str], only: list[str] | None = None) -> None:
    recipe, arms = EXPERIMENTS[experiment]
    for seed in seeds:
        for arm, overrides in arms.items():
            if only and arm not in only:
                continue
            run = out / f"{arm}_s{seed}"
            if not finished(run):
                t0 = time.perf_counter()
                subprocess.run([sys.executable, "-m", "rlvr.cli", "train", str(REPO / recipe), f"seed={seed}",
                                f"trainer.out_dir={out}", f"trainer.name={run.name}", *overrides,
                                *TRAIN_EXTRA[experiment], *extra],
                               check=True, capture_output=True)
                print(f"{run.name}: {time.perf_counter() - t0:.0f} s", flush=True)
            if experiment == "credit" and not (run / "heldout_episodes.json").exists():
                (run / "heldout_episodes.json").write_text(json.dumps(score(run)))


def score(run: Path, model_path: str | None = None) -> dict:
    """Held-out success and guesses-to-success of `run`'s final checkpoint (or of `model_path`)."""
    import torch

    from rlvr.agents.collect import episodes, success_and_turns
    from rlvr.builder import build
    from rlvr.config import load_config
    from rlvr.trainer.checkpoint import latest_checkpoint

    torch.set_num_threads(1)
    path = model_path or str(latest_checkpoint(run / "checkpoints"))
    config = load_config(run / "config.yaml", [f"model.path={path}"])
    model, tokenizer = build.build_model(config)
    task = build.build_task(config, tokenizer)
    rows = [ex for ex in task.heldout() for _ in range(EVAL_SAMPLES)]
    with torch.no_grad():
        trajs = episodes(build.build_engine(config, model, tokenizer), tokenizer, task, rows, temperature=1.0,
                         first_seed=1_000_000)
    success, turns = success_and_turns(trajs)
    return {"success": success, "turns_to_success": turns, "reward": sum(t.reward for t in trajs) / len(trajs),
            "problems": len(rows) // EVAL_SAMPLES}


def curve(run: Path) -> list[dict]:
    return [m for m in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
            if "eval/heldout_sampled_accuracy" in m]


def wall(runs: list[Path]) -> tuple[float, float]:
    return mean_ci([json.loads((r / "run.json").read_text()).get("duration_s", float("nan")) for r in runs])


def report_tool(out: Path, seeds: list[int]) -> str:
    lines = ["| arm | sampled held-out: start → end, mean ± 95% CI | per seed (curve) | greedy end | "
             "tool calls / episode at the end | wall s/run |", "|---|---|---|---|---|---|"]
    for mode in EXPERIMENTS["tool"][1]:
        runs = [out / f"{mode}_s{s}" for s in seeds if finished(out / f"{mode}_s{s}")]
        if not runs:  # an arm left out with --arms
            continue
        curves = [curve(r) for r in runs]
        start = mean_ci([c[0]["eval/heldout_sampled_accuracy"] for c in curves])
        end = mean_ci([c[-1]["eval/heldout_sampled_accuracy"] for c in curves])
        greedy = mean_ci([c[-1]["eval/heldout_accuracy"] for c in curves])
        tools = mean_ci([c[-1].get("agent/tool_calls", 0.0) for c in curves])
        per_seed = "; ".join(" ".join(f"{m['eval/heldout_sampled_accuracy']:.3f}" for m in c) for c in curves)
        lines.append(f"| {mode} | {start[0]:.3f} → **{end[0]:.3f} ± {end[1]:.3f}** | {per_seed} | "
                     f"{greedy[0]:.3f} ± {greedy[1]:.3f} | {tools[0]:.2f} ± {tools[1]:.2f} | {wall(runs)[0]:.0f} |")
    return "\n".join(lines)


def report_credit(out: Path, seeds: list[int]) -> str:
    arms = EXPERIMENTS["credit"][1]
    first = next((out / f"{a}_s{s}" for s in seeds for a in arms if finished(out / f"{a}_s{s}")), None)
    if first is None:
        return "no finished run"
    start_file = out / "warmstart_episodes.json"
    if not start_file.exists():
        start_file.write_text(json.dumps(score(first, model_path="rlvr:agent-guess-warmstart")))
    start = json.loads(start_file.read_text())
    lines = [f"warm start: success {start['success']:.3f}, guesses to success {start['turns_to_success']:.2f} "
             f"({start['problems']} held-out problems × {EVAL_SAMPLES} sampled episodes)", "",
             "| credit | held-out success, mean ± 95% CI | guesses to success | reward | per seed (success / guesses) "
             "| training success, first → last 5 steps | wall s/run |", "|---|---|---|---|---|---|---|"]
    for arm in arms:
        runs = [out / f"{arm}_s{s}" for s in seeds if (out / f"{arm}_s{s}" / "heldout_episodes.json").exists()]
        if not runs:
            continue
        got = [json.loads((r / "heldout_episodes.json").read_text()) for r in runs]
        cells = [mean_ci([g[k] for g in got]) for k in ("success", "turns_to_success", "reward")]
        per_seed = "; ".join(f"{g['success']:.3f} / {g['turns_to_success']:.2f}" for g in got)
        trend = [train_success(r) for r in runs]
        first, last = (mean_ci([t[i] for t in trend]) for i in (0, 1))
        lines.append(f"| {arm} (n={len(runs)}) | **{cells[0][0]:.3f} ± {cells[0][1]:.3f}** | "
                     f"{cells[1][0]:.2f} ± {cells[1][1]:.2f} | {cells[2][0]:.3f} ± {cells[2][1]:.3f} | {per_seed} | "
                     f"{first[0]:.3f} → {last[0]:.3f} ± {last[1]:.3f} | {wall(runs)[0]:.0f} |")
    lines += paired(out, seeds)
    return "\n".join(lines)


def train_success(run: Path) -> tuple[float, float]:
    """Mean `agent/success` of the training batches over the first and the last 5 steps."""
    steps = [m["agent/success"] for m in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
             if "agent/success" in m]
    return sum(steps[:5]) / 5, sum(steps[-5:]) / 5


def paired(out: Path, seeds: list[int]) -> list[str]:
    """Each turn-level arm minus grpo on the same seed (same prompt draws), held-out success."""
    lines = [""]
    for arm in ("gigpo", "turn_return"):
        pairs = [(out / f"{arm}_s{s}", out / f"grpo_s{s}") for s in seeds]
        pairs = [p for p in pairs if all((r / "heldout_episodes.json").exists() for r in p)]
        if pairs:
            diff = [json.loads((a / "heldout_episodes.json").read_text())["success"]
                    - json.loads((b / "heldout_episodes.json").read_text())["success"] for a, b in pairs]
            d = mean_ci(diff)
            lines.append(f"{arm} − grpo, held-out success, paired by seed: {d[0]:+.3f} ± {d[1]:.3f} "
                         f"(per seed {' '.join(f'{x:+.3f}' for x in diff)})")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--experiment", choices=sorted(EXPERIMENTS), default="tool")
    parser.add_argument("--out", type=Path, default=None, help="default runs/agents (tool), runs/credit (credit)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--arms", nargs="+", default=None, help="train only these arms (default: all)")
    parser.add_argument("--report", action="store_true", help="only print the table")
    parser.add_argument("overrides", nargs="*", help="extra key=value for every run")
    args = parser.parse_args()
    out = args.out or REPO / "runs" / ("agents" if args.experiment == "tool" else "credit")
    if not args.report:
        train(out, args.experiment, args.seeds, args.overrides, args.arms)
    print((report_tool if args.experiment == "tool" else report_credit)(out, args.seeds))


if __name__ == "__main__":
    main()
