"""Data-parallel learners: `torchrun --nproc_per_node 2 -m rlvr.cli train` (FSDP2 over gloo, one
thread per rank) against one process on the same global batch.

Each rank samples its share of the rows with the seeds the single process gives them and the
update splits the rows with the global counts, so the two runs' metrics and weights agree to
float rounding (the sharded run takes the plain `transformers` forward, the single process the
fused fast path). Checkpoints hold the gathered weights and the optimizer's shards: one process
resumes a 2-rank run, and 2 ranks resume their own and a 1-process run's, onto the same step as a
1-process resume.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from _learners import (
    EVERY_STEP,
    SMALL,
    SRC,
    checkpoint_weights,
    run_metrics,
    same_lines,
    same_weights,
    torchrun,
    warm_start,
)
from safetensors.torch import load_file

from rlvr.cli import main
from rlvr.errors import LearnerLost, RunInterrupted

# A reward with variance in every group; with the file `armed` beside it, rank 1 kills itself (SIGKILL)
# at its KILL_AT-th call (after the first step's checkpoint), disarming it first so that the resume runs through.
REWARD = """
import os, signal
from pathlib import Path

CALLS = [0]
ARMED = Path(__file__).with_name("armed")


def score(prompt, completion, **example):
    CALLS[0] += 1
    if os.environ.get("RANK") == "1" and CALLS[0] == {kill_at} and ARMED.exists():
        ARMED.unlink()
        os.kill(os.getpid(), signal.SIGKILL)
    return float(len(completion) % 3 == 0)
"""
KILL_AT = 40


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A 2-rank run and a 1-process run of 3 steps on the same global batches."""
    root = tmp_path_factory.mktemp("learners")
    (root / "reward.py").write_text(REWARD.format(kill_at=KILL_AT))
    common = [f"reward.fn={root / 'reward.py'}:score", f"trainer.out_dir={root}", *SMALL]
    done = torchrun("trainer.steps=3", "trainer.name=two", *common)
    assert done.returncode == 0, done.stderr[-3000:]
    assert main(["train", "trainer.steps=3", "trainer.name=one", "trainer.threads=1", *common]) == 0
    return root / "two", root / "one", done


def test_two_ranks_train_as_one_process_on_the_same_global_batch(runs):
    two, one, done = runs
    same_lines(run_metrics(two), run_metrics(one))
    assert len(run_metrics(two)) == 4  # rank 0 alone wrote: one line per step, step 0's evaluation first
    assert done.stdout.count("done: step 3") == 1  # one rank speaks for the run
    assert json.loads((two / "run.json").read_text())["runtime"]["learners"] == 2
    same_weights(checkpoint_weights(two, 3), checkpoint_weights(one, 3), warm_start())


@pytest.mark.slow
def test_two_ranks_train_a_diffusion_model_as_one_process(tmp_path):
    """The same for the masked-diffusion model: each row's masks are a function of its tokens and
    the step's seed, so the ranks' shares of a batch draw the single process's masks."""
    recipe = SRC.parent / "recipes" / "dllm_diffu_grpo_countdown.yaml"
    common = [str(recipe), "trainer.steps=3", f"trainer.out_dir={tmp_path}", *SMALL[:-1]]  # its own lengths
    done = torchrun(*common, "trainer.name=two")
    assert done.returncode == 0, done.stderr[-3000:]
    assert main(["train", *common, "trainer.name=one", "trainer.threads=1"]) == 0
    same_lines(run_metrics(tmp_path / "two"), run_metrics(tmp_path / "one"))
    start = load_file(str(SRC / "rlvr" / "assets" / "countdown-dllm-warmstart" / "model.safetensors"))
    same_weights(checkpoint_weights(tmp_path / "two", 3), checkpoint_weights(tmp_path / "one", 3), start)


