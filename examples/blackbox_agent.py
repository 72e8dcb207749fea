"""Train a black-box agent, written against the `openai` client only, through rlvr's endpoint.

The agent below is what a user brings: it knows nothing of rlvr. It talks to "the model" twice,
with a counting tool's result between the turns, and scores the second reply by its share of the
letter 'a'. rlvr serves the model (a fresh tiny one here), keeps the exact sampled ids of both
turns, and trains on them with GRPO.

    python examples/blackbox_agent.py --seeds 0 1 2 --steps 40

prints, per seed, the mean reward of the first and last 10 steps (docs/results/agents.md).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

WORDS = ["cat", "dog", "bat", "hat", "rat", "man", "sun", "sky", "sea", "fox", "owl", "bee"]


async def agent(client, example):
    """The user's agent: two calls, a tool result between them; reward = share of 'a' in the last reply."""
    messages = [{"role": "user", "content": example["prompt"]}]
    first = await client.chat.completions.create(model="policy", messages=messages)
    reply = first.choices[0].message
    messages.append(reply.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": "count", "content": f"{(reply.content or '').count('a')} a"})
    second = await client.chat.completions.create(model="policy", messages=messages)
    text = second.choices[0].message.content or ""
    return text.count("a") / max(len(text), 1)


def train(seed: int, steps: int, out: str) -> Path:
    from rlvr import Trainer
    from rlvr.agents.agent_fn import AgentFnTask

    task = AgentFnTask(agent, [{"prompt": f"say a {w}"} for w in WORDS], max_turns=2, max_total_tokens=200,
                       batch_wait_s=1.0, heldout_size=2)
    try:
        Trainer("", train_dataset=task, overrides={
            "seed": seed, "trainer.steps": steps, "rollout.prompts_per_step": 4, "rollout.group_size": 4,
            "rollout.max_new_tokens": 8, "model.max_seq_len": 256, "trainer.eval_every": 0,
            "trainer.out_dir": out}).train()
    finally:
        task.close()
    return max(Path(out).glob(f"*_s{seed}*"), key=lambda p: p.stat().st_mtime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--out", default="runs/blackbox")
    args = parser.parse_args()
    rows = []
    for seed in args.seeds:
        run = train(seed, args.steps, args.out)
        metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        rewards = [m["reward/mean"] for m in metrics if "reward/mean" in m]
        drifted = max(m.get("agent/drifted", 0.0) for m in metrics)
        rows.append((seed, sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10, drifted))
    print("| seed | reward, steps 1-10 | reward, last 10 steps | most drifted share |")
    print("|---|---|---|---|")
    for seed, first, last, drifted in rows:
        print(f"| {seed} | {first:.3f} | {last:.3f} | {drifted:.2f} |")


if __name__ == "__main__":
    main()
