"""The speed-accuracy frontier of the masked-diffusion sampler: greedy held-out accuracy against tokens per forward.

    python bench/dllm_frontier.py                                   # the packaged Countdown warm start
    python bench/dllm_frontier.py --model runs/x/final               # a trained checkpoint
    python bench/dllm_frontier.py --thresholds 0.9 0.7 --steps 16 8

Each setting decodes every held-out problem greedily (temperature 0) once. Columns: accuracy with a 95%
Wilson interval over the problems; tokens per forward = window tokens / denoising steps, averaged over
the rows (a row's steps are the forwards it took part in: `trace.max() + 1`); the batch's forwards (a
batch step runs while any row still has masked tokens); and the paired change against the first
fixed-step setting (N = L, one token per forward): problems fixed / broken.
Fixed step counts N commit L/N tokens per forward in every row; a confidence threshold commits every
token above it (at least one per step), so rows differ in their speed.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch

from rlvr.builder import build
from rlvr.codec import decode_completions, encode_prompts
from rlvr.config import load_config

REPO = Path(__file__).resolve().parent.parent
RECIPE = REPO / "recipes/dllm_diffu_grpo_countdown.yaml"


def wilson(successes: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """(low, high) of the Wilson score interval of a binomial proportion.

    >>> [round(v, 4) for v in wilson(40, 200)]
    [0.1505, 0.2609]
    """
    if n == 0:
        return math.nan, math.nan
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


def decode_setting(engine, tokenizer, task, examples, *, batch_size: int = 256) -> tuple[list[bool], list[int], int]:
    """(verdicts, each row's denoising steps, the batches' forwards) of a greedy decode of `examples`."""
    verdicts, steps, forwards = [], [], 0
    for start in range(0, len(examples), batch_size):
        chunk = examples[start:start + batch_size]
        ids, mask = encode_prompts(tokenizer, [e.prompt for e in chunk])
        out = engine(ids, mask, torch.zeros(len(chunk), dtype=torch.long), temperature=0.0)
        texts = decode_completions(tokenizer, out)
        verdicts.extend(bool(task.is_correct(t, ex)) for t, ex in zip(texts, chunk))
        steps.extend((out.trace.max(-1).values + 1).tolist())
        forwards += int(out.forwards)
    return verdicts, steps, forwards


def settings(length: int, thresholds: list[float], steps: list[int]) -> list[list[str]]:
    """Overrides of each setting: fixed step counts first (the first is the reference), then thresholds."""
    fixed = [[f"rollout.diffusion_steps={n}", "rollout.threshold=null"] for n in steps]
    return fixed + [[f"rollout.diffusion_steps={length}", f"rollout.threshold={t}"] for t in thresholds]


def frontier(recipe: Path, overrides: list[str], thresholds: list[float], steps: list[int] | None) -> str:
    base = load_config(recipe, overrides)
    torch.set_num_threads(base.trainer.threads or 1)
    length = base.rollout.max_new_tokens
    steps = steps or [length, length // 2, length // 4]
    model, tokenizer = build.build_model(base)
    task = build.build_task(base, tokenizer)
    examples = task.heldout()
    rows = ["| setting | held-out acc [95% Wilson] | tokens/forward | batch forwards | vs N=L: fixed / broken |",
            "|---|---|---|---|---|"]
    reference = None
    for extra in settings(length, thresholds, steps):
        cfg = load_config(recipe, [*overrides, *extra])
        engine = build.build_engine(cfg, model, tokenizer)
        verdicts, row_steps, forwards = decode_setting(engine, tokenizer, task, examples)
        reference = reference or verdicts
        hits = sum(verdicts)
        lo, hi = wilson(hits, len(verdicts))
        tpf = sum(length / s for s in row_steps) / len(row_steps)
        fixed = sum(v and not r for v, r in zip(verdicts, reference))
        broken = sum(r and not v for v, r in zip(verdicts, reference))
        t = cfg.rollout.threshold
        name = f"threshold {t}" if t is not None else f"N = {cfg.rollout.diffusion_steps}"
        rows.append(f"| {name} | {hits / len(verdicts):.3f} [{lo:.3f}, {hi:.3f}] | {tpf:.2f} | {forwards} | "
                    f"{fixed} / {broken} |")
    return f"{len(examples)} held-out problems, window L = {length}, block {base.rollout.block_length or length}\n" \
        + "\n".join(rows) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="checkpoint directory (default: the recipe's)")
    p.add_argument("--recipe", type=Path, default=RECIPE)
    p.add_argument("--thresholds", type=float, nargs="+", default=[0.95, 0.9, 0.8, 0.7, 0.5])
    p.add_argument("--steps", type=int, nargs="+", default=None, help="fixed step counts (default L, L/2, L/4)")
    p.add_argument("overrides", nargs="*", help="extra key=value overrides")
    args = p.parse_args()
    overrides = ["trainer.threads=1", *([f"model.path={args.model}"] if args.model else []), *args.overrides]
    print(frontier(args.recipe, overrides, args.thresholds, args.steps))


if __name__ == "__main__":
    main()
