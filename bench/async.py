"""The synchronous loop against asynchronous rollouts (trainer.max_staleness = 1, 2, 4) on the same
cores, the same total samples and the same seeds; prints a markdown table.

Per configuration: the learner's wall-clock per step (median over the steps after the first two;
the synchronous loop's is the sum of its phases, the asynchronous learner's includes its wait for a
batch), the ratio to the synchronous loop, the trainer's and the rollout side's idle fractions
(synchronous: the learner idles while it rolls out and the other way round), and the final greedy
held-out accuracy, mean ± 95% CI over seeds (the ratio is taken per seed, then averaged). Runs are
interleaved per seed (sync, η=1, η=2, η=4), each a separate `rlvr train` process.

Then a projection, labelled as one, from the synchronous loop's measured phase times: with the
rollout side on W workers of its own (more cores or machines), a step takes max(R / W, L) instead
of R + L, R being the rollout time and L the learner's (log-probs and update).

    python bench/async.py --seeds 0 1 2 --steps 30 --threads 2
    python bench/async.py --scale 10 --seeds 0 1 2 --steps 10 --threads 2

`--workload judge|code|tool --latency S`: a loop that waits. judge: the Countdown verifier behind a
judge that answers S s after each batch (a stand-in for a remote judge: it waits and computes nothing
here); code: the code task's sandboxed tests (`recipes/code_fixture.yaml`, bubblewrap when installed),
plus S s per batch when S > 0; tool: the calculator agent (`recipes/agent_calculator.yaml`) whose tool
answers S s after each call, inside the rollout. The asynchronous rollout side scores ahead
(`collect.produce_ahead`: a batch is scored in a pool while the next one samples) and gives its core to
the learner during a tool's wait (`runtime.rows.waiting`). The load average is printed with the table.

    python bench/async.py --workload judge --latency 0.5 --seeds 0 1 2 --steps 20 --configs sync "η=1" "η=2" "η=4"

`--workload longtail`: completion lengths spread ~10× within every group (the tiny model with an EOS
bias, `spread.spread_model(tiny=True)`), against asynchronous rollouts with partial rollouts
(`trainer.partial_rollouts`: the learner's update enters the batch in flight; the table's token
staleness is `rollout/staleness_mean`, versions behind the learner per completion token):

    python bench/async.py --workload longtail --seeds 0 1 2 --steps 12 --configs sync "η=1" "η=1 partial"

Configs `η=1 lanes=2`, `η=2 lanes=2`, `η=2 lanes=3` roll that many batches out side by side
(`trainer.rollout_lanes`: one lane samples while another's tools answer):

    python bench/async.py --workload tool --latency 0.2 --seeds 0 1 2 --steps 20 \
        --configs sync "η=1" "η=1 lanes=2" "η=2 lanes=3"
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from spread import spread_model  # the long-tail workload's model
from vs_trl import large_model  # the 10× model both benchmarks time (bench/ is on sys.path)

from rlvr.tracking.stats import mean_ci

REPO = Path(__file__).resolve().parent.parent
# name: (max_staleness, extra overrides); `ray η=1` (rollout worker and verifier as Ray actors) and
# `lanes=2` (two batches rolled out side by side, `trainer.rollout_lanes`) on request
CONFIGS = {"sync": (None, []), "η=1": (1, []), "η=2": (2, []), "η=4": (4, []),
           "η=1 lanes=2": (1, ["trainer.rollout_lanes=2"]), "η=2 lanes=2": (2, ["trainer.rollout_lanes=2"]),
           "η=2 lanes=3": (2, ["trainer.rollout_lanes=3"]),
           "ray η=1": (1, ["trainer.backend=ray"]),
           "η=1 partial": (1, ["trainer.partial_rollouts=true"]), "η=2 partial": (2, ["trainer.partial_rollouts=true"])}
DEFAULT = ["sync", "η=1", "η=2", "η=4"]


def _train(out: Path, name: str, seed: int, config: tuple, args, model_path: str | None) -> list[dict]:
    recipe, workload_overrides = args.workload_run
    cmd = [sys.executable, "-m", "rlvr.cli", "train", str(REPO / recipe), f"seed={seed}",
           f"trainer.steps={args.steps}", "trainer.eval_every=0", "trainer.save_every=0",
           f"trainer.threads={args.threads}", f"trainer.out_dir={out}", f"trainer.name={name}",
           *workload_overrides, *args.overrides]
    staleness, extra = config
    if staleness is not None:
        cmd += [f"trainer.max_staleness={staleness}", "algo.rollout_correction=true", "algo.correction_cap=2.0", *extra]
    if model_path:
        cmd.append(f"model.path={model_path}")
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{name} failed:\n{done.stderr[-3000:]}")
    print(f"  {name:<14} {time.perf_counter() - t0:7.1f} s", file=sys.stderr)
    return [json.loads(line) for line in (out / name / "metrics.jsonl").read_text().splitlines()]


JUDGE = """import time