def _plain(*args: str) -> subprocess.CompletedProcess:
    """`python -m rlvr.cli train` in a process of its own (no torchrun), one thread."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "rlvr.cli", "train", *args], env=env, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.slow
def test_one_forced_fsdp_process_trains_as_the_plain_process(runs):
    """`trainer.learners=fsdp` without torchrun: a process group of one (gloo), the model's
    layers FSDP2-sharded over it, sampling from its plain copy; the same metrics and weights as
    the plain process (the path the GPU check runs on one device)."""
    _, one, _ = runs
    root = one.parent
    done = _plain("trainer.steps=3", "trainer.name=forced", "trainer.learners=fsdp", "trainer.threads=1",
                  f"reward.fn={root / 'reward.py'}:score", f"trainer.out_dir={root}", *SMALL)
    assert done.returncode == 0, done.stderr[-3000:]
    forced = root / "forced"
    assert json.loads((forced / "run.json").read_text())["runtime"]["fsdp"] is True
    assert (forced / "checkpoints" / "step_000003" / "optimizer" / ".metadata").is_file()  # the sharded save
    same_lines(run_metrics(forced), run_metrics(one))
    same_weights(checkpoint_weights(forced, 3), checkpoint_weights(one, 3), warm_start())


@pytest.mark.slow
def test_two_ranks_share_the_no_grad_passes_and_train_as_one_process(tmp_path):
    """Two minibatches a step (the old-policy pass runs) and a KL penalty (the reference pass runs):
    each rank computes its rows' log-probs and the shares are all-gathered; the metrics and weights
    are the single process's, which computes the whole batch."""
    (tmp_path / "reward.py").write_text(REWARD.format(kill_at=KILL_AT))
    common = ["trainer.steps=3", "trainer.minibatches=2", "algo.kl_coef=0.05", f"trainer.out_dir={tmp_path}",
              f"reward.fn={tmp_path / 'reward.py'}:score", *SMALL]
    done = torchrun(*common, "trainer.name=two")
    assert done.returncode == 0, done.stderr[-3000:]
    assert main(["train", *common, "trainer.name=one", "trainer.threads=1"]) == 0
    two, one = run_metrics(tmp_path / "two"), run_metrics(tmp_path / "one")
    assert all(m["actor/kl"] > 0 for m in two[1:])  # the reference's log-probs reached the loss
    # abs 1e-5: rollout/mismatch_max_abs, the sampler's log-probs against the old pass's, is rounding
    # itself (3e-6 through the sharded plain forward, 9e-7 through the single process's fused one)
    same_lines(two, one, abs_tol=1e-5)
    same_weights(checkpoint_weights(tmp_path / "two", 3), checkpoint_weights(tmp_path / "one", 3),
                  warm_start())


@pytest.mark.slow
def test_two_bf16_ranks_reducing_in_fp32_train_as_one_bf16_process(tmp_path):
    """bf16 weights on 2 ranks, gradients reduce-scattered in fp32 (`MixedPrecisionPolicy`), against
    one bf16 process: step 1 equal to 1e-5, every step's metrics to 2e-2 relative (bf16 carries 8
    bits: the grad norm of step 2 is 4.22 against 4.28) and the weights after 3 steps to 2e-4
    relative (measured 6.7e-5; the steps moved them by 2.3e-3)."""
    (tmp_path / "reward.py").write_text(REWARD.format(kill_at=KILL_AT))
    common = ["trainer.steps=3", "model.dtype=bfloat16", f"reward.fn={tmp_path / 'reward.py'}:score",
              f"trainer.out_dir={tmp_path}", *SMALL]
    done = torchrun(*common, "trainer.name=two", "trainer.fsdp_param_dtype=bfloat16",
                     "trainer.fsdp_reduce_dtype=float32")
    assert done.returncode == 0, done.stderr[-3000:]
    assert main(["train", *common, "trainer.name=one", "trainer.threads=1"]) == 0
    two, one = run_metrics(tmp_path / "two"), run_metrics(tmp_path / "one")
    same_lines(two[:2], one[:2])
    same_lines(two, one, rel=2e-2, abs_tol=2e-3)
    weights = checkpoint_weights(tmp_path / "two", 3)
    assert all(w.dtype == torch.bfloat16 for w in weights.values())
    same_weights(weights, checkpoint_weights(tmp_path / "one", 3), warm_start(), rel=2e-4)


