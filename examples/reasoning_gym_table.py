"""Five reasoning-gym datasets, trained by name from a fresh tiny model: held-out accuracy before and
after N GRPO steps, and the mean training reward (the datasets' scores, partial credit included) of
the first and last five steps, per seed.

    python examples/reasoning_gym_table.py --seeds 0 1 2 --steps 20

Needs the envs extra (reasoning-gym); runs offline.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

TASKS = {"chain_sum": {"level": 0}, "basic_arithmetic": {"level": 0}, "leg_counting": {"level": 0},
         "spell_backward": {"level": 0}, "word_sorting": {"level": 0}}


def run(name: str, knobs: dict, seed: int, steps: int, out: str) -> dict:
    from rlvr import Trainer
    from rlvr.tasks.reasoning_gym import ReasoningGymTask

    task = ReasoningGymTask(name, heldout_size=32, **knobs)
    Trainer("", train_dataset=task, overrides={
        "seed": seed, "trainer.steps": steps, "rollout.prompts_per_step": 4, "rollout.group_size": 4,
        "rollout.max_new_tokens": 16, "model.max_seq_len": 512, "trainer.eval_every": steps,
        "trainer.out_dir": f"{out}/{name}"}).train()
    runs = sorted(Path(out, name).glob(f"*_s{seed}*"), key=lambda p: p.stat().st_mtime)
    metrics = [json.loads(line) for line in (runs[-1] / "metrics.jsonl").read_text().splitlines()]
    heldout = [m["eval/heldout_accuracy"] for m in metrics if "eval/heldout_accuracy" in m]
    rewards = [m["reward/mean"] for m in metrics if "reward/mean" in m]
    return {"before": heldout[0], "after": heldout[-1],
            "r_first": sum(rewards[:5]) / 5, "r_last": sum(rewards[-5:]) / 5}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--out", default="runs/reasoning_gym")
    args = parser.parse_args()
    print("| dataset | held-out accuracy before → after (per seed) | mean reward, first → last 5 steps (per seed) |")
    print("|---|---|---|")
    for name, knobs in TASKS.items():
        got = [run(name, knobs, seed, args.steps, args.out) for seed in args.seeds]
        acc = "; ".join(f"{g['before']:.2f} → {g['after']:.2f}" for g in got)
        rew = "; ".join(f"{g['r_first']:.3f} → {g['r_last']:.3f}" for g in got)
        print(f"| {name} | {acc} | {rew} |", flush=True)


if __name__ == "__main__":
    main()
