"""CJ-GRPO's decoding scheduler on the shipped Countdown warm start: greedy held-out accuracy, forwards
and answer length for even and ascending step sizes, with and without EOS early rejection.

    python bench/dllm_schedule.py                       # the warm start
    python bench/dllm_schedule.py model.path=RUN/final  # any checkpoint of the recipe's model

Every row is one deterministic greedy decode of the 200 held-out problems (no seeds to vary).
"""

from __future__ import annotations

import argparse

import torch
from _sweep import REPO

from rlvr.builder import build
from rlvr.codec import encode_prompts
from rlvr.config import load_config
from rlvr.trainer.evaluate import greedy_accuracy

SETTINGS = [  # (label, overrides)
    ("even, N = 16, B = 8 (trace recipe)", ["rollout.diffusion_steps=16", "rollout.block_length=8"]),
    ("threshold 0.9, B = 8 (d1 recipe)", ["rollout.diffusion_steps=16", "rollout.block_length=8",
                                           "rollout.threshold=0.9"]),
    ("even, N = 4, B = 16", ["rollout.diffusion_steps=4", "rollout.block_length=16"]),
    ("even, N = 4, B = 16, EOSER", ["rollout.diffusion_steps=4", "rollout.block_length=16",
                                    "rollout.eoser_gamma=0.01"]),
    ("ascending, N = 4, B = 16", ["rollout.diffusion_steps=4", "rollout.block_length=16",
                                  "rollout.step_schedule=ascending"]),
    ("ascending, N = 4, B = 16, EOSER (cj_grpo recipe)", ["rollout.diffusion_steps=4", "rollout.block_length=16",
                                                          "rollout.step_schedule=ascending",
                                                          "rollout.eoser_gamma=0.01"]),
]


def _merged(*groups: list[str]) -> list[str]:
    """key=value overrides, a later group's value replacing an earlier one's."""
    return [f"{k}={v}" for k, v in dict(item.split("=", 1) for group in groups for item in group).items()]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("overrides", nargs="*", help="key=value overrides of recipes/dllm_cj_grpo_countdown.yaml")
    args = p.parse_args()
    recipe = REPO / "recipes/dllm_cj_grpo_countdown.yaml"
    plain = ["rollout.step_schedule=even", "rollout.eoser_gamma=null", "rollout.window=eos"]  # length to EOS
    base = load_config(recipe, _merged(plain, args.overrides))
    torch.set_num_threads(base.trainer.threads or 1)
    model, tokenizer = build.build_model(base)
    task = build.build_task(base, tokenizer)
    heldout = task.heldout()
    ids, mask = encode_prompts(tokenizer, [ex.prompt for ex in heldout])
    print("| sampler | greedy held-out | forwards / completion | answer tokens (to EOS) |\n|---|---|---|---|")
    for label, overrides in SETTINGS:
        cfg = load_config(recipe, _merged(plain, args.overrides, overrides))
        engine = build.build_engine(cfg, model, tokenizer)
        acc = greedy_accuracy(engine, tokenizer, task, heldout, agent=False)
        out = engine(ids, mask, torch.arange(len(heldout)), temperature=0.0)
        length = (out.completion_mask.sum(-1) - 1).float().mean()  # the mask runs up to and incl. EOS
        print(f"| {label} | {acc:.3f} | {out.forwards} | {length:.2f} |")


if __name__ == "__main__":
    main()
