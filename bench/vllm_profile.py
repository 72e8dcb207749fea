"""Where the vLLM rollout engine's time goes, against rlvr's own sampler on the same batch.

    pip install -e ".[vllm,bench]"
    python bench/vllm_profile.py --repeats 5 --threads 1
    python bench/vllm_profile.py --repeats 3 --scale 10 --kv-cache-mb 331   # a cache that holds the 128 rows

The batch is the one `bench/vs_trl.py --engine vllm` samples at its first step: the same model (the
packaged 1.06M-parameter Countdown warm start; `--scale 10` the 10.7M one), P prompts x G rows with
the trainer's seeds (`collect.sample_seeds`), temperature 1, <= `--max-new-tokens` tokens. rlvr's
`VLLMEngine` (one request per group, `n = G`) and its own sampler (`rollout.decode_engine=cpp`,
C++ decode loop) run it in turn in this process, after one warm-up call each, `--repeats` times.

The engine call's wall time is split by wrapping the methods vLLM 0.32's in-process engine runs
(`time.perf_counter` around each; nested parts are listed under their parent, and each parent's
remainder is its own Python work): rlvr's wrapper before and after `LLM.generate` (request
building, seeds, conversion of the outputs to token tensors), vLLM's input processing
(`_add_completion_requests`), per engine step the scheduler (`schedule`, `update_from_output`),
the model runner's state update, input preparation and attention metadata, the model's forward
(`_model_forward`: the torch ops of the layers) and LM head (`compute_logits`), sampling
(`_sample`) and its bookkeeping, and the output processor (Python `RequestOutput`s with
per-token log-prob dicts). ms/step divides by the number of model-runner steps (1 prefill +
decode steps). Medians over the repeats. Also printed: the KV cache's blocks and the tokens vLLM
puts through the model at each step (fewer rows than the batch's when the cache cannot hold them).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vs_trl import WARM_START, large_model, prompt_stream, rlvr_config  # noqa: E402

from rlvr.builder.build import build_engine  # noqa: E402
from rlvr.builder.components import build_components  # noqa: E402
from rlvr.codec import encode_prompts  # noqa: E402
from rlvr.runtime.process import configure_for  # noqa: E402
from rlvr.trainer.collect import sample_seeds  # noqa: E402


class Clock:
    """Wall time per name, summed over the calls since the last `reset`, and the call counts."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self.first: dict[str, float] = {}  # each name's first call since the reset (the prefill step's)
        self.scheduled: list[int] = []  # tokens through the model per step (prompt tokens in the prefill)

    def reset(self) -> None:
        self.seconds.clear()
        self.calls.clear()
        self.first.clear()
        self.scheduled.clear()

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds
        self.calls[name] = self.calls.get(name, 0) + 1
        self.first.setdefault(name, seconds)

    def wrap(self, owner, attribute: str, name: str, observe=None) -> None:
        """Replace `owner.attribute` (a bound method: the instance attribute shadows the class's)
        by a timed call of the original; `observe(result)` sees what each call returns."""
        original = getattr(owner, attribute)

        @functools.wraps(original)
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                result = original(*args, **kwargs)
            finally:
                self.add(name, time.perf_counter() - t0)
            if observe is not None:
                observe(result)
            return result

        setattr(owner, attribute, timed)


# (name, parent, what it is): the rows of the table, parents before their parts
PARTS = [
    ("engine call", None, "rlvr's `VLLMEngine.__call__`, whole"),
    ("rlvr: before generate", "engine call", "prompts to lists, `group_runs`, `SamplingParams`"),
    ("reset_prefix_cache", "engine call", "once per call"),
    ("LLM.generate", "engine call", "vLLM, whole"),
    ("input processing", "LLM.generate", "`_add_completion_requests`: request objects, n=G fan-out"),
    ("LLMEngine.step", "LLM.generate", "one per engine step"),
    ("EngineCore.step", "LLMEngine.step", "schedule, execute, update"),
    ("scheduler.schedule", "EngineCore.step", ""),
    ("runner.execute_model", "EngineCore.step", ""),
    ("runner._update_states", "runner.execute_model", "the persistent batch"),
    ("runner._prepare_inputs", "runner.execute_model", "positions, slot mapping, token ids"),
    ("runner._build_attention_metadata", "runner.execute_model", ""),
    ("runner._preprocess", "runner.execute_model", ""),
    ("model forward", "runner.execute_model", "`_model_forward`: the layers' torch ops"),
    ("LM head", "runner.execute_model", "`compute_logits`"),
    ("runner.sample_tokens", "EngineCore.step", ""),
    ("sampler", "runner.sample_tokens", "`_sample`: temperature, seeded draw, log-probs"),
    ("runner._bookkeeping_sync", "runner.sample_tokens", "sampled ids to Python lists"),
    ("scheduler.update_from_output", "EngineCore.step", "per-request output objects"),
    ("output processing", "LLMEngine.step", "`process_outputs`: RequestOutputs, log-prob dicts"),
    ("rlvr: after generate", "engine call", "outputs to token, log-prob, mask tensors"),
]