from rlvr.rewards.runner import batched
from rlvr.tasks.countdown import Countdown

_TASK = Countdown()  # the recipe's Countdown (its task section keeps the defaults)


@batched
def judge(prompts, completions, **columns):
    time.sleep(%(latency)r)  # the round trip: a wait, no computation in this process
    rows = [{k: v[i] for k, v in columns.items()} for i in range(len(prompts))]
    return [_TASK.reward(p, c, **row) for p, c, row in zip(prompts, completions, rows)]
"""

WAIT = """import time

from rlvr.rewards.runner import batched


@batched
def wait(prompts, completions, **columns):
    time.sleep(%(latency)r)  # a remote sandbox's round trip on top of the local one: a wait, scoring 0
    return [0.0] * len(completions)
"""


def judge_reward(directory: Path, latency: float) -> str:
    """A `reward.fn` override for the Countdown verifier behind a judge that answers after `latency` s."""
    path = directory / "judge.py"
    path.write_text(JUDGE % {"latency": latency})
    return f"reward.fn={path}:judge"


def workload(name: str, latency: float, directory: Path) -> tuple[str, list[str]]:
    """(recipe, overrides) of a workload that waits `latency` s: `judge` = Countdown scored by a judge
    answering after it per batch; `code` = the code task's sandboxed tests (bubblewrap when
    installed), then a further wait per batch that adds 0 to the reward; `tool` = the calculator
    agent whose tool answers after it per call, inside the rollout; `longtail` = the tiny model
    with an EOS bias (`spread.spread_model(tiny=True)`): completion lengths spread from a few tokens to
    the 128-token cap within every group, Countdown prompts, 2 groups of 8 a step (no latency)."""
    if name == "judge":
        return "recipes/grpo_countdown.yaml", [judge_reward(directory, latency)] if latency > 0 else []
    if name == "code":
        path = directory / "wait.py"
        path.write_text(WAIT % {"latency": latency})
        return "recipes/code_fixture.yaml", [f"reward.fn=task, {path}:wait"] if latency > 0 else []
    if name == "longtail":
        return "recipes/grpo_countdown.yaml", [f"model.path={spread_model(str(directory / 'spread'), tiny=True)}",
                                               "rollout.max_new_tokens=128", "rollout.prompts_per_step=2",
                                               "rollout.group_size=8"]
    return "recipes/agent_calculator.yaml", [f"task.agent_calculator.tool_latency_s={latency}"]


def _per_step(lines: list[dict], skip: int = 2) -> list[dict]:
    steps = [m for m in lines if m["step"] > 0]
    return steps[skip:] if len(steps) > skip + 1 else steps


def summarize(lines: list[dict]) -> dict[str, float]:
    """Wall-clock per step (median), idle fractions and phase times (means) of one run."""
    steps = _per_step(lines)
    if "async/step_s" in steps[0]:
        wall = [m["async/step_s"] for m in steps]
        trainer_idle = statistics.fmean(m["async/trainer_idle_frac"] for m in steps)
        rollout_idle = statistics.fmean(m["async/rollout_idle_frac"] for m in steps)
    else:
        wall = [m["time/step_s"] for m in steps]
        trainer_idle = statistics.fmean(m["time/rollout_s"] / m["time/step_s"] for m in steps)
        rollout_idle = 1.0 - trainer_idle
    return {"wall": statistics.median(wall), "trainer_idle": trainer_idle, "rollout_idle": rollout_idle,
            "rollout_s": statistics.fmean(m["time/rollout_s"] for m in steps),
            "learner_s": statistics.fmean(m["time/logprob_s"] + m["time/update_s"] for m in steps),
            "accuracy": lines[-1].get("eval/heldout_accuracy", float("nan")),
            "token_staleness": statistics.fmean(m.get("rollout/staleness_mean", 0.0) for m in steps)}


def _cell(values: list[float], digits: str = ".3f") -> str:
    mean, half = mean_ci(values)
    return f"{mean:{digits}} ± {half:{digits}}" if half == half else f"{mean:{digits}}"


def table(results: dict[str, list[dict]]) -> str:
    """One row per configuration; the ratio is per seed (sync's s/step over this one's, the runs of a
    seed back to back, so a load that changes between seeds cancels), mean ± 95% CI over seeds."""
    rows = ["| config | s/step (median) | ratio to sync | trainer idle | rollout idle | token staleness (mean) "
            "| held-out accuracy |", "|---|---|---|---|---|---|---|"]
    for name, runs in results.items():
        ratios = [s["wall"] / r["wall"] for s, r in zip(results.get("sync", []), runs)]
        ratio = f"{_cell(ratios, '.2f')}×" if ratios else "–"
        idle = [_cell([r[k] for r in runs], ".2f") for k in ("trainer_idle", "rollout_idle")]
        stale = _cell([r["token_staleness"] for r in runs], ".2f")
        rows.append(f"| {name} | {_cell([r['wall'] for r in runs])} | {ratio} | {idle[0]} | {idle[1]}"
                    f" | {stale} | {_cell([r['accuracy'] for r in runs])} |")
    return "\n".join(rows)


def projection(sync_runs: list[dict], workers=(1, 2, 4, 8)) -> str:
    """PROJECTION, not a measurement: the synchronous phase times with the rollout side on W workers of its own."""
    r = statistics.fmean(x["rollout_s"] for x in sync_runs)
    learner = statistics.fmean(x["learner_s"] for x in sync_runs)
    rows = [f"Projection (not measured): rollout R = {r:.3f} s, learner L = {learner:.3f} s per step "
            "(synchronous runs above); async step = max(R/W, L) on separate cores, sync step = R + L.",
            "", "| rollout workers W | projected s/step | projected ratio |", "|---|---|---|"]
    for w in workers:
        step = max(r / w, learner)
        rows.append(f"| {w} | {step:.3f} | {(r + learner) / step:.2f}× |")
    return "\n".join(rows)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--scale", type=int, default=1, choices=[1, 10])
    p.add_argument("--configs", nargs="+", default=DEFAULT, choices=list(CONFIGS))
    p.add_argument("--out", type=Path, default=None, help="keep the run directories here")
    p.add_argument("--workload", default="judge", choices=["judge", "code", "tool", "longtail"],
                   help="judge: Countdown behind a waiting verifier; code: sandboxed tests; tool: a calculator agent; "
                        "longtail: completion lengths spread ~10x within each group (tiny model)")
    p.add_argument("--latency", type=float, default=0.0,
                   help="seconds of waiting: per batch before scoring (judge, code), per tool call (tool)")
    p.add_argument("overrides", nargs="*", help="key=value for every run")
    args = p.parse_args(argv)
    load_before = " ".join(f"{x:.2f}" for x in os.getloadavg())  # the machine is shared: say how loaded
    with tempfile.TemporaryDirectory() as scratch:
        out = args.out or Path(scratch) / "runs"
        args.workload_run = workload(args.workload, args.latency, Path(scratch))
        model_path = large_model(str(Path(scratch) / "model10x")) if args.scale == 10 else None
        results: dict[str, list[dict]] = {name: [] for name in args.configs}
        for seed in args.seeds:  # interleaved: each seed runs every configuration back to back
            for name in args.configs:
                label = f"{name.replace('η=', 'eta').replace(' ', '_')}_s{seed}"
                results[name].append(summarize(_train(out, label, seed, CONFIGS[name], args, model_path)))
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"workload {args.workload}, latency {args.latency} s, steps {args.steps}, seeds {args.seeds}, "
          f"threads {args.threads}, scale {args.scale}×; load average (1, 5, 15 min) before {load_before}, "
          f"after {load}\n")
    print(table(results))
    if "sync" in results:
        print()
        print(projection(results["sync"]))


if __name__ == "__main__":
    main()
