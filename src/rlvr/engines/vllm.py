"""vLLM as the rollout engine (`rollout.engine=vllm`, the `vllm` extra); the one module that imports vllm.

`VLLMEngine` implements `rlvr.protocols.WeightSyncEngine`: token ids in and out (vLLM never sees
text: `skip_tokenizer_init`), the sampled tokens' behaviour log-probs, one seed per row, greedy
at temperature 0, and the same `Rollouts` the torch sampler returns. The engine runs in the
trainer's process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, the `uni` executor) and holds its own copy
of the weights; `push_weights` replaces them in place through the worker's `reload_weights`
(no disk). Every call starts from an empty prefix cache (blocks are still shared within a call,
e.g. by a group's copies of one prompt): a call's samples then depend on the weights, prompts
and seeds only, never on the calls before it, so the asynchronous loop, which runs evaluation
and rollouts in either order, samples what the synchronous loop does; and no block computed
with old weights outlives a push.

What differs from the torch sampler, by design of vLLM:
- Samples: vLLM's own seeded sampler, so the same seed gives another completion than rlvr's
  Gumbel-max sampler (the same one every time for a given seed).
- Log-probs: `logprobs_mode="processed_logprobs"`, i.e. of the distribution sampled from
  (after the repetition penalty and temperature; with top_p < 1 after the nucleus cut, where the
  torch sampler records the values before both), as TRL does with vLLM. Without a penalty or a
  cut the trainer's recomputed log-probs differ by float rounding; the rollout correction (on by
  default for this engine) reweights what is left and the loop logs the gap.
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
import warnings
from collections.abc import Iterable
from pathlib import Path

import torch

from rlvr.batch import Rollouts
from rlvr.errors import ConfigError


def _import_vllm():
    # In-process engine: no engine-core process, and the weight push hands tensors over directly (across
    # processes vLLM's RPC would turn them into lists). vLLM reads the variable when it builds an engine.
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    try:
        import vllm
    except ImportError:
        raise ConfigError("rollout.engine: vllm is not installed; pip install 'rlvr[vllm]' (CPU) or vllm "
                          "(CUDA), or set rollout.engine=torch") from None
    return vllm


def save_for_engine(named_tensors: Iterable[tuple[str, torch.Tensor]], hf_config, directory: Path) -> Path:
    """Write `hf_config` and the weights as a checkpoint vLLM can load (no tokenizer: ids only)."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    hf_config.save_pretrained(directory)
    save_file({name: t.detach().to("cpu").contiguous() for name, t in named_tensors},
              str(directory / "model.safetensors"))
    return directory


def _reload_weights(worker, weights: list[tuple[str, torch.Tensor]]) -> None:
    """Runs on the vLLM worker: load `weights` in place, then refresh a tied output head."""
    worker.reload_weights(weights_iterator=weights)
    _refresh_tied_head(worker.model_runner.get_model(), worker.model_runner.model_config)


def _refresh_tied_head(model, model_config) -> None:
    """A tied `lm_head` has no weight of its own in the checkpoint, so vLLM's reloads skip the head
    ("ParallelLMHead: Failed to load weights") and never re-run its post-load step; on CPU that
    step packs the (new) embedding matrix into the head's GEMM kernel, so without it a tied model
    samples with the new body and the old head."""
    head = getattr(model, "lm_head", None)
    method = getattr(head, "quant_method", None)
    if getattr(model_config.hf_config, "tie_word_embeddings", False) and method is not None:
        method.process_weights_after_loading(head)


SHM_BACKEND = "rlvr_shm"


def register_shm_backend() -> None:
    """Register the `rlvr_shm` weight-transfer backend with vLLM's four-phase update protocol (run in a
    vLLM server's worker by `engines.vllm_ext`): each `/update_weights` names one bucket, a
    safetensors file of HF-named tensors on /dev/shm, loaded with the model's `load_weights` inside
    vLLM's layerwise reload. vLLM's own backends (NCCL, CUDA IPC) need a GPU; this one runs on a CPU."""
    from dataclasses import dataclass

    from safetensors.torch import load_file
    from vllm.distributed.weight_transfer import base
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory
    from vllm.model_executor.model_loader.reload import layerwise

    @dataclass
    class ShmInitInfo(base.WeightTransferInitInfo):
        pass

    @dataclass
    class ShmUpdateInfo(base.WeightTransferUpdateInfo):
        path: str

    class ShmEngine(base.WeightTransferEngine):
        init_info_cls, update_info_cls = ShmInitInfo, ShmUpdateInfo

        def init_transfer_engine(self, init_info) -> None:
            pass

        def start_weight_update(self) -> None:
            layerwise.initialize_layerwise_reload(self.model)

        def receive_weights(self, update_info) -> None:
            self.model.load_weights(list(load_file(update_info.path).items()))

        def finish_weight_update(self) -> None:
            layerwise.finalize_layerwise_reload(self.model, self.model_config)
            _refresh_tied_head(self.model, self.model_config)

        def shutdown(self) -> None:
            pass

    if SHM_BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(SHM_BACKEND, ShmEngine)


