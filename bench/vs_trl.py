"""rlvr vs TRL's GRPOTrainer: seconds per GRPO step on the same CPU work, and learning parity.

    pip install -e ".[bench]"
    python bench/vs_trl.py --seeds 0 1 2 --steps 30 --threads 2
    python bench/vs_trl.py --model DIR --lora 8 --dtype bfloat16 --reward length ...
    python bench/vs_trl.py --workload spread --lora 8 --prompts 4 --group 8 --max-new-tokens 128 --seeds 0 1 ...


Same model (the packaged Countdown warm start, a 1.06M-parameter Llama), same character
tokenizer, same Countdown prompts in the same order, P prompts x G completions, max new tokens,
temperature 1, AdamW(lr, betas 0.9/0.99), constant LR, grad clip 1, KL off, one optimizer step
per rollout batch, one forward of all B completions (TRL per_device_train_batch_size = B, rlvr
micro_batch_size = B), loss = GRPO advantages + PPO clip + per-sequence token mean (TRL
loss_type="grpo"). For each seed TRL and rlvr run alternately from the same warm start.

Reported: median s/step and the ratio TRL/rlvr, completion tokens/s, rlvr's time breakdown
(rollout, reward, log-prob recompute, forward, backward, optimizer), held-out greedy accuracy
after N steps for both (same evaluator), and the roofline: float32 matmul GFLOP/s measured at
the model's shapes in this run, the ideal step time (prefill 2N·P + decode 2N·C + forward/
backward 6N·(P+C) per completion, N = parameters, plus attention), and utilisation = ideal / actual.

Each run (TRL's, rlvr's, per seed) is a fresh process (`multiprocessing` spawn), so neither
starts with the other's heap: glibc keeps what a run freed, and in one shared process the second
trainer's peak included the first one's leftovers (measured at --scale 10: rlvr after TRL in
one process peaked at 1,798 MB; alone, 1,042 MB).

Peak memory: the process's resident-set high-water mark during each step (Linux: writing "5" to
/proc/self/clear_refs resets VmHWM to the current RSS at the step's start; VmHWM is read at its
end), reported as the median peak and the median rise over the RSS at the step's start. RSS counts
everything the step touches (weights, optimizer state, allocator caches), unlike torch.profiler's
memory view, which sees only tensors allocated through torch while profiling and slows the step.

`--memory-vocab V` instead measures one rlvr training forward + backward (log-probs and entropy
of B completions) for a tiny-hidden Llama with a V-token vocabulary, with the LM head unchunked
(full (tokens, V) logits, log-softmax and entropy tensors) and chunked (policy.CHUNK_ELEMENTS).

`--model DIR` puts any local Hugging Face causal LM in place of the warm start (both trainers load
it the same way, in `--dtype`), `--lora R` trains rank-R adapters on every linear layer in both
(peft's LoraConfig, alpha 16, no dropout; TRL through `peft_config`, rlvr through `model.lora`),
and `--reward length` scores both with `bench/length_reward.py` (an untrained model's groups then
differ, so every group trains in both). With bf16 weights both run without autocast (TRL
`bf16=False` on a bf16 model): the same arithmetic the checkpoint's dtype implies.

`--workload spread` is the RL-shaped workload of bench/spread.py: a 120M Qwen2 (Qwen2.5-0.5B's layer
shape, `--layers` 8), GSM8K-fixture prompts of about 100 tokens through the chat template, and
completion lengths spread from a few tokens to the cap within each group (an EOS bias written into
the weights, so both trainers sample the same distribution); the length reward in both.

TRL is imported here only; the library never needs it.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from roofline import attention_flops_per_token, matmul_gflops, param_count  # noqa: E402
from spread import spread_model, spread_overrides  # noqa: E402

from rlvr.builder.components import build_components  # noqa: E402
from rlvr.codec import decode_completions, encode_prompts  # noqa: E402
from rlvr.config import load_config  # noqa: E402
from rlvr.engines.torch_ar import generate  # noqa: E402
from rlvr.models.causal_lm import load_causal_lm  # noqa: E402
from rlvr.runtime.process import configure_for  # noqa: E402
from rlvr.trainer.sync import rl_step  # noqa: E402

WARM_START = "rlvr:countdown-warmstart"
LENGTH_REWARD = Path(__file__).resolve().parent / "length_reward.py"
LAYOUT_METRICS = ("perf/padding_share", "perf/shared_prompt_share", "perf/tokens_per_micro_batch")


def _proc_status_mb(field: str) -> float:
    """VmRSS / VmHWM of this process in MB (nan where /proc is unavailable)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def reset_peak_rss() -> float:
    """Reset the RSS high-water mark to the current RSS; returns the current RSS in MB."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    return _proc_status_mb("VmRSS")


def peak_rss() -> float:
    return _proc_status_mb("VmHWM")


def _peak_and_rise(rss0: float) -> tuple[float, float]:
    """(peak RSS since the last reset, its rise over `rss0`), from one read of /proc."""
    peak = peak_rss()
    return peak, peak - rss0


def rlvr_config(args, seed: int, engine: str = "torch"):
    """rlvr's side; `engine` is rollout.engine (vllm: its threads share the cores, so the trainer runs one)."""
    decode = args.engine if args.engine != "vllm" else "cpp"
    model = [f"model.dtype={args.dtype}", f"model.lora.r={args.lora}"]
    if engine == "vllm" and getattr(args, "vllm_kv_cache_mb", 0):
        model.append(f"rollout.vllm_kv_cache_mb={args.vllm_kv_cache_mb}")
    if args.reward == "length":
        model.append(f"reward.fn={LENGTH_REWARD}:length_reward")
    if getattr(args, "workload", "countdown") == "spread":
        model += spread_overrides()
    return load_config(None, [*model, f"rollout.engine={engine}",
        f"seed={seed}", f"model.path={args.model_path}",
        f"rollout.prompts_per_step={args.prompts}", f"rollout.group_size={args.group}",
        f"rollout.max_new_tokens={args.max_new_tokens}", "rollout.temperature=1.0",
        f"optim.lr={args.lr}", "optim.warmup_steps=0", "optim.grad_clip=1.0", "optim.schedule=constant",
        # like TRL: every group trains, constant LR (the package defaults filter groups, decay the LR)
        "algo.kl_coef=0.0", "algo.dynamic_sampling=false", "algo.advantage=grpo", "algo.objective=ppo_clip",
        "algo.aggregation=seq_mean_token_mean",
        f"trainer.micro_batch_size={args.prompts * args.group}", f"trainer.steps={args.steps}",
        f"rollout.decode_engine={decode}", f"trainer.threads={args.threads}",
        f"trainer.thread_mode={args.thread_mode}", f"trainer.kernels={args.kernels}",
    ])


