"""`trainer.backend=ray`: rollout workers and reward scorers as Ray actors on a local Ray
(`ray.init(num_cpus=2)`, started here: the `ray_local` fixture). Skipped without Ray unless
RLVR_REQUIRE_EXTRAS=1 (CI)."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from rlvr.cli import main

pytestmark = pytest.mark.ray

TINY = ["model.path=", "rollout.prompts_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=4",
        "task.heldout_size=4", "trainer.threads=2", "optim.lr=1e-2"]
DIFFUSION = ["model.kind=diffusion", "rollout.diffusion_steps=4", "model.hidden_size=32", "model.num_layers=2"]
CLOCK = ("time/", "perf/rollout_tokens_per_s", "perf/train_tokens_per_s", "perf/peak_rss_mb", "async/",
         "rollout/staleness_")  # wall-clock, memory, and what only the asynchronous loop logs


def _plus_reward(tmp_path) -> str:
    """Rewards a random tiny model's samples already vary under: the share of '+' and the distinct characters."""
    (tmp_path / "plus.py").write_text("def score(prompt, completion, **example):\n"
                                      "    return (completion.count('+') + len(set(completion))) / 8\n")
    return f"reward.fn={tmp_path / 'plus.py'}:score"


def _lines(run) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _trained(run) -> list[dict]:
    return [{k: v for k, v in line.items() if not k.startswith(CLOCK)} for line in _lines(run)]


def _cli_run(tmp_path, capsys, name, *args):
    code = main(["train", *args, f"trainer.out_dir={tmp_path}", f"trainer.name={name}"])
    assert code == 0, capsys.readouterr().err
    capsys.readouterr()
    return tmp_path / name


@pytest.mark.parametrize("kind", [pytest.param([], id="causal"), pytest.param(DIFFUSION, id="diffusion")])
def test_ray_staleness_zero_reproduces_the_synchronous_loop(ray_local, tmp_path, capsys, kind):
    args = [*TINY, *kind, _plus_reward(tmp_path), "trainer.steps=4", "trainer.eval_every=2", "trainer.save_every=0"]
    sync_run = _cli_run(tmp_path, capsys, "sync", *args)
    ray_run = _cli_run(tmp_path, capsys, "ray", *args, "trainer.backend=ray", "trainer.max_staleness=0")
    assert _trained(sync_run) == _trained(ray_run)
    assert len({line["reward/mean"] for line in _lines(sync_run)[1:]}) > 1  # it trained on varying rewards
    assert all(line["async/worker_restarts"] == 0 for line in _lines(ray_run)[1:])
    from rlvr.backends.ray import running_engines

    assert running_engines() == []  # the run closed its workers


def test_ray_exact_staleness_equals_the_local_backend(ray_local, tmp_path, capsys):
    """`trainer.staleness=exact` at η=2: the same versions, so the same samples and the same run, on Ray
    as in a thread here; the floats agree to rounding (the worker's sampler splits its rows over other
    threads than the local rollout side, which shares the process's two cores with the learner)."""
    args = [*TINY, _plus_reward(tmp_path), "trainer.steps=4", "trainer.eval_every=2", "trainer.save_every=0",
            "trainer.max_staleness=2", "trainer.staleness=exact"]
    local_run = _cli_run(tmp_path, capsys, "local", *args)
    ray_run = _cli_run(tmp_path, capsys, "ray", *args, "trainer.backend=ray")
    assert (local_run / "samples.jsonl").read_text() == (ray_run / "samples.jsonl").read_text()
    for here, there in zip(_trained(local_run), _trained(ray_run), strict=True):
        assert here.keys() == there.keys()
        assert all(here[k] == pytest.approx(there[k], rel=1e-4, abs=1e-5) for k in here), here["step"]
    assert [line["async/policy_version"] for line in _lines(ray_run)[1:]] == [0, 0, 0, 1]
    assert len({line["reward/mean"] for line in _lines(ray_run)[1:]}) > 1


