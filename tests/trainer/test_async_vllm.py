"""`rollout.engine=vllm` under the asynchronous loop: the local rollout side pushes into the run's
one vLLM engine (which evaluation shares), Ray rollout workers each start their own. vLLM samples
each row from its own seed and every call starts from an empty prefix cache, so η = 0 gives the
synchronous vLLM run's metrics bit for bit, locally and on Ray.

One synchronous run serves the module (each run starts a vLLM engine, ~20 s on two cores)."""

from __future__ import annotations

import json
import os

import pytest
import torch

from rlvr.cli import main

pytestmark = pytest.mark.vllm

VLLM = ["model.path=", "model.hidden_size=64", "model.num_layers=2", "model.num_heads=2",
        "model.intermediate_size=64", "rollout.prompts_per_step=2", "rollout.group_size=4",
        "rollout.max_new_tokens=6", "task.heldout_size=8", "rollout.engine=vllm", "rollout.vllm_kv_cache_mb=16",
        "rollout.vllm_block_size=32", "rollout.vllm_max_model_len=64", "algo.dynamic_sampling=false",
        "optim.lr=3e-2", "optim.warmup_steps=1"]
# Evaluations at 0, 2 and 3 interleave with rollouts; LoRA: the pushes carry the merged weights.
EQUAL = ["trainer.steps=3", "trainer.eval_every=2", "model.lora.r=4", "model.lora.target_modules=all-linear"]
# wall-clock, memory, what only the asynchronous loop logs, and what the synchronous loop's own push moved
# (the asynchronous rollout side pushes: `async/weight_sync_s`)
CLOCK = ("time/", "perf/rollout_tokens_per_s", "perf/train_tokens_per_s", "perf/peak_rss_mb", "async/",
         "rollout/staleness_", "perf/weight_sync_mb")


def _reward(folder) -> str:
    """A reward the random tiny model's samples already vary under: their characters' codes modulo 5."""
    path = folder / "codes.py"
    path.write_text("def score(prompt, completion, **example):\n    return sum(map(ord, completion)) % 5 / 4\n")
    return f"reward.fn={path}:score"


def _lines(run) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _trained(run) -> list[dict]:
    return [{k: v for k, v in line.items() if not k.startswith(CLOCK)} for line in _lines(run)]


def _run(folder, name: str, *args: str):
    argv = ["train", *args, "trainer.threads=1", f"trainer.out_dir={folder}", f"trainer.name={name}",
            "trainer.save_every=0"]
    assert main(argv) == 0
    return folder / name


@pytest.fixture(scope="module")
def sync_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sync")
    run = _run(folder, "sync", *VLLM, *EQUAL, _reward(folder))
    assert len({line["reward/mean"] for line in _lines(run)[1:]}) > 1  # it trains on varying rewards
    return run


def _assert_same(sync_run, other):
    assert _trained(sync_run) == _trained(other)  # exact float equality, key for key, evaluations included
    assert (sync_run / "samples.jsonl").read_text() == (other / "samples.jsonl").read_text()


def test_async_vllm_staleness_zero_reproduces_the_synchronous_vllm_run(sync_run, tmp_path):
    run = _run(tmp_path, "async", *VLLM, *EQUAL, _reward(tmp_path), "trainer.max_staleness=0")
    _assert_same(sync_run, run)
    steps = _lines(run)[1:]
    assert [line["async/policy_version"] for line in steps] == [0, 1, 2]
    assert all(line["rollout/mismatch_kl"] < 1e-6 for line in steps)  # vLLM had the learner's weights


@torch.no_grad()
def _teacher_forced(model, rollouts) -> torch.Tensor:
    """log-softmax of each completion token (temperature 1) from a plain transformers forward, (B, Tc)."""
    rows = []
    for i in range(len(rollouts)):
        prompt = rollouts.prompt_ids[i][rollouts.prompt_mask[i].bool()]
        n = int(rollouts.completion_mask[i].sum())
        ids = torch.cat([prompt, rollouts.completion_ids[i, :n]])[None]
        logp = model(input_ids=ids).logits[0, len(prompt) - 1:-1].float().log_softmax(-1)
        picked = logp.gather(-1, ids[0, len(prompt):, None]).squeeze(-1)
        rows.append(torch.cat([picked, torch.zeros(rollouts.completion_ids.shape[1] - n)]))
    return torch.stack(rows)