def in_fresh_process(fn, *args):
    """`fn(*args)` in a new Python process (spawned: no fork of this one's heap), its result returned."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


def heldout_accuracy(model, tokenizer, task, max_new_tokens: int) -> float:
    """Greedy accuracy on the task's held-out set; one evaluator for both trainers' models."""
    examples = task.heldout()
    ids, mask = encode_prompts(tokenizer, [ex.prompt for ex in examples])
    out = generate(model, ids, mask, torch.zeros(len(examples), dtype=torch.long), max_new_tokens=max_new_tokens,
                   eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id, temperature=0.0)
    texts = decode_completions(tokenizer, out)
    return sum(task.is_correct(t, ex) for t, ex in zip(texts, examples)) / len(examples)


def prompt_stream(c, steps: int, prompts: int):
    """The examples rlvr will draw, in order (collect() samples, then rl_step draws 62 bits)."""
    rng = random.Random()
    rng.setstate(c.rollout.rng.getstate())
    out = []
    for _ in range(steps):
        out.extend(c.rollout.task.sample(prompts, rng))
        rng.getrandbits(62)
    return out


class _Timer:
    """Wraps a callable and adds its wall time to `totals[name]`."""

    def __init__(self, fn, totals: dict, name: str):
        self.fn, self.totals, self.name = fn, totals, name

    def __call__(self, *a, **k):
        t0 = time.perf_counter()
        try:
            return self.fn(*a, **k)
        finally:
            self.totals[self.name] = self.totals.get(self.name, 0.0) + time.perf_counter() - t0

    def __getattr__(self, name):  # the wrapped object's other methods (the reward runner's `judged`), timed too
        attr = getattr(self.fn, name)
        return _Timer(attr, self.totals, self.name) if callable(attr) else attr


def _with_completion_mask(token_logprobs, eos_id: int):
    """Emulates the proposed trainer change (pass `completion_mask=` to token_logprobs) until the
    trainer makes it: the mask is rebuilt from the tokens (1 up to and including the first EOS;
    rows without EOS are truncated at the full width), which is what the rollouts' mask is."""
    def call(prompt_ids, prompt_mask, completion_ids, **kw):
        if "completion_mask" not in kw:
            is_eos = (completion_ids == eos_id).long()
            kw["completion_mask"] = ((is_eos.cumsum(-1) - is_eos) == 0).float()
        return token_logprobs(prompt_ids, prompt_mask, completion_ids, **kw)
    return call


