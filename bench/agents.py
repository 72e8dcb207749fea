"""Tool use on the calculator: the agent recipe with and without its tool, 3 seeds, one table.

    python bench/agents.py --out runs/agents            # trains 2 × 3 runs, then prints the table
    python bench/agents.py --out runs/agents --report   # only the table from finished runs

Each run: `rlvr train recipes/agent_calculator.yaml seed=S` (tool) or the same with
`task.agent_calculator.tools=false` (single turn, no tool), both from the shipped warm start,
one after the other. Held-out success is sampled (temperature 1, 2 samples per problem,
`eval/heldout_sampled_accuracy`) on the 100 held-out problems; greedy is reported beside it.
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
MODES = {"tool": [], "notool": ["task.agent_calculator.tools=false"]}


def train(out: Path, seeds: list[int], extra: list[str]) -> None:
    for seed in seeds:
        for mode, overrides in MODES.items():
            run = out / f"{mode}_s{seed}"
            if (run / "run.json").exists() and '"finished"' in (run / "run.json").read_text():
                continue
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "rlvr.cli", "train", str(REPO / "recipes/agent_calculator.yaml"),
                            f"seed={seed}", f"trainer.out_dir={out}", f"trainer.name={run.name}", *overrides,
                            *extra], check=True, capture_output=True)
            print(f"{run.name}: {time.perf_counter() - t0:.0f} s", flush=True)


def curve(run: Path) -> list[dict]:
    return [m for m in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
            if "eval/heldout_sampled_accuracy" in m]


def report(out: Path, seeds: list[int]) -> str:
    lines = ["| arm | sampled held-out: start → end, mean ± 95% CI | per seed (curve) | greedy end | "
             "tool calls / episode at the end | wall s/run |", "|---|---|---|---|---|---|"]
    for mode in MODES:
        runs = [out / f"{mode}_s{s}" for s in seeds]
        curves = [curve(r) for r in runs]
        start = mean_ci([c[0]["eval/heldout_sampled_accuracy"] for c in curves])
        end = mean_ci([c[-1]["eval/heldout_sampled_accuracy"] for c in curves])
        greedy = mean_ci([c[-1]["eval/heldout_accuracy"] for c in curves])
        tools = mean_ci([c[-1].get("agent/tool_calls", 0.0) for c in curves])
        wall = mean_ci([json.loads((r / "run.json").read_text()).get("duration_s", float("nan")) for r in runs])
        per_seed = "; ".join(" ".join(f"{m['eval/heldout_sampled_accuracy']:.3f}" for m in c) for c in curves)
        lines.append(f"| {mode} | {start[0]:.3f} → **{end[0]:.3f} ± {end[1]:.3f}** | {per_seed} | "
                     f"{greedy[0]:.3f} ± {greedy[1]:.3f} | {tools[0]:.2f} ± {tools[1]:.2f} | {wall[0]:.0f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "agents")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--report", action="store_true", help="only print the table")
    parser.add_argument("overrides", nargs="*", help="extra key=value for every run")
    args = parser.parse_args()
    if not args.report:
        train(args.out, args.seeds, args.overrides)
    print(report(args.out, args.seeds))


if __name__ == "__main__":
    main()