@pytest.mark.parametrize("override, says", [
    ("trainer.fsdp_cpu_offload=true", "trainer.fsdp_cpu_offload: applies to FSDP2 learners only"),
    ("trainer.fsdp_param_dtype=float16", "trainer.fsdp_param_dtype: must be empty"),
    ("trainer.fsdp_reduce_dtype=fp32", "trainer.fsdp_reduce_dtype: must be empty"),
])
def test_fsdp_options_out_of_place_are_one_line(override, says, tmp_path, capsys):
    assert main(["train", "trainer.steps=1", override, f"trainer.out_dir={tmp_path}", *SMALL]) != 0
    assert capsys.readouterr().err.startswith(f"error: {says}")


def _resumed(run: Path, into: Path, ranks: int) -> Path:
    """A copy of `run` resumed to step 4 by one process (in this one) or by `ranks` ranks."""
    shutil.copytree(run, into)
    if ranks == 1:
        assert main(["train", "--resume", str(into), "trainer.steps=4"]) == 0
    else:
        done = torchrun("--resume", str(into), "trainer.steps=4", ranks=ranks)
        assert done.returncode == 0, done.stderr[-3000:]
    return into


def _same_resume(resumed: Path, reference: Path, start: Path) -> None:
    same_lines(run_metrics(resumed), run_metrics(reference))
    same_weights(checkpoint_weights(resumed, 4), checkpoint_weights(reference, 4), checkpoint_weights(start, 3))


@pytest.mark.slow
def test_two_ranks_train_lora_adapters_as_one_process_and_one_process_resumes_them(tmp_path):
    """LoRA: only the adapters train and travel to the ranks' full copies; the checkpoints hold
    the adapter, and one process resumes the 2-rank run onto the 1-process resume's step 4."""
    common = [f"trainer.out_dir={tmp_path}", "model.lora.r=4", "optim.lr=1e-3", *SMALL]
    done = torchrun("trainer.steps=3", "trainer.name=two", *common)
    assert done.returncode == 0, done.stderr[-3000:]
    assert main(["train", "trainer.steps=3", "trainer.name=one", "trainer.threads=1", *common]) == 0
    runs = {name: tmp_path / name for name in ("two", "one")}
    same_lines(run_metrics(runs["two"]), run_metrics(runs["one"]))
    for name, run in list(runs.items()):
        runs[f"{name}_by_one"] = _resumed(run, tmp_path / f"{name}_by_one", 1)
    same_lines(run_metrics(runs["two_by_one"]), run_metrics(runs["one_by_one"]))
    for step, (a, b) in ((3, ("two", "one")), (4, ("two_by_one", "one_by_one"))):
        ours, theirs = (load_file(str(runs[n] / "checkpoints" / f"step_{step:06d}" / "adapter_model.safetensors"))
                        for n in (a, b))
        assert ours.keys() == theirs.keys() and any("lora_B" in k for k in ours)
        for name in ours:
            assert float((ours[name] - theirs[name]).norm()) <= 1e-5 * float(theirs[name].norm()), name
        assert all(float(v.norm()) > 0 for k, v in ours.items() if "lora_B" in k)  # B starts at 0: it trained


def test_a_two_rank_checkpoint_resumes_in_one_process(runs, tmp_path):
    """Step 4 from the 2-rank run's step-3 checkpoint (gathered weights, optimizer shards) resumed
    by one process equals step 4 of the 1-process run resumed from its own checkpoint."""
    two, one, _ = runs
    _same_resume(_resumed(two, tmp_path / "two_by_one", 1), _resumed(one, tmp_path / "one_by_one", 1), two)