def run_rlvr(args, seed: int, engine: str = "torch") -> dict:
    config = rlvr_config(args, seed, engine)
    c = build_components(config, runtime=configure_for(config))
    totals: dict[str, float] = {}
    if args.pass_mask:
        policy = c.learner.policy
        policy.token_logprobs = _with_completion_mask(policy.token_logprobs, c.rollout.tokenizer.eos_token_id)
    # Bench-only instrumentation: time the reward, the training forward and the optimizer inside rl_step.
    timed = _Timer(c.rollout.reward, totals, "reward")
    c = dataclasses.replace(c, rollout=dataclasses.replace(c.rollout, reward=timed))
    c.learner.policy.token_logprobs = _Timer(c.learner.policy.token_logprobs, totals, "forward")
    c.learner.optimizer.step = _Timer(c.learner.optimizer.step, totals, "optimizer")
    steps, cpu, breakdown, tokens, memory, layout = [], [], [], [], [], []
    for step in range(1, args.steps + 1):
        totals.clear()
        rss0 = reset_peak_rss()
        t0, c0 = time.perf_counter(), time.process_time()
        metrics, _ = rl_step(c, step)
        steps.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        # rl_step resets the high-water mark at each phase's end (runtime.memory): its phases' peaks
        phases = {k.rsplit("/", 1)[1]: v for k, v in metrics.items() if k.startswith("perf/peak_rss_mb/")}
        memory.append((max(phases.values()), max(phases.values()) - rss0, phases))
        tokens.append(metrics["response/length_mean"] * args.prompts * args.group)
        layout.append({k: v for k, v in metrics.items() if k in LAYOUT_METRICS})
        update = metrics["time/update_s"]
        breakdown.append({
            "weight_sync": metrics.get("time/weight_sync_s", 0.0),
            "rollout": metrics["time/rollout_s"] - totals.get("reward", 0.0),
            "reward": totals.get("reward", 0.0),
            "logprob": metrics["time/logprob_s"],
            "forward": totals.get("forward", 0.0),
            "backward": update - totals.get("forward", 0.0) - totals.get("optimizer", 0.0),
            "optimizer": totals.get("optimizer", 0.0),
        })
    acc = heldout_accuracy(c.learner.model, c.rollout.tokenizer, c.rollout.task, args.max_new_tokens)
    return {"steps": steps, "cpu": cpu, "tokens": tokens, "breakdown": breakdown, "heldout": acc, "memory": memory,
            "layout": layout}