@contextlib.contextmanager
def _process_threads_kept():
    """vLLM's in-process CPU worker replaces `torch.set_num_threads` with a no-op for the whole
    process and binds the CPU affinity; the trainer's thread budget (`trainer.threads`) must keep
    working beside it, so both are put back once the engine is up."""
    set_num_threads, threads = torch.set_num_threads, torch.get_num_threads()
    affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    try:
        yield
    finally:
        torch.set_num_threads = set_num_threads
        torch.set_num_threads(threads)
        if affinity is not None:
            os.sched_setaffinity(0, affinity)


def group_runs(prompts: list[list[int]], seeds: list[int], temperatures: list[float]) -> list[tuple[int, int]]:
    """(first row, count) of each run of rows that one request with `n = count` samples exactly:
    the same prompt and temperature, seeds s, s+1, ... vLLM gives the i-th of a request's n
    completions the seed `seed + i`, so the run's samples are those of its rows sent one by one.
    A group's rows (one prompt, consecutive seeds from `collect.sample_seeds`) are one request."""
    runs: list[tuple[int, int]] = []
    for i, (prompt, seed, temperature) in enumerate(zip(prompts, seeds, temperatures)):
        if runs:
            start, count = runs[-1]
            if (prompts[start] == prompt and temperatures[start] == temperature and seeds[start] + count == seed):
                runs[-1] = (start, count + 1)
                continue
        runs.append((i, 1))
    return runs


def cache_shortfall(rows: int, blocks: int, blocks_per_row: int, kv_cache_mb: int) -> tuple[int, int] | None:
    """(rows held at once, MiB that would hold all `rows`) when a KV cache of `blocks` blocks in
    `kv_cache_mb` MiB holds fewer than `rows` sequences of `blocks_per_row` blocks each, else None.
    vLLM keeps one block back (its null block) and starts the rows it cannot hold only when
    others finish, so the call then takes several rounds of decode steps."""
    held = (blocks - 1) // blocks_per_row
    if held >= rows:
        return None
    return held, math.ceil((rows * blocks_per_row + 1) * kv_cache_mb / blocks)