@pytest.mark.slow
def test_two_ranks_resume_their_own_checkpoint_and_a_single_process_one(runs, tmp_path):
    two, one, _ = runs
    reference = _resumed(one, tmp_path / "one_by_one", 1)
    assert (two / "checkpoints" / "step_000003" / "optimizer" / ".metadata").is_file()
    for name, run in (("two_by_two", two), ("one_by_two", one)):
        _same_resume(_resumed(run, tmp_path / name, 2), reference, two)


def test_ranks_times_threads_beyond_the_cores_is_one_line(tmp_path):
    cores = len(os.sched_getaffinity(0))
    done = torchrun(f"trainer.threads={cores}", "trainer.steps=1", f"trainer.out_dir={tmp_path}", *SMALL)
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert lines and lines[0].startswith("error: trainer.threads: 2 ranks x"), done.stderr[-2000:]


@pytest.mark.slow
def test_a_killed_rank_is_one_line_naming_it_and_the_resume_continues_the_run(runs):
    """kill -9 of rank 1 mid-run: rank 0 stops with one line naming rank 1; resumed by 2 ranks
    from its last checkpoint, the run's metrics and weights are the uninterrupted run's."""
    two, _, _ = runs
    root = two.parent
    (root / "armed").touch()
    killed = torchrun("trainer.steps=3", "trainer.name=killed", f"reward.fn={root / 'reward.py'}:score",
                       f"trainer.out_dir={root}", *EVERY_STEP)
    assert killed.returncode != 0 and not (root / "armed").exists()
    ours = [line for line in killed.stderr.splitlines() if line.startswith("error:")]
    assert len(ours) == 1 and ours[0].startswith("error: learner rank 0: rank(s) 1 stopped"), killed.stderr[-3000:]
    run = root / "killed"
    assert json.loads((run / "run.json").read_text())["status"] == "failed"
    saved = [int(p.name.removeprefix("step_")) for p in sorted((run / "checkpoints").glob("step_*"))]
    assert saved and saved[-1] < 3  # stopped mid-run, after a checkpoint
    resumed = torchrun("--resume", str(run), "trainer.steps=3")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    same_lines(run_metrics(run), run_metrics(two))
    same_weights(checkpoint_weights(run, 3), checkpoint_weights(two, 3), warm_start())


# The same reward sending SIGTERM to rank 1 alone (what a scheduler signalling one process does)
TERM = REWARD.format(kill_at=20).replace("SIGKILL", "SIGTERM")  # its 20th call: step 2's batch


@pytest.mark.slow
def test_a_signal_to_one_rank_stops_every_rank_after_the_same_step_and_the_resume_continues(runs):
    """SIGTERM to rank 1 while it scores step 2: the ranks agree at the step's end, so both stop
    after step 2 (none waits in step 3's collectives for the other), checkpoint it and record
    `interrupted`; resumed by 2 ranks, the run's metrics and weights are the uninterrupted run's."""
    two, _, _ = runs
    root = two.parent
    (root / "term.py").write_text(TERM)
    (root / "armed").touch()
    stopped = torchrun("trainer.steps=3", "trainer.name=stopped", f"reward.fn={root / 'term.py'}:score",
                        f"trainer.out_dir={root}", *EVERY_STEP)
    assert stopped.returncode != 0 and not (root / "armed").exists()
    assert "error:" not in stopped.stderr, stopped.stderr[-3000:]
    run = root / "stopped"
    manifest = json.loads((run / "run.json").read_text())
    assert (manifest["status"], manifest["signal"], manifest["final"]["step"]) == ("interrupted", "SIGTERM", 2)
    assert [m["step"] for m in run_metrics(run)] == [0, 1, 2]
    resumed = torchrun("--resume", str(run), "trainer.steps=3")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    same_lines(run_metrics(run), run_metrics(two))
    same_weights(checkpoint_weights(run, 3), checkpoint_weights(two, 3), warm_start())