STEP_PARTS = ("EngineCore.step", "model forward")  # also shown for the first (prefill) step alone


def instrument(engine, clock: Clock) -> None:
    """Wrap the engine's and vLLM's methods named in PARTS (the in-process `uni` executor)."""
    llm = engine.llm
    core = llm.llm_engine.engine_core.engine_core
    runner = core.model_executor.driver_worker.worker.model_runner
    clock.wrap(llm, "reset_prefix_cache", "reset_prefix_cache")
    clock.wrap(llm, "generate", "LLM.generate")
    clock.wrap(llm, "_add_completion_requests", "input processing")
    clock.wrap(llm.llm_engine, "step", "LLMEngine.step")
    clock.wrap(llm.llm_engine.output_processor, "process_outputs", "output processing")
    clock.wrap(core, "step_fn", "EngineCore.step")  # the client calls the step bound at start-up
    clock.wrap(core.scheduler, "schedule", "scheduler.schedule",
               lambda out: clock.scheduled.append(out.total_num_scheduled_tokens))
    clock.wrap(core.scheduler, "update_from_output", "scheduler.update_from_output")
    for method in ("execute_model", "_update_states", "_prepare_inputs", "_build_attention_metadata",
                   "_preprocess", "sample_tokens", "_bookkeeping_sync"):
        clock.wrap(runner, method, f"runner.{method}")
    clock.wrap(runner, "_model_forward", "model forward")
    clock.wrap(runner, "_sample", "sampler")
    clock.wrap(runner.model, "compute_logits", "LM head")


def timed_call(engine, clock: Clock, batch):
    """One engine call's rollouts; its wall time and rlvr's parts around `LLM.generate` into `clock`."""
    generate = engine.llm.generate
    marks = {}

    def marked(*args, **kwargs):
        marks["start"] = time.perf_counter()
        try:
            return generate(*args, **kwargs)
        finally:
            marks["end"] = time.perf_counter()

    engine.llm.generate = marked
    try:
        t0 = time.perf_counter()
        out = engine(*batch[:3], temperature=batch[3])
        t1 = time.perf_counter()
    finally:
        engine.llm.generate = generate
    clock.add("engine call", t1 - t0)
    clock.add("rlvr: before generate", marks["start"] - t0 - clock.seconds.get("reset_prefix_cache", 0.0))
    clock.add("rlvr: after generate", t1 - marks["end"])
    return out


def the_batch(args, c):
    """The first step's rows: the prompts rlvr's trainer draws, G copies each, the trainer's seeds."""
    examples = prompt_stream(c, 1, args.prompts)
    group = [ex for ex in examples for _ in range(args.group)]
    ids, mask = encode_prompts(c.rollout.tokenizer, [ex.prompt for ex in group])
    return ids, mask, sample_seeds(c.plan.rollout.seed, 1, len(group)), 1.0


@contextmanager
def model_path(args):
    with tempfile.TemporaryDirectory() as scratch:
        args.model_path = WARM_START if args.scale == 1 else large_model(scratch)
        yield


def profile(args) -> dict:
    """Per repeat: the parts' seconds (vLLM), the model-runner steps, and the own sampler's seconds."""
    config = rlvr_config(args, args.seed, "vllm")
    cache = {"vllm_block_size": args.block_size,
             "vllm_kv_cache_mb": args.kv_cache_mb or config.rollout.vllm_kv_cache_mb}
    config = dataclasses.replace(config, rollout=dataclasses.replace(config.rollout, **cache))
    c = build_components(config, runtime=configure_for(config))
    own = build_engine(rlvr_config(args, args.seed), c.learner.model, c.rollout.tokenizer)
    batch = the_batch(args, c)
    clock = Clock()
    instrument(c.rollout.engine, clock)
    vllm_runs, own_runs, tokens = [], [], {}
    for repeat in range(args.repeats + 1):  # the first of each: warm-up, not counted
        clock.reset()
        sampled = timed_call(c.rollout.engine, clock, batch)
        t0 = time.perf_counter()
        out = own(*batch[:3], temperature=batch[3])
        own_s = time.perf_counter() - t0
        if repeat:
            prefill = {f"{name}, prefill step": clock.first[name] for name in STEP_PARTS}
            vllm_runs.append(({**clock.seconds, **prefill}, clock.calls["runner.execute_model"]))
            scheduled = [n for n in clock.scheduled if n]
            own_runs.append(own_s)
            tokens = {"vLLM": int(sampled.lengths.sum()), "own sampler": int(out.lengths.sum())}
    ops = op_table(c.rollout.engine, clock, batch, args.ops) if args.ops else ""
    cache = cache_summary(c.rollout.engine, config)  # before the shutdown, which clears the block count
    c.rollout.engine.close()
    prompt_tokens = int(batch[1].sum()), int(batch[1][::args.group].sum())
    return {"vllm": vllm_runs, "own": own_runs, "tokens": tokens, "ops": ops, "scheduled": scheduled,
            "prompt_tokens": prompt_tokens, "cache": cache}