def run_trl(args, seed: int, examples) -> dict:
    import datasets
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    c = build_components(rlvr_config(args, seed))  # task, reward runner and evaluator only
    torch.set_num_threads(args.threads)  # rlvr's rows mode made ops single-threaded; TRL uses intra-op threads
    model, tokenizer = load_causal_lm(args.model_path, seed=0, dtype=args.dtype)
    bos = tokenizer.bos_token
    data = datasets.Dataset.from_dict({"prompt": [bos + ex.prompt for ex in examples],
                                       "idx": list(range(len(examples)))})

    def countdown_reward(prompts, completions, idx, **_):
        group = [examples[i] for i in idx]
        out = c.rollout.reward([ex.prompt for ex in group], completions,
                               [dataclasses.asdict(ex) for ex in group])
        return out.rewards

    if args.reward == "length":
        sys.path.insert(0, str(LENGTH_REWARD.parent))
        from length_reward import length_reward as countdown_reward  # noqa: F811  the same function rlvr calls
    peft_config = None
    if args.lora:
        from peft import LoraConfig

        peft_config = LoraConfig(r=args.lora, lora_alpha=16, lora_dropout=0.0, target_modules="all-linear",
                                 task_type="CAUSAL_LM")

    steps, cpu, tokens, memory, rollout = [], [], [], [], []
    generation: dict[str, float] = {}
    model.generate = _Timer(model.generate, generation, "generate")  # TRL samples with the model's generate

    class StepTimes(TrainerCallback):
        def on_step_begin(self, *_, **__):
            self.rss0 = reset_peak_rss()
            self.t0, self.c0 = time.perf_counter(), time.process_time()
            generation.clear()

        def on_step_end(self, *_, **__):
            rollout.append(generation.get("generate", 0.0))
            steps.append(time.perf_counter() - self.t0)
            cpu.append(time.process_time() - self.c0)
            memory.append(_peak_and_rise(self.rss0))

    batch = args.prompts * args.group
    with tempfile.TemporaryDirectory() as out:
        config = GRPOConfig(
            output_dir=out, use_cpu=True, bf16=False, seed=seed, report_to="none", save_strategy="no",
            logging_steps=1, disable_tqdm=True, max_steps=args.steps, shuffle_dataset=False,
            per_device_train_batch_size=batch, gradient_accumulation_steps=1, num_generations=args.group,
            max_completion_length=args.max_new_tokens, temperature=1.0, top_p=1.0, top_k=0,
            learning_rate=args.lr, lr_scheduler_type="constant", warmup_steps=0, adam_beta1=0.9,
            adam_beta2=0.99, weight_decay=0.0, max_grad_norm=1.0, beta=0.0, loss_type="grpo",
            scale_rewards="group", epsilon=0.2, num_iterations=1, dataloader_num_workers=0,
        )
        trainer = GRPOTrainer(model=model, reward_funcs=countdown_reward, args=config, train_dataset=data,
                              processing_class=tokenizer, callbacks=[StepTimes()], peft_config=peft_config)
        trainer.train()
        for record in trainer.state.log_history:
            if "completions/mean_length" in record:
                tokens.append(record["completions/mean_length"] * batch)
    torch.set_num_threads(args.threads)  # the HF Trainer may touch thread settings; restore ours
    acc = heldout_accuracy(model, tokenizer, c.rollout.task, args.max_new_tokens)
    return {"steps": steps, "cpu": cpu, "tokens": tokens, "heldout": acc, "memory": memory, "rollout": rollout}