def test_a_killed_rollout_worker_is_restarted_and_no_rollout_is_lost_or_repeated(ray_local, tmp_path, capsys):
    """SIGKILL the worker process after step 2: Ray restarts it, the backend pushes it the current
    weights and resamples its share, and the run's metrics are those of an undisturbed run."""
    from rlvr.backends.ray import running_engines
    from rlvr.builder.run import train
    from rlvr.config import load_config
    from rlvr.runtime.process import configure_for
    from rlvr.tracking.run_dir import RunDir

    args = [*TINY, _plus_reward(tmp_path), "trainer.steps=5", "trainer.eval_every=2", "trainer.save_every=0"]
    sync_run = _cli_run(tmp_path, capsys, "sync", *args)
    killed = []

    class KillWorker:
        def on_step_end(self, step, metrics):
            if step == 2:
                (engine,) = running_engines()
                pid = engine.worker_pids()[0]
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)

    config = load_config(None, [*args, "trainer.backend=ray", "trainer.max_staleness=0"])
    train(config, RunDir(tmp_path / "ray"), command=["test"], echo=lambda *a: None, callbacks=[KillWorker()],
          runtime=configure_for(config))  # the threads the CLI's run had
    assert killed
    lines = _lines(tmp_path / "ray")
    assert [line["step"] for line in lines] == list(range(6))  # every step once
    assert _trained(sync_run) == _trained(tmp_path / "ray")
    assert lines[-1]["async/worker_restarts"] >= 1


def test_ray_run_resumes_after_kill_9(tmp_path):
    run = tmp_path / "run"
    base = [sys.executable, "-m", "rlvr.cli", "train", *TINY, _plus_reward(tmp_path), "trainer.backend=ray",
            "trainer.max_staleness=1", "trainer.save_every=1", "trainer.eval_every=0", f"trainer.out_dir={tmp_path}",
            "trainer.name=run"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([*base, "trainer.steps=200"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    deadline = time.monotonic() + 600
    # step 2 or later: with save_every=1 and keep_last the first ones are pruned within a few steps
    while not [p for p in (run / "checkpoints").glob("step_*") if p.name[5:].isdigit() and int(p.name[5:]) >= 2]:
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline, "no checkpoint in time"
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    try:  # the killed run's own local Ray (same session) goes with it
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    done = max(int(p.name.split("_")[1]) for p in (run / "checkpoints").glob("step_*"))
    resumed = subprocess.run([sys.executable, "-m", "rlvr.cli", "train", "--resume", str(run),
                              f"trainer.steps={done + 2}"], env=env, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    info = json.loads((run / "run.json").read_text())
    assert info["status"] == "finished" and info["final"]["step"] == done + 2
    assert [line["step"] for line in _lines(run)] == list(range(done + 3))  # none lost, none twice


def _saved_reward_model(tmp_path):
    from _reward_models import save_tiny_reward_model

    return save_tiny_reward_model(tmp_path / "rm")


@pytest.mark.parametrize("workers", [1, 2])
def test_ray_reward_workers_score_a_reward_model_as_the_trainer_does(ray_local, tmp_path, workers):
    """A reward model named in `reward.fn`, loaded in each reward worker from the config: the scores that come
    back (split over two workers in chunks, or whole on one) are the in-process ones."""
    from rlvr.backends.ray import RayReward
    from rlvr.builder import build
    from rlvr.config import load_config
    from rlvr.models.tokenizer import char_tokenizer

    config = load_config(None, [*TINY, f"reward.fn=task, 0.5*{_saved_reward_model(tmp_path)}",
                                "reward.model_batch_size=3"])
    tokenizer = char_tokenizer()
    prompts = [f"{a} {a + 1}>{2 * a + 1}:" for a in range(1, 9)]
    texts = [f"{a}+{a + 1}" if a % 2 else f"{a}*{a}" for a in range(1, 9)]
    examples = [{"answer": f"{a}+{a + 1}", "meta": {}} for a in range(1, 9)]
    here = build.build_verifier(config, tokenizer)(prompts, texts, examples)
    remote = RayReward(functools.partial(build.build_verifier, config), tokenizer, workers=workers)
    try:
        there = remote(prompts, texts, examples)
    finally:
        remote.close()
    assert there.rewards == pytest.approx(here.rewards, abs=1e-6)
    assert there.components["reward_model"] == pytest.approx(here.components["reward_model"], abs=1e-6)
    assert there.metrics["reward_model/raw"] == pytest.approx(here.metrics["reward_model/raw"], abs=1e-6)
    assert len(set(here.components["reward_model"])) == len(texts)  # distinct texts, distinct scores

