"""Weight sync per step: seconds and bytes, in-process vLLM vs a vLLM server, full weights vs LoRA.

    pip install -e ".[vllm,lora]"
    python bench/weight_sync.py --sizes 1m 10m --pushes 5
    python bench/weight_sync.py --sizes 120m --pushes 3      # ~0.45 GB per copy: three copies in memory

For each model size (tiny Llamas built here, fp32, tied head: 1.06M, 10.7M, 113M parameters) it
starts the in-process engine (`rollout.engine=vllm`) and one server (`rollout.engine=vllm_server`,
LoRA enabled, rank 8 on every linear layer) and pushes `--pushes` times each of:

- `in-process full`: every weight through the worker's in-place `reload_weights` (no disk);
- `server full`: every weight through vLLM's weight-update protocol, `--bucket-mb` safetensors
  buckets on /dev/shm (`engines.vllm_ext`);
- `server merged (LoRA)`: the LoRA model's adapters folded in (fp32), then as `server full`;
- `server adapter (LoRA)`: the adapter alone, loaded as a vLLM LoRA adapter (no merge).

Each push carries new values (the weights are perturbed between pushes), and a push is timed
from the trainer's call to its return (the server has loaded it). Medians over the pushes; the
ratio column is against `in-process full` at the same size, measured in the same run. The machine
these numbers come from is shared and loaded: read the ratios, not the seconds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

SIZES = {"1m": dict(hidden_size=128, num_layers=4, num_heads=4, intermediate_size=512),
         "10m": dict(hidden_size=320, num_layers=8, num_heads=5, intermediate_size=960),
         "120m": dict(hidden_size=768, num_layers=16, num_heads=12, intermediate_size=2048)}


def timed_pushes(push, tensors_for, pushes: int) -> tuple[float, int]:
    """(median seconds, bytes) of `pushes` calls `push(tensors, version)` with fresh tensors each."""
    seconds, nbytes = [], 0
    for version in range(1, pushes + 1):
        tensors = tensors_for(version)
        nbytes = sum(t.numel() * t.element_size() for _, t in tensors)
        t0 = time.perf_counter()
        push(tensors, version)
        seconds.append(time.perf_counter() - t0)
    return statistics.median(seconds), nbytes


def perturbed(model, version: int) -> list[tuple[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(version)
    return [(n, p.detach() + 1e-3 * torch.randn(p.shape, generator=generator)) for n, p in model.named_parameters()]


def bench_size(name: str, pushes: int, bucket_mb: int, kv_cache_mb: int) -> list[tuple]:
    from rlvr.engines.server_fleet import ServerOptions
    from rlvr.engines.vllm import VLLMEngine
    from rlvr.engines.vllm_server import ServerEngine
    from rlvr.models.causal_lm import tiny_llama
    from rlvr.models.lora import adapter_weights, apply_lora, base_weights, merged_weights
    from rlvr.models.tokenizer import char_tokenizer

    tokenizer = char_tokenizer()
    model = tiny_llama(len(tokenizer), max_seq_len=64, seed=0, **SIZES[name])
    params = sum(p.numel() for p in model.parameters())
    common = dict(max_new_tokens=8, eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id)
    rows = []
    local = VLLMEngine(list(model.named_parameters()), model.config, kv_cache_mb=kv_cache_mb, max_model_len=64,
                       **common)
    try:
        rows.append(("in-process full", *timed_pushes(local.push_weights, lambda v: perturbed(model, v), pushes)))
    finally:
        local.close()
    lora = apply_lora(tiny_llama(len(tokenizer), max_seq_len=64, seed=0, **SIZES[name]), r=8, alpha=16, dropout=0.0,
                      target_modules="all-linear")
    adapters = [p for p in lora.parameters() if p.requires_grad]

    def moved_adapter(version: int):
        with torch.no_grad():
            for p in adapters:
                p.add_(1e-3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(version)))
        return adapter_weights(lora)

    server = ServerEngine(base_weights(lora), model.config, bucket_mb=bucket_mb, on_crash="fail",
                          options=ServerOptions(kv_cache_mb=kv_cache_mb, max_model_len=64, lora_rank=8),
                          lora_config=lora.peft_config["default"], **common)
    try:
        rows.append(("server full", *timed_pushes(server.push_weights, lambda v: perturbed(model, v), pushes)))
        offset = pushes  # versions keep growing: each adapter is a new one

        def merged_push(tensors, version):
            server.push_weights(merged_weights(lora), offset + version)

        rows.append(("server merged (LoRA)", *timed_pushes(merged_push, moved_adapter, pushes)))
        rows[-1] = (rows[-1][0], rows[-1][1], sum(t.numel() * t.element_size() for _, t in merged_weights(lora)))
        rows.append(("server adapter (LoRA)",
                     *timed_pushes(lambda t, v: server.push_weights(t, 2 * offset + v), moved_adapter, pushes)))
    finally:
        server.close()
    return [(name, params, *row) for row in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["1m", "10m"], choices=list(SIZES))
    parser.add_argument("--pushes", type=int, default=5)
    parser.add_argument("--bucket-mb", type=int, default=64)
    parser.add_argument("--kv-cache-mb", type=int, default=16)
    args = parser.parse_args()
    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    results = [row for size in args.sizes for row in bench_size(size, args.pushes, args.bucket_mb, args.kv_cache_mb)]
    print(f"{'size':>5} {'params':>9} {'path':<22} {'MB/sync':>9} {'s/sync':>8} {'vs in-process':>13}")
    base = {r[0]: r[3] for r in results if r[2] == "in-process full"}
    for size, params, path, seconds, nbytes in results:
        print(f"{size:>5} {params / 1e6:>8.2f}M {path:<22} {nbytes / 2**20:>9.2f} {seconds:>8.3f} "
              f"{seconds / base[size]:>12.2f}x")


if __name__ == "__main__":
    main()