def ideal_seconds(n_params: int, cfg, prompt_len: float, completion_len: float, batch: int,
                  decode_gflops: float, train_gflops: float) -> float:
    """Prefill 2N·P + decode 2N·C + forward/backward 6N·(P+C), per completion, plus attention;
    decode FLOPs at the decode-shape matmul rate, the rest at the full-sequence rate."""
    per_token = 2 * n_params + attention_flops_per_token(cfg, prompt_len + completion_len / 2)
    decode = per_token * completion_len * batch
    rest = per_token * (prompt_len + 3 * (prompt_len + completion_len)) * batch
    return decode / (decode_gflops * 1e9) + rest / (train_gflops * 1e9)


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--engine", default="cpp", choices=["eager", "cpp", "vllm"],
                   help="rlvr's decode step (rollout.decode_engine); cpp: its one-off build falls in the excluded "
                        "warm-up steps; vllm: rlvr with rollout.engine=vllm (the vllm extra) against TRL and "
                        "against rlvr's own sampler (cpp), the rollout share of the step for each")
    p.add_argument("--vllm-kv-cache-mb", type=int, default=0,
                   help="--engine vllm: rollout.vllm_kv_cache_mb (0: rlvr's default, 64; --scale 10 needs 331 to hold "
                        "the 128 rows at once)")
    p.add_argument("--thread-mode", default="auto", choices=["auto", "ops", "rows"],
                   help="rlvr's trainer.thread_mode: torch intra-op threads, each thread a share of the rows, "
                        "or auto (rows)")
    p.add_argument("--kernels", default="cpp", choices=["eager", "cpp"],
                   help="rlvr's trainer.kernels: eager ATen ops, or each training layer one C++ call forward "
                        "and backward")
    p.add_argument("--skip-warmup", type=int, default=2, help="steps excluded from the medians")
    p.add_argument("--scale", type=int, default=1, choices=[1, 10],
                   help="1: the packaged warm start; 10: a ~10x larger Llama (hidden 320, 8 layers, "
                        "10.6M parameters, random init, speed only: it has no Countdown skill, so completions run "
                        "to max_new_tokens)")
    p.add_argument("--no-pass-mask", dest="pass_mask", action="store_false",
                   help="do not emulate the trainer passing completion_mask to token_logprobs")
    p.add_argument("--memory-vocab", type=int, default=0,
                   help="only measure peak memory of one rlvr training forward+backward at this vocabulary size, "
                        "LM head unchunked vs chunked (no TRL)")
    p.add_argument("--memory-batch", type=int, default=32, help="completions in the --memory-vocab step")
    p.add_argument("--model", default="", help="a local HF causal-LM directory in place of the warm start")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="weights of both trainers")
    p.add_argument("--lora", type=int, default=0, help="LoRA rank on every linear layer in both (0 = full)")
    p.add_argument("--reward", default="task", choices=["task", "length"],
                   help="task: the Countdown verifier; length: bench/length_reward.py (for untrained models)")
    p.add_argument("--workload", default="countdown", choices=["countdown", "spread"],
                   help="spread: bench/spread.py's 120M model, GSM8K prompts, spread completion lengths")
    p.add_argument("--layers", type=int, default=8, help="--workload spread: layers of the 120M model")
    args = p.parse_args(argv)
    if args.workload == "spread":
        args.reward = "length"  # an untrained model: the length reward gives its groups distinct rewards
    torch.set_num_threads(args.threads)
    print(f"# load before: {os.getloadavg()}  threads={args.threads}  torch {torch.__version__}")
    if args.memory_vocab:
        memory_probe(args)
        return
    with tempfile.TemporaryDirectory() as scratch:
        if args.workload == "spread" and not args.model:
            args.model = spread_model(scratch, layers=args.layers, dtype=args.dtype)
        args.model_path = args.model or (WARM_START if args.scale == 1 else large_model(scratch))
        (_compare_engines if args.engine == "vllm" else _compare)(args)