HANG = """
import os, time

CALLS = [0]


def score(prompt, completion, **example):
    CALLS[0] += 1
    if os.environ.get("RANK") == "1" and CALLS[0] == 20:  # step 2's batch (16 rows a step): rank 1 hangs
        time.sleep(600)
    return float(len(completion) % 3 == 0)
"""


@pytest.mark.slow
def test_a_hung_rank_is_one_line_naming_it_after_the_collective_timeout(tmp_path):
    """Rank 1 sleeps while scoring step 2 (its heartbeat still beats): rank 0 waits in the
    update's collective for `trainer.collective_timeout_s`, then stops with one line naming
    rank 1 by its progress (still at step 2's rollout, rank 0 at its update)."""
    (tmp_path / "hang.py").write_text(HANG)
    done = torchrun("trainer.steps=3", "trainer.collective_timeout_s=10", "reward.timeout_s=0",
                     f"reward.fn={tmp_path / 'hang.py'}:score",
                     f"trainer.out_dir={tmp_path}", *SMALL)
    assert done.returncode != 0
    ours = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(ours) == 1, done.stderr[-3000:]
    assert ours[0].startswith("error: learner rank 0: rank(s) 1 hung (rank 1 at step 2 rollout, rank 0 at step 2 "), \
        ours[0]


def test_what_learners_do_not_support_yet_is_one_line(tmp_path):
    done = torchrun("rollout.engine=vllm", "trainer.max_staleness=0", "trainer.steps=1", f"trainer.out_dir={tmp_path}",
                    *SMALL)
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert lines and lines[0].startswith("error: rollout.engine: an engine with its own weights under "
                                         "trainer.max_staleness is not supported with 2 data-parallel"), \
        done.stderr[-2000:]


RAY_LEARNERS = ["trainer.backend=ray", "trainer.learners=fsdp", "trainer.ray_learners=2", "trainer.threads=1"]


@pytest.mark.ray
@pytest.mark.slow
def test_two_ray_learner_actors_train_as_one_process(runs):
    """`trainer.backend=ray trainer.ray_learners=2`: Ray starts the two ranks as actors in a placement
    group (1 CPU each, a local Ray on 2 CPUs) with torchrun's environment; rank 0 writes the run,
    whose metrics and weights are the single process's."""
    _, one, _ = runs
    root = one.parent
    done = _plain("trainer.steps=3", "trainer.name=ray", *RAY_LEARNERS, f"reward.fn={root / 'reward.py'}:score",
                  f"trainer.out_dir={root}", *SMALL)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("done: step 3") == 1
    ray_run = root / "ray"
    assert json.loads((ray_run / "run.json").read_text())["runtime"]["learners"] == 2
    assert len(run_metrics(ray_run)) == 4
    same_lines(run_metrics(ray_run), run_metrics(one))
    same_weights(checkpoint_weights(ray_run, 3), checkpoint_weights(one, 3), warm_start())


@pytest.mark.ray
@pytest.mark.slow
def test_a_ray_learner_rank_s_error_is_the_driver_s_one_line(tmp_path):
    done = _plain("trainer.max_staleness=1", "trainer.steps=1", *RAY_LEARNERS, f"trainer.out_dir={tmp_path}", *SMALL)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith(
        "error: trainer.staleness: 2 data-parallel learners overlapping the update (max_staleness 1)"), \
        done.stderr[-2000:]