class VLLMEngine:
    """A vLLM `LLM` started from the trainer's weights. `engine(prompt_ids, prompt_mask, seeds, *,
    temperature) -> Rollouts`; `push_weights(named_tensors, version)` after each update. `rows`: the
    rows a step samples, to warn when the KV cache cannot hold them at once (0: no check)."""

    def __init__(self, named_tensors: Iterable[tuple[str, torch.Tensor]], hf_config, *, max_new_tokens: int,
                 eos_id: int, pad_id: int, top_p: float = 1.0, top_k: int = 0, min_p: float = 0.0,
                 repetition_penalty: float = 1.0, dtype: str = "float32",
                 kv_cache_mb: int = 64, block_size: int = 0, max_model_len: int = 0, seed: int = 0, rows: int = 0):
        vllm = _import_vllm()
        self._sampling_params = vllm.SamplingParams
        self.max_new_tokens, self.eos_id, self.pad_id, self.top_p = max_new_tokens, eos_id, pad_id, top_p
        self.top_k, self.min_p = top_k, min_p  # vLLM's own: 0 = off for both
        # vLLM's counts the prompt's tokens and the output's, as the torch sampler's does; 1 = off
        self.repetition_penalty = repetition_penalty
        self.policy_version = 0
        self._dir = tempfile.TemporaryDirectory(prefix="rlvr-vllm-")
        path = save_for_engine(named_tensors, hf_config, Path(self._dir.name))
        options = {"block_size": block_size} if block_size else {}
        if max_model_len:
            options["max_model_len"] = max_model_len
        with _process_threads_kept():
            self.llm = vllm.LLM(
                model=str(path), skip_tokenizer_init=True, dtype=dtype, seed=seed, enforce_eager=True,
                distributed_executor_backend="uni", kv_cache_memory_bytes=kv_cache_mb << 20,
                logprobs_mode="processed_logprobs", generation_config="vllm", **options)
        self._warn_if_cache_short(rows, kv_cache_mb)

    def _warn_if_cache_short(self, rows: int, kv_cache_mb: int) -> None:
        """One line when the KV cache cannot hold the `rows` a step samples at the longest length
        (measured at 10.7M parameters: 64 MiB held 24 of 128 rows, and the call took 2.1x as long)."""
        config = self.llm.llm_engine.engine_core.engine_core.vllm_config
        cache = config.cache_config
        per_row = -(-config.model_config.max_model_len // cache.block_size)
        short = cache_shortfall(rows, cache.num_gpu_blocks, per_row, kv_cache_mb) if rows else None
        if short is not None:
            warnings.warn(f"rollout.vllm_kv_cache_mb={kv_cache_mb} holds {short[0]} of the {rows} rows a step samples "
                          f"({config.model_config.max_model_len} tokens each), so vLLM samples them in turns; "
                          f"set rollout.vllm_kv_cache_mb={short[1]} (or a smaller rollout.vllm_max_model_len)",
                          stacklevel=3)

    def __call__(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, seeds: torch.Tensor, *,
                 temperature: float | torch.Tensor) -> Rollouts:
        rows = len(prompt_ids)
        temps = temperature.tolist() if isinstance(temperature, torch.Tensor) else [float(temperature)] * rows
        # one tolist() per tensor: a bool-index and a tolist() per row cost ~10 us each (128 rows: 1 ms)
        prompts = [[t for t, m in zip(ids, keep) if m] for ids, keep in zip(prompt_ids.tolist(), prompt_mask.tolist())]
        runs = group_runs(prompts, seeds.tolist(), temps)
        requests = [{"prompt_token_ids": prompts[start]} for start, _ in runs]
        params = [self._params(temps[start], int(seeds[start]), n) for start, n in runs]
        self.llm.reset_prefix_cache()  # a reused block may round differently from a recomputed one
        outputs = self.llm.generate(requests, params, use_tqdm=False) if rows else []
        completions = [c for out in outputs for c in sorted(out.outputs, key=lambda c: c.index)]
        ids, mask, logprobs = self._padded(completions)
        truncated = torch.tensor([c.finish_reason == "length" for c in completions], dtype=torch.bool)
        return Rollouts(prompt_ids, prompt_mask, ids, mask, logprobs, truncated.view(rows))

    def _padded(self, completions) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(ids, mask, log-probs) (B, longest) of vLLM's completions, right-padded: each filled from
        one flat list (row-major, as a boolean mask selects), not a tensor per row (~3 ms at 128)."""
        tokens = [list(c.token_ids) for c in completions]
        lengths = torch.tensor([len(t) for t in tokens], dtype=torch.long)
        width = int(lengths.max()) if len(tokens) else 0
        mask = torch.arange(width)[None, :] < lengths[:, None]
        ids = torch.full((len(tokens), width), self.pad_id, dtype=torch.long)
        logprobs = torch.zeros((len(tokens), width))
        ids[mask] = torch.tensor([t for row in tokens for t in row], dtype=torch.long)
        logprobs[mask] = torch.tensor([step[t].logprob for c, row in zip(completions, tokens)
                                       for step, t in zip(c.logprobs, row)])
        return ids, mask.float(), logprobs

    def _params(self, temperature: float, seed: int, n: int = 1):
        # stop_token_ids: without a tokenizer vLLM knows no EOS; the stop token stays in token_ids.
        # Greedy is the model's own argmax, as in the torch sampler: no truncation, no penalty.
        sampled = temperature > 0
        return self._sampling_params(n=n, temperature=temperature, top_p=self.top_p if sampled else 1.0,
                                     top_k=self.top_k if sampled else 0, min_p=self.min_p if sampled else 0.0,
                                     repetition_penalty=self.repetition_penalty if sampled else 1.0,
                                     max_tokens=self.max_new_tokens, seed=seed, logprobs=0,
                                     stop_token_ids=[self.eos_id], detokenize=False)

    def push_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Load `named_tensors` (HF names) into the running model (the next call drops cached prefixes)."""
        weights = [(name, t.detach()) for name, t in named_tensors]
        self.llm.collective_rpc(_reload_weights, args=(weights,))
        self.policy_version = version

    def close(self) -> None:
        """Shut the engine down now. vLLM's shutdown also tears down the process's distributed
        state, which every vLLM engine of the process shares, so an engine left to the garbage
        collector would break the one started after it whenever it is collected."""
        self.llm.llm_engine.engine_core.shutdown()  # idempotent: vLLM's finalizer is detached
        self._dir.cleanup()