def memory_probe(args) -> None:
    """Peak RSS of one training forward + backward at a large vocabulary, LM head unchunked vs chunked."""
    import gc

    from rlvr.models import policy as policy_module
    from rlvr.models.causal_lm import tiny_llama
    from rlvr.models.policy import CausalPolicy

    vocab, b, tc, tp = args.memory_vocab, args.memory_batch, args.max_new_tokens, 12
    model = tiny_llama(vocab, hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128, max_seq_len=64, seed=0)
    gen = torch.Generator().manual_seed(0)
    prompt_ids = torch.randint(3, vocab, (b // 8, tp), generator=gen).repeat_interleave(8, 0)[:b]
    prompt_mask = torch.ones_like(prompt_ids)
    completion_ids = torch.randint(3, vocab, (b, tc), generator=gen)
    completion_mask = torch.ones(b, tc)
    advantages = torch.randn(b, 1, generator=gen)
    policy = CausalPolicy(model)
    default = policy_module.CHUNK_ELEMENTS
    print(f"\nmodel: {param_count(model):,} parameters, vocabulary {vocab:,}, hidden 64; {b} completions x {tc} tokens "
          f"({b * tc} scored tokens: one (tokens, V) float32 tensor = {b * tc * vocab * 4 / 2**20:,.0f} MB)")
    print("\n| LM head | peak RSS (MB) | rise over step start (MB) | seconds |\n|---|---|---|---|")
    results = {}
    for label, threshold in (("unchunked", float("inf")), ("chunked", default)):
        policy_module.CHUNK_ELEMENTS = threshold
        for _ in range(2):  # the second pass is the one reported (allocator and caches warm)
            model.zero_grad(set_to_none=True)
            gc.collect()
            rss0 = reset_peak_rss()
            t0 = time.perf_counter()
            logp, entropy = policy.token_logprobs(prompt_ids, prompt_mask, completion_ids, with_entropy=True,
                                                  completion_mask=completion_mask)
            loss = -(logp * advantages).mean() - 0.01 * entropy.mean()
            loss.backward()
            seconds = time.perf_counter() - t0
            peak = peak_rss()
            grad = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
            del logp, entropy, loss
        results[label] = grad
        print(f"| {label} | {peak:,.0f} | {peak - rss0:,.0f} | {seconds:.2f} |", flush=True)
    policy_module.CHUNK_ELEMENTS = default
    diff = (results["chunked"] - results["unchunked"]).norm() / results["unchunked"].norm()
    print(f"\nrelative gradient difference chunked vs unchunked: {diff:.1e}")


def large_model(directory: str) -> str:
    """A ~10x larger Llama saved to `directory` so both trainers load the same weights."""
    from rlvr.models.causal_lm import tiny_llama
    from rlvr.models.tokenizer import char_tokenizer

    tokenizer = char_tokenizer()
    model = tiny_llama(len(tokenizer), hidden_size=320, num_layers=8, num_heads=5, intermediate_size=960,
                       max_seq_len=64, seed=0)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def _rooflines(cfg, batch: int, prompt_len: float, ours: dict) -> dict[str, float]:
    """Matmul GFLOP/s at the decode and full-sequence shapes of the run just measured."""
    completion_len = statistics.mean(x / batch for x in ours["tokens"])
    return {"decode (rows=B)": matmul_gflops(cfg, batch),
            "full sequence (rows=B·(P+C))": matmul_gflops(cfg, int(batch * (prompt_len + completion_len)))}


def _compare(args) -> None:
    model, tokenizer = load_causal_lm(args.model_path, seed=0)
    n_params = param_count(model)  # all of them: LoRA's adapters train, but every weight computes
    batch = args.prompts * args.group
    results, rates = [], []
    for seed in args.seeds:
        c = build_components(rlvr_config(args, seed))
        examples = prompt_stream(c, args.steps, args.prompts)
        prompt_len = sum(len(tokenizer(ex.prompt, add_special_tokens=False)["input_ids"]) + 1
                         for ex in examples) / len(examples)  # + BOS
        trl = in_fresh_process(run_trl, args, seed, examples)
        ours = in_fresh_process(run_rlvr, args, seed)
        torch.set_num_threads(args.threads)  # the roofline is measured with intra-op threads
        results.append((seed, prompt_len, trl, ours))
        rates.append(_rooflines(model.config, batch, prompt_len, ours))
        k = args.skip_warmup
        print(f"seed {seed}: TRL {median(trl['steps'][k:]):.3f} s/step, rlvr {median(ours['steps'][k:]):.3f} s/step, "
              f"held-out TRL {trl['heldout']:.3f} rlvr {ours['heldout']:.3f}", flush=True)

    k = args.skip_warmup
    trl_s = median([s for _, _, t, _ in results for s in t["steps"][k:]])
    our_s = median([s for _, _, _, o in results for s in o["steps"][k:]])
    trl_tok = median([t["tokens"][i] / t["steps"][i] for _, _, t, _ in results for i in range(k, len(t["steps"]))
                      if i < len(t["tokens"])])
    our_tok = median([o["tokens"][i] / o["steps"][i] for _, _, _, o in results for i in range(k, len(o["steps"]))])
    prompt_len = statistics.mean(r[1] for r in results)
    completion_len = statistics.mean(x / batch for _, _, _, o in results for x in o["tokens"])
    # The machine's matmul rate drifts between minutes (116-160 GFLOP/s seen on one VM), so it is
    # measured after every seed and the best is the roofline: the utilisation is never flattered
    # by a slow moment.
    gflops = {name: max(r[name] for r in rates) for name in rates[0]}
    ideal = ideal_seconds(n_params, model.config, prompt_len, completion_len, batch, *gflops.values())
    print(f"\n# load after: {os.getloadavg()}")
    print(f"model: {n_params:,} parameters; P={args.prompts} G={args.group} B={batch} max_new_tokens="
          f"{args.max_new_tokens} lr={args.lr} steps={args.steps} seeds={args.seeds} threads={args.threads}"
          f" rlvr thread_mode={args.thread_mode} engine={args.engine} kernels={args.kernels}"
          f" completion_mask passed to token_logprobs={args.pass_mask} dtype={args.dtype} lora={args.lora}"
          f" reward={args.reward}" + (" (roofline: float32 matmuls, 6N a token as for full training)"
                                      if args.dtype != "float32" or args.lora else ""))
    print("\n| | TRL 1.16 GRPOTrainer | rlvr |\n|---|---|---|")
    trl_cpu = median([s for _, _, t, _ in results for s in t["cpu"][k:]])
    our_cpu = median([s for _, _, _, o in results for s in o["cpu"][k:]])
    print(f"| median s/step (wall) | {trl_s:.3f} | {our_s:.3f} |")
    print(f"| median CPU s/step (process time; with 1 thread, the wall time without contention) | "
          f"{trl_cpu:.3f} | {our_cpu:.3f} |")
    print(f"| completion tokens/s | {trl_tok:,.0f} | {our_tok:,.0f} |")
    for i, name in enumerate(("peak RSS during a step (MB)", "rise of RSS during a step (MB)")):
        trl_m = median([m[i] for _, _, t, _ in results for m in t["memory"][k:]])
        our_m = median([m[i] for _, _, _, o in results for m in o["memory"][k:]])
        print(f"| median {name} | {trl_m:,.0f} | {our_m:,.0f} |")
    accs_t = [t["heldout"] for _, _, t, _ in results]
    accs_o = [o["heldout"] for _, _, _, o in results]
    print(f"| held-out greedy accuracy after {args.steps} steps (per seed) | "
          f"{' / '.join(f'{a:.3f}' for a in accs_t)} | {' / '.join(f'{a:.3f}' for a in accs_o)} |")
    print(f"\n**speed-up TRL/rlvr: {trl_s / our_s:.1f}× wall, {trl_cpu / our_cpu:.1f}× CPU time** (median s/step "
          f"over {len(args.seeds)} seeds, first {k} steps of each run excluded)")
    phases = {name: median([m[2][name] for _, _, _, o in results for m in o["memory"][k:]])
              for name in results[0][3]["memory"][0][2]}
    print("\nrlvr median peak RSS by phase of the step (MB): " + ", ".join(f"{n} {v:,.0f}" for n, v in phases.items()))
    keys = ["rollout", "reward", "logprob", "forward", "backward", "optimizer"]
    parts = {key: median([b[key] for _, _, _, o in results for b in o["breakdown"][k:]]) for key in keys}
    print("\nrlvr median time per step (s): " + ", ".join(f"{key} {v:.4f}" for key, v in parts.items()))
    layouts = [m for _, _, _, o in results for m in o["layout"]]
    if layouts and all(layouts):
        print("rlvr training batch, median per step: " + ", ".join(
            f"{key.split('/')[1]} {median([m[key] for m in layouts]):.3f}" for key in LAYOUT_METRICS))
    print(f"\nroofline: float32 matmul at the model's shapes, {args.threads} threads, best of {len(rates)} "
          "measurements (one after each seed; range in brackets): "
          + ", ".join(f"{name} {v:.0f} ({min(r[name] for r in rates):.0f}-{v:.0f})" for name, v in gflops.items())
          + " GFLOP/s")
    print(f"ideal step (P={prompt_len:.1f}, C={completion_len:.2f}): {ideal:.3f} s -> whole-step utilisation "
          f"(wall) rlvr {ideal / our_s:.2f}, TRL {ideal / trl_s:.2f}; (CPU time, threads=1 only) "
          f"rlvr {ideal / our_cpu:.2f}, TRL {ideal / trl_cpu:.2f}")


def _compare_engines(args) -> None:
    """TRL, rlvr with vLLM and rlvr with its own sampler on the same work, run in turn for each seed."""
    k, runs = args.skip_warmup, {"TRL 1.16 GRPOTrainer": [], "rlvr, vLLM engine": [], "rlvr, own sampler": []}
    for seed in args.seeds:
        examples = prompt_stream(build_components(rlvr_config(args, seed)), args.steps, args.prompts)
        runs["TRL 1.16 GRPOTrainer"].append(in_fresh_process(run_trl, args, seed, examples))
        runs["rlvr, vLLM engine"].append(in_fresh_process(run_rlvr, args, seed, "vllm"))
        runs["rlvr, own sampler"].append(in_fresh_process(run_rlvr, args, seed))
        print(f"seed {seed}: " + ", ".join(f"{n} {median(r[-1]['steps'][k:]):.3f} s/step" for n, r in runs.items()),
              flush=True)

    def med(name, fn):
        return median([fn(r, i) for r in runs[name] for i in range(k, len(r["steps"]))])

    def rollout(r, i):
        return r["rollout"][i] if "rollout" in r else r["breakdown"][i]["rollout"]

    n_params = param_count(load_causal_lm(args.model_path, seed=0)[0])
    print(f"\n# load after: {os.getloadavg()}\nmodel: {n_params:,} parameters; P={args.prompts} G={args.group} "
          f"max_new_tokens={args.max_new_tokens} steps={args.steps} seeds={args.seeds} threads={args.threads} "
          "(the vLLM run's trainer: 1 thread)")
    print("\n| | " + " | ".join(runs) + " |\n" + "|---" * (len(runs) + 1) + "|")
    rows = {"median s/step (wall)": lambda r, i: r["steps"][i], "median rollout s/step": rollout,
            "median rollout share of the step": lambda r, i: rollout(r, i) / r["steps"][i],
            "median weight push s/step": lambda r, i: r.get("breakdown", [{}] * (i + 1))[i].get("weight_sync", 0.0),
            "median peak RSS during a step (MB)": lambda r, i: r["memory"][i][0]}
    for label, fn in rows.items():
        print(f"| {label} | " + " | ".join(f"{med(name, fn):,.3f}" for name in runs) + " |")
    print("| held-out greedy accuracy after the run (per seed) | "
          + " | ".join(" / ".join(f"{r['heldout']:.3f}" for r in runs[name]) for name in runs) + " |")
    step = {name: med(name, lambda r, i: r["steps"][i]) for name in runs}
    vllm_s = step["rlvr, vLLM engine"]
    print(f"\n**TRL / rlvr+vLLM: {step['TRL 1.16 GRPOTrainer'] / vllm_s:.2f}x; rlvr own sampler / rlvr+vLLM: "
          f"{step['rlvr, own sampler'] / vllm_s:.2f}x** (median s/step, first {k} steps of each run excluded)")


if __name__ == "__main__":
    main()
