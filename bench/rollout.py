"""rlvr's sampler vs `model.generate`: completion tokens/s over batch size and length, and the
share of the machine's matmul roofline.

    python bench/rollout.py --threads 2
    python bench/rollout.py --batches 64 --lengths 32        # just the roofline point

Model: the packaged Countdown warm start (1.06M-parameter Llama). Prompts: distinct Countdown
prompts (no shared prefixes, so rlvr's per-group prefill sharing does not help here; a GRPO
batch with G=8 gets that on top). Every row generates exactly `length` tokens (EOS disabled in
both engines), sampling at temperature 1.

Roofline share = achieved FLOP/s / float32 matmul FLOP/s measured here at the decode shapes
(rows = batch), where achieved counts prefill 2N·P + decode 2N per token + attention.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from roofline import attention_flops_per_token, matmul_gflops, param_count  # noqa: E402

from rlvr.models.causal_lm import load_causal_lm  # noqa: E402
from rlvr.rollout.torch_ar import generate  # noqa: E402
from rlvr.tasks.countdown import Countdown  # noqa: E402
from rlvr.trainer.evaluate import encode_prompts  # noqa: E402

NO_EOS = -1  # a token id that is never sampled: every row runs to max_new_tokens


def _best(fn, repeats: int) -> tuple[float, float]:
    """(best wall seconds, best process CPU seconds) over `repeats` calls after one warm-up. With
    one thread, CPU time is the wall time the call would take with a core to itself (on a shared
    machine it still pays for a busy sibling hyperthread and shared caches)."""
    fn()  # warm-up
    wall = cpu = float("inf")
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall, cpu = min(wall, time.perf_counter() - t0), min(cpu, time.process_time() - c0)
    return wall, cpu


def run_ours(model, ids, mask, length, pad_id, compile=False):
    seeds = torch.arange(len(ids))
    return lambda: generate(model, ids, mask, seeds, max_new_tokens=length, eos_id=NO_EOS, pad_id=pad_id,
                            compile=compile)


def run_hf(model, ids, mask, length, pad_id):
    def fn():
        with torch.no_grad():
            model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=length, min_new_tokens=length,
                           do_sample=True, temperature=1.0, top_k=0, top_p=1.0, pad_token_id=pad_id,
                           eos_token_id=None)
    return fn


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16, 64, 256])
    p.add_argument("--lengths", type=int, nargs="+", default=[16, 32, 64, 128])
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--compile", action="store_true",
                   help="add a column for generate(compile=True) (torch.compile'd decode step; compile time printed)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"# load before: {os.getloadavg()}  threads={args.threads}  torch {torch.__version__}")
    model, tok = load_causal_lm("rlvr:countdown-warmstart", seed=0)
    model.eval()
    n_params = param_count(model)
    examples = Countdown().sample(max(args.batches), random.Random(0))
    rows = []
    if args.compile:
        ids, mask = encode_prompts(tok, [ex.prompt for ex in examples[:max(2, min(args.batches))]])
        t0 = time.perf_counter()
        run_ours(model, ids, mask, 2, tok.pad_token_id, compile=True)()
        print(f"# compile (first compiled call): {time.perf_counter() - t0:.1f} s wall")
    compiled_head = " rlvr compiled tok/s | compiled/eager |" if args.compile else ""
    print(f"\n| batch | new tokens | rlvr tok/s |{compiled_head} model.generate tok/s | speed-up |\n"
          f"|---|---|---|{'---|---|' if args.compile else ''}---|---|")
    for batch in args.batches:
        ids, mask = encode_prompts(tok, [ex.prompt for ex in examples[:batch]])
        for length in args.lengths:
            ours = _best(run_ours(model, ids, mask, length, tok.pad_token_id), args.repeats)
            comp = _best(run_ours(model, ids, mask, length, tok.pad_token_id, compile=True), args.repeats) \
                if args.compile else None
            hf = _best(run_hf(model, ids, mask, length, tok.pad_token_id), args.repeats)
            tokens = batch * length
            rows.append((batch, length, ids.shape[1], float(mask.sum()) / batch, ours, hf, comp))
            extra = f" {tokens / comp[0]:,.0f} | {ours[0] / comp[0]:.2f}× |" if comp else ""
            print(f"| {batch} | {length} | {tokens / ours[0]:,.0f} |{extra} {tokens / hf[0]:,.0f} | "
                  f"{hf[0] / ours[0]:.1f}× |", flush=True)

    print(f"\n# load after: {os.getloadavg()}")
    print(f"\nroofline ({n_params:,} parameters, {args.threads} threads):")
    print("share = achieved / matmul rate; wall time, and (CPU) process CPU time")
    print("| batch | new tokens | matmul GFLOP/s at rows=batch | rlvr achieved GFLOP/s | rlvr share | "
          f"rlvr share (CPU) |{' compiled share | compiled share (CPU) |' if args.compile else ''} "
          "generate share | generate share (CPU) |")
    print("|---|---|---|---|---|---|" + ("---|---|" if args.compile else "") + "---|---|")
    for batch, length, _, prompt_len, ours, hf, comp in rows:
        if (batch, length) != (64, 32) and len(rows) > 1:
            continue
        peak = matmul_gflops(model.config, batch)
        prefill = (2 * n_params + attention_flops_per_token(model.config, prompt_len / 2)) * prompt_len
        decode = (2 * n_params + attention_flops_per_token(model.config, prompt_len + length / 2)) * length
        flops = batch * (prefill + decode)

        def share(seconds, flops=flops, peak=peak):
            return f"{flops / seconds / 1e9 / peak:.0%}"
        extra = f" {share(comp[0])} | {share(comp[1])} |" if comp else ""
        print(f"| {batch} | {length} | {peak:.0f} | {flops / ours[0] / 1e9:.0f} | {share(ours[0])} | {share(ours[1])} |"
              f"{extra} {share(hf[0])} | {share(hf[1])} |")


if __name__ == "__main__":
    main()
