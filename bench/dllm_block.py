"""Block diffusion on Countdown: the KV cache's saving, and SFT + RL over seeds.

    python bench/dllm_block.py                      # cache table, then the recipe at 3 seeds
    python bench/dllm_block.py --steps 0            # the cache table only

Table 1 (the warm start of recipes/dllm_block_countdown.yaml, greedy, all held-out problems, each
setting in this one process): sampling block by block with the KV cache against the same sampler
without it (every step one block-causal forward of the prompt and all blocks so far). Columns:
whether the completions are token for token the same, held-out accuracy, model forwards, columns
run through the model (B·S summed over forwards, the FLOP proxy: the MLPs and projections are
linear in it) and wall time.
Table 2: the recipe (SFT warm start, then RL) at each seed, held-out accuracy mean ± 95% CI.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from _sweep import REPO, report, run_sweep

from rlvr.builder import build
from rlvr.codec import decode_completions, encode_prompts
from rlvr.config import load_config
from rlvr.engines.torch_block_diffusion import generate_block_diffusion

RECIPE = REPO / "recipes/dllm_block_countdown.yaml"


def cache_table(overrides: list[str]) -> str:
    config = load_config(RECIPE, overrides)
    torch.set_num_threads(config.trainer.threads or 1)
    model, tokenizer = build.build_model(config)
    task = build.build_task(config, tokenizer)
    examples = task.heldout()
    ids, mask = encode_prompts(tokenizer, [e.prompt for e in examples])
    columns = []
    model.embed_tokens.register_forward_hook(lambda m, args, out: columns.append(args[0].numel()))
    r = config.rollout
    rows = ["| steps | threshold | cache | same tokens | held-out acc | forwards | columns | s |",
            "|---|---|---|---|---|---|---|---|"]
    for steps, threshold in ((r.max_new_tokens, None), (r.max_new_tokens // 2, None), (r.max_new_tokens, 0.9)):
        outs = {}
        for cache in (True, False):
            columns.clear()
            t0 = time.perf_counter()
            out = generate_block_diffusion(model, ids, mask, torch.zeros(len(examples), dtype=torch.long),
                                           gen_length=r.max_new_tokens, steps=steps, temperature=0.0,
                                           threshold=threshold, mask_id=tokenizer.mask_token_id,
                                           eos_id=tokenizer.eos_token_id, window=r.window, use_cache=cache)
            seconds = time.perf_counter() - t0
            texts = decode_completions(tokenizer, out)
            acc = sum(bool(task.is_correct(t, e)) for t, e in zip(texts, examples)) / len(examples)
            outs[cache] = out.completion_ids
            same = "—" if cache else str(bool(torch.equal(outs[True], out.completion_ids)))
            rows.append(f"| {steps} | {threshold} | {cache} | {same} | {acc:.3f} | {out.forwards} | {sum(columns):,} "
                        f"| {seconds:.2f} |")
    return "\n".join(rows) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=400, help="RL steps per seed (0 = the cache table only)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--out", type=Path, default=Path("runs/bench_dllm_block"))
    p.add_argument("overrides", nargs="*", help="extra key=value overrides")
    args = p.parse_args()
    print(cache_table(["trainer.threads=1", *args.overrides]))
    if not args.steps:
        return
    overrides = [f"trainer.steps={args.steps}", f"trainer.eval_every={max(args.steps // 4, 1)}",
                 "trainer.save_every=0", "trainer.threads=1", *args.overrides]
    run_sweep([str(RECIPE.relative_to(REPO))], args.seeds, overrides, args.out)
    print(report(args.out, ["eval/heldout_accuracy", "eval/heldout_sampled_accuracy", "reward/mean", "time/step_s",
                            "perf/forwards_per_update"], ["eval/heldout_accuracy", "reward/mean"]))


if __name__ == "__main__":
    main()
