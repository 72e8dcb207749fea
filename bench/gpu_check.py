"""The GPU check's work (run by bench/gpu_check.sh): GRPO on a random Qwen2-0.5B-shaped model in
bf16 on CUDA, full fine-tuning, LoRA and the FSDP2 learner at world size 1 (`trainer.learners=fsdp`:
NCCL on CUDA, gloo on a CPU), CPU-vs-CUDA log-prob agreement on a tiny model, and TRL's
GRPOTrainer on the same work when `trl` (and `datasets`) import. The full and FSDP runs print
their first step's loss and grad norm: the same seed and weights, so they should agree.

    python bench/gpu_check.py --device cuda            # what the lent machine runs
    python bench/gpu_check.py --device cpu --tiny      # dry run: the same code paths at toy size

Everything is built locally (no download): the model from its config with random weights, the
tokenizer a byte-level BPE trained on this repository's task text, padded with plain added tokens
to `--vocab` ids so the LM head has a real model's size. Prints one JSON object per measurement.
Rewards: 1/(1 + completion length), so a random model's groups have distinct rewards and every
step trains (the math verifier would score them all 0).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "models"))
sys.path.insert(0, str(ROOT / "src"))

from _archs import QWEN2_05B, bpe_tokenizer, build_model_dir, parameter_count  # noqa: E402

TINY_SHAPE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=True)


def emit(**record) -> None:
    print(json.dumps(record), flush=True)


def padded_tokenizer(vocab: int):
    tokenizer = bpe_tokenizer()
    if vocab > len(tokenizer):
        tokenizer.add_tokens([f"<x{i}>" for i in range(vocab - len(tokenizer))])
    return tokenizer


def reward_file(directory: Path) -> str:
    path = directory / "length_reward.py"
    path.write_text("def score(prompt, completion, **example):\n    return 1.0 / (1 + len(completion))\n")
    return f"{path}:score"


def overrides(args, model_dir: Path, reward: str, lora: bool, fsdp: tuple[str, ...] = ()) -> list[str]:
    return [f"model.path={model_dir}", f"model.dtype={args.dtype}", f"trainer.device={args.device}",
            "task.name=math_file", f"task.math_file.path={ROOT / 'data' / 'gsm8k_fixture.jsonl'}",
            "task.heldout_size=4", f"reward.fn={reward}", f"rollout.prompts_per_step={args.prompts}",
            f"rollout.group_size={args.group}", f"rollout.max_new_tokens={args.max_new_tokens}",
            f"trainer.micro_batch_size={args.prompts * args.group}", "trainer.thread_mode=ops",
            "trainer.eval_every=0", "optim.lr=1e-5", "optim.warmup_steps=1", f"trainer.steps={args.steps}",
            f"trainer.gradient_checkpointing={str(lora).lower()}", f"model.lora.r={16 if lora else 0}",
            *(("trainer.learners=fsdp", *fsdp) if fsdp else ())]


def grpo(args, model_dir: Path, reward: str, lora: bool, fsdp: tuple[str, ...] = (), mode: str = "") -> None:
    """`args.steps` GRPO steps through the library's own step function; the first is warm-up.
    `fsdp`: the FSDP2 learner at world size 1 with these extra overrides (a process group of one)."""
    from rlvr.builder.components import build_components
    from rlvr.config import load_config
    from rlvr.runtime.process import Runtime, configure_for
    from rlvr.trainer.sync import rl_step

    cuda = args.device.startswith("cuda")
    config = load_config(None, overrides(args, model_dir, reward, lora, fsdp))
    c = build_components(config, runtime=configure_for(config) if fsdp else Runtime())
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    times, tokens, parts, first = [], [], [], {}
    for step in range(1, args.steps + 1):
        t0 = time.perf_counter()
        metrics, _ = rl_step(c, step)
        first = first or {k: metrics.get(k) for k in ("loss/policy", "actor/grad_norm", "reward/mean")}
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        tokens.append(metrics.get("response/length_mean", 0.0) * args.prompts * args.group)
        parts.append({k: metrics[k] for k in ("time/rollout_s", "time/logprob_s", "time/update_s") if k in metrics})
    timed = slice(1, None) if len(times) > 1 else slice(None)
    seconds = sum(times[timed]) / len(times[timed])
    emit(check="grpo", mode=mode or ("lora" if lora else "full"), device=args.device, dtype=args.dtype,
         params_m=round(parameter_count(model_dir) / 1e6, 1), s_per_step=round(seconds, 3),
         completion_tokens_per_s=round(sum(tokens[timed]) / sum(times[timed]), 1),
         peak_gpu_mem_gb=round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None,
         breakdown=parts[-1], steps=args.steps, first_step=first)
    del c
    if cuda:
        torch.cuda.empty_cache()


def agreement(args, work: Path) -> None:
    """Teacher-forced log-probs of one batch, fp32, on the CPU and on `args.device`."""
    from transformers import AutoModelForCausalLM

    from rlvr.models.policy import CausalPolicy

    directory = build_model_dir(work / "agree", "qwen2", dtype=torch.float32)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(5, model.config.vocab_size, (8, 12), generator=g)
    mask = torch.ones_like(prompt)
    mask[:3, :4] = 0  # left padding on some rows
    completion = torch.randint(5, model.config.vocab_size, (8, 16), generator=g)
    with torch.no_grad():
        cpu, _ = CausalPolicy(model, fast=False).token_logprobs(prompt, mask, completion)
        other, _ = CausalPolicy(model.to(args.device), fast=False).token_logprobs(prompt, mask, completion)
    gap = float((cpu - other.cpu()).abs().max())
    emit(check="logprob_agreement", device=args.device, max_abs_diff=gap, ok=gap < 1e-4)
    packed_agreement(args, model.to(args.device), prompt, mask, completion)


def packed_agreement(args, model, prompt, mask, completion) -> None:
    """On `args.device`, fp32: the padding-free forwards (`trainer.packing`) against the padded one,
    log-probs and gradients of one batch with completions of spread lengths (models/packing.py)."""
    from rlvr.models import packing
    from rlvr.models.policy import CausalPolicy

    completion_mask = (torch.arange(completion.shape[1])[None] < torch.tensor([[16], [3], [9], [1], [12], [7], [16],
                                                                              [5]])).float()
    outs = {}
    for mode in (None, "packed", "shared"):
        reason = packing.prepare(model, mode) if mode else None
        if reason:
            emit(check="packed_agreement", mode=mode, skipped=reason)
            return
        model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        logp, _ = CausalPolicy(model, fast=False, packing=mode).token_logprobs(
            prompt, mask, completion, completion_mask=completion_mask)
        (logp.cpu() * completion_mask).sum().backward()
        grad = torch.cat([p.grad.flatten().cpu() for p in model.parameters() if p.grad is not None])
        outs[mode] = ((logp.detach().cpu() * completion_mask), grad, time.perf_counter() - t0)
    for mode in ("packed", "shared"):
        logp_rel = float((outs[mode][0] - outs[None][0]).abs().max() / outs[None][0].abs().max())
        grad_rel = float((outs[mode][1] - outs[None][1]).abs().max() / outs[None][1].abs().max())
        emit(check="packed_agreement", mode=mode, device=args.device, logp_rel=logp_rel, grad_rel=grad_rel,
             seconds=round(outs[mode][2], 3), padded_seconds=round(outs[None][2], 3),
             ok=logp_rel < 1e-4 and grad_rel < 1e-3)


def vlm(args, work: Path) -> None:
    """A tiny Idefics3 (built in code) in `args.dtype` with LoRA on its language model: GRPO steps on
    count_shapes on the device, the sampler's log-probs against the trainer's with images, then
    `rlvr export` and a reload through AutoModelForImageTextToText."""
    from rlvr.cli import main as main_cli
    from rlvr.models.vlm import tiny_vlm
    from rlvr.tracking.export import export_run

    cuda = args.device.startswith("cuda")
    directory = work / "vlm"
    size = {} if args.tiny else dict(hidden_size=512, intermediate_size=1536, num_layers=8, vision_layers=6,
                                      num_heads=8)
    model, processor = tiny_vlm(seed=0, **size)
    model.save_pretrained(directory)
    processor.save_pretrained(directory)
    run = [f"model.path={directory}", f"model.dtype={args.dtype}", f"trainer.device={args.device}",
           "task.name=count_shapes", "task.heldout_size=8", "model.lora.r=8",
           f"rollout.prompts_per_step={args.prompts}", f"rollout.group_size={args.group}", "rollout.max_new_tokens=4",
           "trainer.thread_mode=ops",
           "trainer.eval_every=0", "optim.lr=1e-4", "optim.warmup_steps=1", f"trainer.steps={args.steps}",
           "algo.entropy_coef=0.01", f"trainer.out_dir={work}", "trainer.name=vlm_run",
           f"trainer.save_every={args.steps}"]
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    if main_cli(["train", *run]) != 0:
        sys.exit("error: the VLM run failed (its line above says why)")
    seconds = time.perf_counter() - t0
    rows = [json.loads(line) for line in (work / "vlm_run" / "metrics.jsonl").read_text().splitlines()]
    gaps = [v for r in rows for k, v in r.items() if k.endswith("rollout_logprob_gap")]
    emit(check="vlm", mode="lora", device=args.device, dtype=args.dtype,
         params_m=round(sum(p.numel() for p in model.parameters()) / 1e6, 2),
         s_per_run=round(seconds, 1), steps=args.steps, max_rollout_logprob_gap=max(gaps, default=None),
         peak_gpu_mem_gb=round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None)
    # float32: a few small LoRA steps are below bf16's resolution, and the export refuses to round them away
    exported = export_run(work / "vlm_run", work / "vlm_export", dtype="float32")
    emit(check="vlm_export", verified=exported.verified, path=str(exported.path))


def trl_side_by_side(args, model_dir: Path, reward: str) -> None:
    """TRL's GRPOTrainer on the same model, prompts, group size and completion length, when it imports."""
    try:
        import datasets
        from trl import GRPOConfig, GRPOTrainer
    except ImportError as err:
        emit(check="trl", skipped=f"{type(err).__name__}: {err}")
        return
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

    from rlvr.rewards.runner import load_reward_spec

    score = load_reward_spec(reward)[0][0]
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rows = [json.loads(line) for line in (ROOT / "data" / "gsm8k_fixture.jsonl").read_text().splitlines()]
    prompts = [[{"role": "user", "content": r["question"]}] for r in rows]
    data = datasets.Dataset.from_dict({"prompt": prompts * 4})

    def length_reward(prompts, completions, **_):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [score("", t) for t in texts]

    times = []

    class Clock(TrainerCallback):
        def on_step_begin(self, *_, **__):
            self.t0 = time.perf_counter()

        def on_step_end(self, *_, **__):
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            times.append(time.perf_counter() - self.t0)

    cuda = args.device.startswith("cuda")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, args.dtype))
    with tempfile.TemporaryDirectory() as out:
        config = GRPOConfig(output_dir=out, use_cpu=not cuda, bf16=args.dtype == "bfloat16" and cuda, report_to="none",
                            save_strategy="no", logging_steps=1, disable_tqdm=True, max_steps=args.steps,
                            per_device_train_batch_size=args.prompts * args.group, num_generations=args.group,
                            max_completion_length=args.max_new_tokens, learning_rate=1e-5, beta=0.0,
                            loss_type="grpo", temperature=1.0, gradient_checkpointing=False)  # as rlvr's full run
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        GRPOTrainer(model=model, reward_funcs=length_reward, args=config, train_dataset=data,
                    processing_class=tokenizer, callbacks=[Clock()]).train()
    timed = times[1:] if len(times) > 1 else times
    emit(check="trl", mode="full", device=args.device, s_per_step=round(sum(timed) / len(timed), 3),
         peak_gpu_mem_gb=round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None,
         trl=__import__("trl").__version__)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true", help="toy sizes: a dry run of every code path (CPU)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--vocab", type=int, default=151_936, help="tokenizer padded to this many ids (Qwen2's)")
    p.add_argument("--only", nargs="+", default=["agree", "full", "lora", "fsdp", "trl", "vlm"],
                   choices=["agree", "full", "lora", "fsdp", "trl", "vlm"])
    p.add_argument("--work", default="", help="scratch directory (default: a temporary one)")
    args = p.parse_args(argv)
    if args.tiny:
        args.steps, args.prompts, args.group, args.max_new_tokens, args.vocab = 2, 2, 4, 8, 0
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit(f"error: --device {args.device} but torch {torch.__version__} sees no CUDA device; "
                 "use --device cpu --tiny for a dry run")
    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "0")) or torch.get_num_threads()))
    work = Path(args.work or tempfile.mkdtemp(prefix="gpu_check."))
    work.mkdir(parents=True, exist_ok=True)
    emit(check="env", torch=torch.__version__, transformers=__import__("transformers").__version__,
         cuda=torch.cuda.get_device_name(0) if torch.cuda.is_available() else None, work=str(work))
    if "agree" in args.only:
        agreement(args, work)
    if "vlm" in args.only:
        vlm(args, work)
    if not {"full", "lora", "fsdp", "trl"} & set(args.only):
        return
    model_dir, reward = work / "model", reward_file(work)
    if not (model_dir / "config.json").is_file():  # built once per --work directory, then reused
        t0 = time.perf_counter()
        build_model_dir(model_dir, "qwen2", dtype=getattr(torch, args.dtype), tokenizer=padded_tokenizer(args.vocab),
                        **(TINY_SHAPE if args.tiny else QWEN2_05B))
        emit(check="build", shape="tiny" if args.tiny else "qwen2-0.5b", seconds=round(time.perf_counter() - t0, 1),
             params_m=round(parameter_count(model_dir) / 1e6, 1))
    for mode in ("full", "lora"):
        if mode in args.only:
            grpo(args, model_dir, reward, lora=mode == "lora")
    if "fsdp" in args.only:  # the sharded learner alone on the device: NCCL (gloo on a CPU), world size 1
        grpo(args, model_dir, reward, lora=False, fsdp=("trainer.collective_timeout_s=120",), mode="fsdp")
        # fp32 shards and AdamW, bf16 compute, fp32 reduce; on CUDA the shards offloaded to CPU memory too
        mixed = argparse.Namespace(**{**vars(args), "dtype": "float32"})
        cuda = args.device.startswith("cuda")
        grpo(mixed, model_dir, reward, lora=False, mode="fsdp_mixed" + ("_offload" if cuda else ""),
             fsdp=("trainer.fsdp_param_dtype=bfloat16", "trainer.fsdp_reduce_dtype=float32",
                   f"trainer.fsdp_cpu_offload={str(cuda).lower()}"))
    if "trl" in args.only:
        trl_side_by_side(args, model_dir, reward)


if __name__ == "__main__":
    main()
