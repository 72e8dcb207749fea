"""Data-parallel learners (FSDP2 under torchrun) against one process on the same global batches;
prints a markdown table.

Per learner count (1 = a plain process, 2+ = `torchrun --nproc_per_node N`, one thread each): the
median s/step over the steps after the first two, samples/s, and the bytes each rank's FSDP2
collectives move per step (the all-gathered parameter buffers and the reduce-scattered gradient
buffers, counted by wrapping `torch.distributed.all_gather_single` / `reduce_scatter_single`, FSDP2's calls,
in every rank). The run's own samples and gathers (`all_gather_object`) are not counted.

Then a projection, labelled as one: a step at N devices taking T1 / N + (AG + RS) · (N - 1) / N / BW,
T1 the one-process step time measured here, AG and RS the per-step buffer bytes measured at 2 ranks
(the same at any N: the whole model is gathered and reduced each step) and BW a stated
per-device interconnect bandwidth (ring collectives). It assumes perfect compute scaling (the
rollout, the no-grad passes and the update each split the rows over the ranks); the counted bytes
grow with the passes that run (`trainer.minibatches=2` adds the old-policy pass's gathers).

    python bench/scaling.py --steps 8 --learners 1 2
    python bench/scaling.py trainer.minibatches=2 algo.kl_coef=0.05 --steps 6 --learners 1 2  # both passes
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BANDWIDTHS = {"NVLink 4 (450 GB/s)": 450e9, "PCIe 5 x16 (64 GB/s)": 64e9, "100 Gb/s Ethernet (12.5 GB/s)": 12.5e9}


def _counting_worker(out: str, argv: list[str]) -> int:
    """Inside torchrun: count the FSDP2 collectives' buffer bytes, run `rlvr train`, write the counts."""
    import torch.distributed as dist

    from rlvr.cli import main

    counts = {"all_gather": 0, "reduce_scatter": 0}

    def wrap(name: str, key: str, index: int, keyword: str):
        original = getattr(dist, name)

        def counted(*args, **kwargs):
            buffer = kwargs[keyword] if keyword in kwargs else args[index]
            counts[key] += buffer.numel() * buffer.element_size()
            return original(*args, **kwargs)

        setattr(dist, name, counted)

    wrap("all_gather_single", "all_gather", 0, "output")  # FSDP2's calls (output, input): the gathered buffer
    wrap("reduce_scatter_single", "reduce_scatter", 1, "input")  # the gradient buffer reduced
    code = main(argv)
    Path(f"{out}.{os.environ.get('RANK', '0')}.json").write_text(json.dumps(counts))
    return code


def _run(out: Path, learners: int, args) -> dict:
    name = f"n{learners}"
    train = ["train", f"seed={args.seed}", f"trainer.steps={args.steps}", "trainer.eval_every=0",
             "trainer.save_every=0", "trainer.threads=1", f"trainer.out_dir={out}", f"trainer.name={name}",
             f"rollout.prompts_per_step={args.prompts}", f"rollout.group_size={args.group_size}", *args.overrides]
    counts = out / name
    cmd = [sys.executable, __file__, "--worker", str(counts), "--", *train]
    if learners > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={learners}",
               __file__, "--worker", str(counts), "--", *train]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"{name} failed:\n{done.stderr[-3000:]}")
    lines = [json.loads(line) for line in (out / name / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in lines if m["step"] > 0]
    timed = steps[2:] if len(steps) > 3 else steps
    rank0 = json.loads(Path(f"{counts}.0.json").read_text())
    seconds = statistics.median(m["time/step_s"] for m in timed)
    phases = {p: statistics.median(m.get(f"time/{p}_s", 0.0) for m in timed)
              for p in ("rollout", "logprob", "update", "weight_sync")}
    return {"learners": learners, "s_per_step": seconds, **phases,
            "samples_per_s": args.prompts * args.group_size / seconds,
            "all_gather_mb": rank0["all_gather"] / len(steps) / 1e6,
            "reduce_scatter_mb": rank0["reduce_scatter"] / len(steps) / 1e6}


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        raise SystemExit(_counting_worker(sys.argv[2], sys.argv[4:]))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--learners", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("overrides", nargs="*", help="key=value overrides for every run")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = [_run(Path(tmp), n, args) for n in args.learners]
    print(f"global batch {args.prompts} prompts x {args.group_size}, {args.steps} steps, 1 thread per learner\n")
    print("| learners | s/step | rollout s | log-prob s | update s | weight push s | samples/s "
          "| all-gathered MB/step/rank | reduce-scattered MB/step/rank |")
    print("|---" * 9 + "|")
    for r in rows:
        print(f"| {r['learners']} | {r['s_per_step']:.3f} | {r['rollout']:.3f} | {r['logprob']:.3f} "
              f"| {r['update']:.3f} | {r['weight_sync']:.3f} | {r['samples_per_s']:.1f} | {r['all_gather_mb']:.2f} "
              f"| {r['reduce_scatter_mb']:.2f} |")
    one = next((r for r in rows if r["learners"] == 1), None)
    shard = next((r for r in rows if r["learners"] > 1), None)
    if one is None or shard is None:
        return
    moved = (shard["all_gather_mb"] + shard["reduce_scatter_mb"]) * 1e6
    print("\nProjection (not measured): T1/N + bytes·(N-1)/N / BW per step, s")
    print("| devices | " + " | ".join(BANDWIDTHS) + " |")
    print("|---" * (len(BANDWIDTHS) + 1) + "|")
    for n in (8, 64):
        cells = [f"{one['s_per_step'] / n + moved * (n - 1) / n / bw:.4f}" for bw in BANDWIDTHS.values()]
        print(f"| {n} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