def cache_summary(engine, config) -> str:
    cache = engine.llm.llm_engine.engine_core.engine_core.vllm_config.cache_config
    return f"{config.rollout.vllm_kv_cache_mb} MiB KV cache: {cache.num_gpu_blocks} blocks of {cache.block_size} tokens"


def op_table(engine, clock: Clock, batch, rows: int) -> str:
    """One more engine call under torch.profiler: the `rows` torch ops with the most self CPU time."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        timed_call(engine, clock, batch)
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)


def table(result: dict) -> str:
    runs, own = result["vllm"], result["own"]
    steps = statistics.median(s for _, s in runs)
    total = statistics.median(p["engine call"] for p, _ in runs)
    lines = [f"| part | ms per call (median of {len(runs)}) | share of the call | ms per model step | what |",
             "|---|---|---|---|---|"]
    children: dict[str, list[str]] = {}
    for name, parent, _ in PARTS:
        children.setdefault(parent, []).append(name)
    depth = {None: -1}
    for name, parent, what in PARTS:
        depth[name] = depth[parent] + 1
        ms = 1e3 * statistics.median(p.get(name, 0.0) for p, _ in runs)
        lines.append(f"| {'&nbsp;&nbsp;' * depth[name]}{name} | {ms:.2f} | {ms / 1e3 / total:.0%} | "
                     f"{ms / steps:.3f} | {what} |")
        if name in children and parent is not None:  # the engine call's parts add up by construction
            rest = 1e3 * statistics.median(p.get(name, 0.0) - sum(p.get(k, 0.0) for k in children[name])
                                           for p, _ in runs)
            lines.append(f"| {'&nbsp;&nbsp;' * (depth[name] + 1)}rest of {name} | {rest:.2f} | "
                         f"{rest / 1e3 / total:.0%} | {rest / steps:.3f} | its own Python |")
    for name in STEP_PARTS:
        first = 1e3 * statistics.median(p[f"{name}, prefill step"] for p, _ in runs)
        rest = 1e3 * statistics.median(p[name] - p[f"{name}, prefill step"] for p, _ in runs) / (steps - 1)
        lines.append(f"\n{name}: prefill step {first:.2f} ms, decode steps {rest:.3f} ms each")
    rows, distinct = result["prompt_tokens"]
    lines.append(f"\nprompt tokens: {rows} in the rows' prompts, {distinct} in the distinct prompts; "
                 f"tokens through vLLM's model in its prefill step: {result['scheduled'][0]} "
                 f"({result['cache']}), then per decode step: {result['scheduled'][1:]}")
    own_s = statistics.median(own)
    tokens = ", ".join(f"{k} {n}" for k, n in result["tokens"].items())
    lines.append(f"\nmodel-runner steps per call: {steps:g} (1 prefill + decode steps); completion tokens: {tokens}"
                 f"\nrlvr's own sampler (cpp) on the same batch: {1e3 * own_s:.2f} ms; "
                 f"vLLM engine / own sampler: {total / own_s:.2f}x")
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--block-size", type=int, default=0, help="rollout.vllm_block_size (0: vLLM's default)")
    p.add_argument("--kv-cache-mb", type=int, default=0, help="rollout.vllm_kv_cache_mb (0: rlvr's default)")
    p.add_argument("--ops", type=int, default=0, help="also list the N torch ops with the most self time")
    p.add_argument("--scale", type=int, default=1, choices=[1, 10], help="as in vs_trl.py")
    args = p.parse_args(argv)
    # what rlvr_config reads besides the batch shape: vs_trl.py's defaults, rlvr's own sampler in C++
    args.engine, args.dtype, args.lora, args.reward, args.lr, args.steps = "cpp", "float32", 0, "task", 5e-5, 1
    args.thread_mode, args.kernels, args.vllm_kv_cache_mb = "auto", "cpp", 0
    torch.set_num_threads(args.threads)
    print(f"# load before: {os.getloadavg()}  threads={args.threads}  torch {torch.__version__}")
    with model_path(args):
        result = profile(args)
    print(f"# load after: {os.getloadavg()}  P={args.prompts} G={args.group} max_new_tokens={args.max_new_tokens} "
          f"seed={args.seed} scale={args.scale}\n")
    print(table(result))
    if result["ops"]:
        print(f"\ntorch ops of one more engine call (torch.profiler, which slows it):\n{result['ops']}")


if __name__ == "__main__":
    main()
