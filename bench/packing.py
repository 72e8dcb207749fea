"""Padded vs packed vs packed + shared prompts: one training forward + backward of a GRPO-shaped batch.

    python bench/packing.py                                   # 120M: Qwen2.5-0.5B's layer shape, 8 layers
    python bench/packing.py --layers 2 --width 128 --prompts 2 --group 4    # a quick look

The model is a random Qwen2 with Qwen2.5-0.5B's layer shape (width 896, MLP 4864, 14 heads, 2 KV
heads; `--layers` of its 24) over the 512-token BPE tokenizer trained on the project's task text
(tests/models/_archs.py); the prompts are the GSM8K fixture's questions through the tokenizer's chat
template (42 tokens on average with this tokenizer, no system prompt); each group's G completions have lengths spread
geometrically from `--min-len` to `--max-len` (shuffled within the group), random token ids: the
length spread of real RL completions, which the padded forward pays for as its longest row.

Each layout runs in its own process (peak RSS is the process's): `trainer.packing=padded`,
`packed` and `shared` of `CausalPolicy` (the Llama fast path off). The step is Σ log-probs over
the completion tokens, forward + backward, timed after one warm-up step (CPU seconds of the
process, with `--threads` torch threads: on a loaded machine wall time means little).
Prints a table; the log-probs of each layout are checked against the padded ones.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "models"))
sys.path.insert(0, str(ROOT / "src"))

from _archs import QWEN2_05B, bpe_tokenizer, model_config  # noqa: E402

LAYOUTS = ("padded", "packed", "shared")


def spread_lengths(group: int, low: int, high: int, gen: torch.Generator) -> list[int]:
    """`group` completion lengths geometrically spaced from `low` to `high`, in a random order."""
    ratio = (high / low) ** (1 / max(group - 1, 1))
    lengths = [round(low * ratio ** i) for i in range(group)]
    return [lengths[i] for i in torch.randperm(group, generator=gen).tolist()]


def make_batch(tokenizer, args):
    """(prompt ids, prompt mask (left-padded), completion ids, completion mask), P·G rows."""
    fixture = (ROOT / "data" / "gsm8k_fixture.jsonl").read_text().splitlines()
    questions = [json.loads(line)["question"] for line in fixture]
    gen = torch.Generator().manual_seed(args.seed)
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": questions[i % len(questions)]}],
                                             add_generation_prompt=True, tokenize=True) for i in range(args.prompts)]
    prompts = [list(p["input_ids"]) if isinstance(p, dict) or hasattr(p, "keys") else list(p) for p in prompts]
    width = max(len(p) for p in prompts)
    rows = args.prompts * args.group
    prompt_ids, prompt_mask = torch.zeros(rows, width, dtype=torch.long), torch.zeros(rows, width, dtype=torch.long)
    lengths = []
    for i, p in enumerate(prompts):
        prompt_ids[i * args.group:(i + 1) * args.group, width - len(p):] = torch.tensor(p)
        prompt_mask[i * args.group:(i + 1) * args.group, width - len(p):] = 1
        lengths += spread_lengths(args.group, args.min_len, args.max_len, gen)
    lengths = torch.tensor(lengths)
    completion_mask = (torch.arange(int(lengths.max()))[None] < lengths[:, None]).long()
    completion_ids = torch.randint(5, len(tokenizer), completion_mask.shape, generator=gen) * completion_mask
    return prompt_ids, prompt_mask, completion_ids, completion_mask


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def child(args) -> None:
    """One layout: build, warm up, time one forward + backward; JSON on stdout, log-probs to --out."""
    from rlvr.models import packing
    from rlvr.models.policy import CausalPolicy

    torch.set_num_threads(args.threads)
    tokenizer = bpe_tokenizer()
    shape = {**QWEN2_05B, "num_hidden_layers": args.layers}
    if args.width:
        shape.update(hidden_size=args.width, intermediate_size=4 * args.width,
                     num_attention_heads=max(2, args.width // 64), num_key_value_heads=2)
    torch.manual_seed(0)
    import transformers

    config = model_config("qwen2", len(tokenizer), **shape)
    config._attn_implementation = "sdpa"
    model = transformers.AutoModelForCausalLM.from_config(config).to(getattr(torch, args.dtype))
    if args.lora:
        from rlvr.models.lora import apply_lora

        model = apply_lora(model, r=args.lora, alpha=2 * args.lora, dropout=0.0, target_modules="all-linear")
    model.train()
    mode = None if args.layout == "padded" else args.layout
    reason = mode and packing.prepare(model, mode)  # the probe (`trainer.packing`), here past the fast path
    if reason:
        raise SystemExit(f"{args.layout}: the model did not pass the packing probe: {reason}")
    policy = CausalPolicy(model, fast=False, packing=mode)
    batch = make_batch(tokenizer, args)

    def step():
        logp, _ = policy.token_logprobs(*batch[:3], completion_mask=batch[3])
        (logp * batch[3]).sum().backward()
        model.zero_grad(set_to_none=True)
        return logp.detach()

    step()  # warm-up
    before = rss_mb()
    t0, w0 = time.process_time(), time.perf_counter()
    logp = step()
    cpu, wall = time.process_time() - t0, time.perf_counter() - w0
    torch.save(logp * batch[3], args.out)
    prompt_ids, prompt_mask, completion_ids, completion_mask = batch
    real = int(prompt_mask.sum() + completion_mask.sum())
    print(json.dumps({"layout": args.layout, "cpu_s": cpu, "wall_s": wall, "real_tokens": real,
                      "padded_positions": prompt_ids.numel() + completion_ids.numel(),
                      "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "before_mb": before,
                      "params_m": sum(p.numel() for p in model.parameters()) / 1e6}))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--width", type=int, default=0, help="hidden size in place of 896 (MLP 4x), 0 = Qwen2.5-0.5B's")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--min-len", type=int, default=12)
    p.add_argument("--max-len", type=int, default=128)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--lora", type=int, default=0, help="LoRA rank on every linear layer (0 = full)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layout", default="", help=argparse.SUPPRESS)
    p.add_argument("--out", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.layout:
        return child(args)
    rows, reference = [], None
    with tempfile.TemporaryDirectory() as tmp:
        for layout in LAYOUTS:
            out = Path(tmp) / f"{layout}.pt"
            cmd = [sys.executable, __file__, *(argv if argv is not None else sys.argv[1:]), "--layout", layout,
                   "--out", str(out)]
            env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
            done = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if done.returncode:
                raise SystemExit(f"{layout} failed:\n{done.stderr[-2000:]}")
            row = json.loads(done.stdout.strip().splitlines()[-1])
            logp = torch.load(out)
            reference = logp if reference is None else reference
            row["logp_rel"] = float((logp - reference).abs().max() / reference.abs().max())
            rows.append(row)
    first = rows[0]
    weights = f"LoRA r={args.lora}" if args.lora else "full"
    print(f"Qwen2 {first['params_m']:.1f}M params, {args.dtype}, {weights}; "
          f"{args.prompts} prompts x {args.group} completions of {args.min_len}-{args.max_len} tokens; "
          f"{first['real_tokens']} real tokens in {first['padded_positions']} padded positions "
          f"({1 - first['real_tokens'] / first['padded_positions']:.0%} padding); {args.threads} thread(s)")
    print("| layout | fwd+bwd CPU s | wall s | real tokens / CPU s | speed-up | peak RSS MB (step's growth) "
          "| logp vs padded |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['layout']} | {r['cpu_s']:.2f} | {r['wall_s']:.2f} | {r['real_tokens'] / r['cpu_s']:.0f} | "
              f"{first['cpu_s'] / r['cpu_s']:.2f}x | {r['peak_mb']:.0f} (+{r['peak_mb'] - r['before_mb']:.0f}) | "
              f"{r['logp_rel']:.1e} |")
    assert all(math.isfinite(r["logp_rel"]) and r["logp_rel"] < 1e-3 for r in rows), "a layout disagrees"


if __name__ == "__main__":
    main()