def test_one_step_off_vllm_tags_each_batch_with_the_weights_that_sampled_it(tmp_path, monkeypatch):
    """η = 1 on two cores: every batch's behaviour log-probs are those of the published weights of the
    version it is tagged with (so each push reached the engine), within the staleness bound; the
    learner's evaluation samples with its current weights."""
    from rlvr.builder.components import build_components
    from rlvr.codec import encode_prompts
    from rlvr.config import load_config
    from rlvr.engines.snapshot import frozen_copy, published
    from rlvr.runtime.process import configure_for
    from rlvr.trainer import async_loop

    config = load_config(None, [*VLLM, _reward(tmp_path), "trainer.threads=2", "trainer.max_staleness=1",
                                "trainer.steps=4", "trainer.eval_every=0"])
    c = build_components(config, runtime=configure_for(config))
    engine = c.rollout.engine  # the loop wraps it (snapshot.SharedEngine); closed here, as `train` does
    batches, real_step = [], async_loop.rl_step

    def recording_step(c, step, produced):
        batches.append((step, produced))
        return real_step(c, step, produced)

    monkeypatch.setattr(async_loop, "rl_step", recording_step)
    versions = {0: published(c.learner.model)}
    steps = async_loop.AsyncSteps(c, 0)
    try:
        assert steps.threads["learner"] == steps.threads["rollout_worker"] == 1
        for step in range(1, 5):
            metrics, _ = steps.step(step)
            assert metrics["loss/policy"] == metrics["loss/policy"]  # finite, not NaN
            versions[step] = published(c.learner.model)
        ids, mask = encode_prompts(c.rollout.tokenizer, [ex.prompt for ex in c.rollout.task.heldout()[:4]])
        evaluated = steps.engine(ids, mask, torch.arange(4), temperature=1.0)  # evaluation pushes the newest first
    finally:
        steps.close()
        engine.close()

    reference = frozen_copy(c.learner.model).eval()

    def gap(rollouts, version: int) -> float:
        reference.load_state_dict(dict(versions[version]), strict=False)
        return float((rollouts.logprobs - _teacher_forced(reference, rollouts)).abs().max())

    assert gap(evaluated, 4) < 1e-4
    assert [step for step, _ in batches] == [1, 2, 3, 4]
    for step, produced in batches:
        assert 0 <= step - 1 - produced.version <= 1 and produced.staleness == step - 1 - produced.version
        assert gap(produced.got.rollouts, produced.version) < 1e-4
    assert max(produced.version for _, produced in batches) >= 2  # pushes happened (step 4 needs version >= 2)
    last = batches[-1][1]
    assert gap(last.got.rollouts, 0) > 1e-2  # the versions' weights differ: the check above can fail


@pytest.mark.ray
def test_ray_workers_with_vllm_reproduce_the_synchronous_vllm_run(sync_run, ray_local, tmp_path, monkeypatch):
    """The rollout worker actor starts its own vLLM engine with the run's one thread (vLLM's CPU
    worker neither keeps torch's thread count nor the process's cores to itself) and samples
    what the in-process engine did (the torch sampler gives other completions for the same seeds)."""
    from rlvr.backends import ray as ray_backend

    workers, close = [], ray_backend.RayEngine.close

    def closing(engine):
        workers.extend(engine.ray.get([w.facts.remote() for w in engine.workers], timeout=60))
        close(engine)

    monkeypatch.setattr(ray_backend.RayEngine, "close", closing)
    run = _run(tmp_path, "ray", *VLLM, *EQUAL, _reward(tmp_path), "trainer.backend=ray", "trainer.max_staleness=0")
    _assert_same(sync_run, run)
    assert workers == [{"engine": "VLLMEngine", "torch_threads": 1, "cores": len(os.sched_getaffinity(0))}]
    assert all(line["async/worker_restarts"] == 0 for line in _lines(run)[1:])
    from rlvr.backends.ray import running_engines

    assert running_engines() == []
