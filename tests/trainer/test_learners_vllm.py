"""Data-parallel learners with `rollout.engine=vllm`: rank 0 alone runs vLLM (in a process of its
own), samples each batch whole with the single process's seeds and broadcasts it; after every
step the trained weights are gathered from the FSDP2 shards and pushed into it. So 2 ranks sample
the single vLLM process's rollouts and train to its metrics and weights.

One 2-rank run and one single process (each starts a vLLM engine, ~30-60 s on two cores)."""

from __future__ import annotations

from pathlib import Path

import pytest
from _learners import SMALL, checkpoint_weights, run_metrics, same_lines, same_weights, torchrun, warm_start
from safetensors.torch import load_file

from rlvr.cli import main

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

VLLM = ["rollout.engine=vllm", "rollout.vllm_kv_cache_mb=16", "rollout.vllm_block_size=32"]
# the warm start's completions vary under it in every group: their characters' codes modulo 5
REWARD = "def score(prompt, completion, **example):\n    return sum(map(ord, completion)) % 5 / 4\n"


def _two_ranks_and_one(tmp_path, *extra: str) -> tuple[Path, Path, list[dict]]:
    """3 vLLM steps by 2 ranks and by one process: their samples equal, their metrics to 1e-5."""
    (tmp_path / "reward.py").write_text(REWARD)
    common = [f"reward.fn={tmp_path / 'reward.py'}:score", f"trainer.out_dir={tmp_path}", "trainer.steps=3",
              *extra, *SMALL[1:], "trainer.save_every=3", *VLLM]
    done = torchrun(*common, "trainer.name=two", "trainer.threads=1")
    assert done.returncode == 0, done.stderr[-3000:]
    assert main(["train", *common, "trainer.name=one", "trainer.threads=1"]) == 0
    two, one = tmp_path / "two", tmp_path / "one"
    assert (two / "samples.jsonl").read_text() == (one / "samples.jsonl").read_text()
    lines = run_metrics(two)
    same_lines(lines, run_metrics(one))
    assert len({line["reward/mean"] for line in lines[1:]}) > 1  # it trains on varying rewards
    return two, one, lines


def test_two_ranks_with_vllm_sample_and_train_as_one_vllm_process(tmp_path):
    two, one, lines = _two_ranks_and_one(tmp_path)
    assert all(line["time/weight_sync_s"] > 0 for line in lines[1:])  # the gather and push, timed
    same_weights(checkpoint_weights(two, 3), checkpoint_weights(one, 3), warm_start())


def test_two_ranks_with_vllm_and_lora_sample_and_train_as_one_vllm_lora_process(tmp_path):
    """LoRA: only the adapters train; after every step they are gathered into every rank's full
    copy and rank 0 pushes the merged weights (base + B A scaled) into vLLM, as one process
    pushes its own merged weights: the samples are the single process's, the adapters too."""
    two, one, _ = _two_ranks_and_one(tmp_path, "model.lora.r=4", "optim.lr=1e-3")
    ours, theirs = (load_file(str(run / "checkpoints" / "step_000003" / "adapter_model.safetensors"))
                    for run in (two, one))
    assert ours.keys() == theirs.keys() and any("lora_B" in k for k in ours)
    for name in ours:
        assert float((ours[name] - theirs[name]).norm()) <= 1e-5 * float(theirs[name].norm()), name
    assert all(float(v.norm()) > 0 for k, v in ours.items() if "lora_B" in k)  # B starts at 0: it trained
