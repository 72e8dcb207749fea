"""rlvr's sampler vs `model.generate`: completion tokens/s over batch size and length, and the
share of the machine's matmul roofline.

    python bench/rollout.py --threads 2
    python bench/rollout.py --batches 64 --lengths 32        # just the roofline point

Decode engines (`--engines`, default `eager cpp`): rlvr's eager decode step and the fused C++
engine (`src/rlvr/kernels/csrc/decode.cpp`, built on first use; its column is dropped, with a
stderr line, if it cannot be built). Every cell times the engines and
`model.generate` back to back, so the speed-up columns compare runs under the same load.

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

from rlvr.codec import encode_prompts  # noqa: E402
from rlvr.engines.torch_ar import generate  # noqa: E402
from rlvr.models.causal_lm import load_causal_lm  # noqa: E402
from rlvr.tasks.countdown import Countdown  # noqa: E402

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


def run_ours(model, ids, mask, length, pad_id, engine="eager"):
    seeds = torch.arange(len(ids))
    return lambda: generate(model, ids, mask, seeds, max_new_tokens=length, eos_id=NO_EOS, pad_id=pad_id,
                            engine=engine)


def run_hf(model, ids, mask, length, pad_id):
    def fn():
        with torch.no_grad():
            model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=length, min_new_tokens=length,
                           do_sample=True, temperature=1.0, top_k=0, top_p=1.0, pad_token_id=pad_id,
                           eos_token_id=None)
    return fn


ENGINE_NAMES = {"eager": "rlvr", "cpp": "rlvr C++"}


def _prepare(engines) -> list[str]:
    """Build the C++ engine once (printing how long that took); drop `cpp` when the
    extension cannot be built here (the library then falls back to eager, which would be measured
    twice under two names)."""
    ready = []
    for engine in engines:
        if engine == "cpp":
            from rlvr.kernels import native
            t0 = time.perf_counter()
            if native.load() is None:
                continue
            print(f"# C++ decode engine build/load: {time.perf_counter() - t0:.1f} s wall")
        ready.append(engine)
    return ready


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16, 64, 256])
    p.add_argument("--lengths", type=int, nargs="+", default=[16, 32, 64, 128])
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--engines", nargs="+", default=["eager", "cpp"], choices=list(ENGINE_NAMES),
                   help="decode engines to time (the first is the baseline of the ratio columns)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"# load before: {os.getloadavg()}  threads={args.threads}  torch {torch.__version__}")
    model, tok = load_causal_lm("rlvr:countdown-warmstart", seed=0)
    model.eval()
    n_params = param_count(model)
    examples = Countdown().sample(max(args.batches), random.Random(0))
    engines = _prepare(args.engines)
    base, others = engines[0], engines[1:]
    head = f" {ENGINE_NAMES[base]} tok/s |" + "".join(
        f" {ENGINE_NAMES[e]} tok/s | {e} speed-up over {base} |" for e in others)
    print(f"\n| batch | new tokens |{head} model.generate tok/s | {base}/generate |\n"
          f"|---|---|---|{'---|---|' * len(others)}---|---|")
    rows = []
    for batch in args.batches:
        ids, mask = encode_prompts(tok, [ex.prompt for ex in examples[:batch]])
        for length in args.lengths:
            # Engines and generate interleaved per cell, so load changes hit them alike.
            times = {e: _best(run_ours(model, ids, mask, length, tok.pad_token_id, engine=e), args.repeats)
                     for e in engines}
            hf = _best(run_hf(model, ids, mask, length, tok.pad_token_id), args.repeats)
            tokens = batch * length
            rows.append((batch, length, float(mask.sum()) / batch, times, hf))
            cells = f" {tokens / times[base][0]:,.0f} |" + "".join(
                f" {tokens / times[e][0]:,.0f} | {times[base][0] / times[e][0]:.2f}× |" for e in others)
            print(f"| {batch} | {length} |{cells} {tokens / hf[0]:,.0f} | {hf[0] / times[base][0]:.1f}× |",
                  flush=True)

    print(f"\n# load after: {os.getloadavg()}")
    print(f"\nroofline ({n_params:,} parameters, {args.threads} threads):")
    print("share = achieved / matmul rate; wall time, and (CPU) process CPU time")
    names = [ENGINE_NAMES[e] for e in engines] + ["generate"]
    print("| batch | new tokens | matmul GFLOP/s at rows=batch |"
          + "".join(f" {n} share | {n} share (CPU) |" for n in names))
    print("|---|---|---|" + "---|---|" * len(names))
    for batch, length, prompt_len, times, hf in rows:
        if (batch, length) != (64, 32) and len(rows) > 1:
            continue
        peak = matmul_gflops(model.config, batch)
        prefill = (2 * n_params + attention_flops_per_token(model.config, prompt_len / 2)) * prompt_len
        decode = (2 * n_params + attention_flops_per_token(model.config, prompt_len + length / 2)) * length
        flops = batch * (prefill + decode)
        cells = "".join(f" {flops / t[0] / 1e9 / peak:.0%} | {flops / t[1] / 1e9 / peak:.0%} |"
                        for t in [times[e] for e in engines] + [hf])
        print(f"| {batch} | {length} | {peak:.0f} |{cells}")


if __name__ == "__main__":
    main()