def test_ray_learners_stopped_by_a_signal_are_the_driver_s_interruption():
    """Every rank returned the stop they agreed on: the driver raises it, exit status and all; a
    rank that failed otherwise makes the run's line that rank's."""
    from rlvr.backends.ray_learners import outcome

    with pytest.raises(RunInterrupted) as stopped:
        outcome([("interrupted", "SIGTERM", 143, 2), ("interrupted", "SIGTERM", 143, 2)])
    assert (stopped.value.exit_status, str(stopped.value)) == (143, "SIGTERM: run interrupted after step 2")
    with pytest.raises(LearnerLost, match="rank 1 died"):
        outcome([("interrupted", "SIGTERM", 143, 2), ("died", "rank 1 died")])


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.parametrize(("name", "to_group", "status"), [
    ("SIGTERM", False, 143),  # to the driver alone, as a scheduler's kill sends it
    ("SIGINT", True, 130),  # Ctrl-C in a terminal: to the whole foreground process group, Ray's own processes too
])
def test_a_signal_to_the_ray_driver_stops_its_learner_ranks_after_their_step(runs, name, to_group, status):
    """The signal once rank 0 has logged step 1 (no torchrun): the driver passes it to the ranks
    through rank 0's store, they stop after the same step, checkpoint it, record `interrupted` and
    the driver exits as one process would (143, 130); after Ctrl-C no process of the group is left."""
    _, one, _ = runs
    root = one.parent
    run = root / f"ray_stopped_{name}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "rlvr.cli", "train", "trainer.steps=20", f"trainer.name={run.name}",
               *RAY_LEARNERS, f"reward.fn={root / 'reward.py'}:score", f"trainer.out_dir={root}", *EVERY_STEP]
    driver = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              start_new_session=True)  # its own process group, as a terminal's foreground job
    deadline = time.monotonic() + 240
    while not ((run / "metrics.jsonl").is_file() and len(run_metrics(run)) >= 2) and time.monotonic() < deadline:
        assert driver.poll() is None, driver.communicate()[1][-3000:]
        time.sleep(0.5)
    if to_group:
        os.killpg(driver.pid, getattr(signal, name))
    else:
        driver.send_signal(getattr(signal, name))
    _, err = driver.communicate(timeout=240)
    assert driver.returncode == status, err[-3000:]
    manifest = json.loads((run / "run.json").read_text())
    assert (manifest["status"], manifest["signal"]) == ("interrupted", name), err[-3000:]
    step = manifest["final"]["step"]
    assert 1 <= step < 20 and (run / "checkpoints" / f"step_{step:06d}").is_dir()
    assert [m["step"] for m in run_metrics(run)] == list(range(step + 1))
    if to_group:
        assert _group_gone(driver.pid), "a process of the interrupted run's group is still alive"


def _group_gone(pgid: int, wait_s: float = 30.0) -> bool:
    """Whether every process of group `pgid` has exited (Ray's own take a moment after the driver)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.5)
    return False


@pytest.mark.ray
@pytest.mark.slow
def test_a_killed_ray_learner_actor_is_the_driver_s_one_line_and_the_resume_continues(runs):
    """kill -9 of rank 1's actor process mid-run: the driver ends with one line naming rank 1 (rank
    0's lost peer), run.json says `failed`, and the resume on Ray continues to the uninterrupted run."""
    two, _, _ = runs
    root = two.parent
    (root / "armed").touch()
    common = [*RAY_LEARNERS, f"reward.fn={root / 'reward.py'}:score", f"trainer.out_dir={root}"]
    killed = _plain("trainer.steps=3", "trainer.name=ray_killed", *common, *EVERY_STEP)
    assert killed.returncode == 2 and not (root / "armed").exists(), killed.stderr[-3000:]
    last = killed.stderr.strip().splitlines()[-1]
    assert last.startswith("error: learner rank 0: rank(s) 1 stopped"), killed.stderr[-3000:]
    run = root / "ray_killed"
    assert json.loads((run / "run.json").read_text())["status"] == "failed"
    resumed = _plain("--resume", str(run), "trainer.steps=3", *RAY_LEARNERS)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    same_lines(run_metrics(run), run_metrics(two))
