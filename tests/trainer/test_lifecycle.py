"""The run lifecycle: SIGTERM/SIGINT end a run cleanly (run.json `interrupted` with the signal,
exit 143/130, a checkpoint that --resume continues from), never leaving `status: running`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

TINY = ["model.path=", "rollout.prompts_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=4",
        "task.heldout_size=4", "trainer.threads=1"]


def _default_signals() -> None:
    """The child gets the dispositions of a run started from a terminal: a test suite started in
    the background (nohup, a CI runner) passes SIGINT on as ignored, which the run keeps."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)


def _cli(*args: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "rlvr.cli", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, preexec_fn=_default_signals)


def _wait_for_a_step(run: Path, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        metrics = run / "metrics.jsonl"
        if metrics.exists() and any(json.loads(line).get("step", 0) >= 1
                                    for line in metrics.read_text().splitlines() if line.strip()):
            return
        assert proc.poll() is None, proc.communicate()[0]
        time.sleep(0.05)
    proc.kill()
    pytest.fail("no training step was logged in time")


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_ends_the_run_cleanly_and_resume_continues(tmp_path, sig, code):
    run = tmp_path / "run"
    proc = _cli("train", *TINY, "trainer.steps=200", f"trainer.out_dir={tmp_path}", "trainer.name=run")
    _wait_for_a_step(run, proc)
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == code, out
    assert f"stopped by {sig.name} after step" in out and "Traceback" not in out
    info = json.loads((run / "run.json").read_text())
    assert info["status"] == "interrupted" and info["signal"] == sig.name and info["exit_status"] == code
    stopped_at = info["final"]["step"]
    assert stopped_at >= 1 and (run / "checkpoints" / f"step_{stopped_at:06d}").is_dir()

    resumed = _cli("train", "--resume", str(run), f"trainer.steps={stopped_at + 1}")
    out, _ = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, out
    info = json.loads((run / "run.json").read_text())
    assert info["status"] == "finished" and info["final"]["step"] == stopped_at + 1
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(stopped_at + 2))  # 0 (warm start) .. stopped_at + 1, none twice


def test_handlers_are_restored_after_training(tmp_path):
    from rlvr.builder.run import train
    from rlvr.config import load_config
    from rlvr.tracking.run_dir import RunDir

    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    config = load_config(None, [*TINY, "trainer.steps=1"])
    train(config, RunDir(tmp_path / "run"), command=["test"], echo=lambda *a: None)
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def _short_run(tmp_path, capsys, *extra: str) -> Path:
    from rlvr.cli import main

    args = ["train", *TINY, "trainer.steps=2", f"trainer.out_dir={tmp_path}", "trainer.name=r", *extra]
    assert main(args) == 0, capsys.readouterr().err
    capsys.readouterr()
    return tmp_path / "r"


def test_resume_removes_stale_temp_checkpoints(tmp_path, capsys):
    from rlvr.cli import main

    run = _short_run(tmp_path, capsys)
    stale = run / "checkpoints" / ".tmp_step_000003"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"torn")
    assert main(["train", "--resume", str(run), "trainer.steps=3"]) == 0, capsys.readouterr().err
    assert not stale.exists() and (run / "checkpoints" / "step_000003").is_dir()


def test_resume_with_a_changed_config_is_refused_or_recorded(tmp_path, capsys):
    from rlvr.cli import main

    run = _short_run(tmp_path, capsys)
    assert main(["train", "--resume", str(run), "trainer.steps=3", "optim.lr=1e-3", "seed=9"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: resume: the config differs")
    assert "optim.lr" in err and "seed (0 -> 9)" in err and "trainer.steps" not in err
    assert "--allow-config-change" in err
    assert json.loads((run / "run.json").read_text())["status"] == "finished"  # untouched

    argv = ["train", "--resume", str(run), "trainer.steps=3", "optim.lr=1e-3", "--allow-config-change"]
    assert main(argv) == 0, capsys.readouterr().err
    info = json.loads((run / "run.json").read_text())
    assert info["status"] == "finished" and info["final"]["step"] == 3
    [change] = info["config_changes"]
    assert change["resumed_at"] == 2 and list(change["changes"]) == ["optim.lr"]
    assert change["changes"]["optim.lr"]["to"] == 1e-3 and change["command"]
    assert main(["train", "--allow-config-change", "trainer.steps=1"]) == 2
    assert "only applies with --resume" in capsys.readouterr().err


def test_resume_of_a_finished_run_says_so_in_one_line(tmp_path, capsys):
    from rlvr import Trainer
    from rlvr.cli import main

    run = _short_run(tmp_path, capsys)
    before = (run / "run.json").read_text()
    assert main(["train", "--resume", str(run)]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and out.startswith("nothing to train:") and "step 2 of trainer.steps=2" in out
    assert "nan" not in out and "None" not in out
    assert (run / "run.json").read_text() == before  # a no-op resume leaves the record alone
    lines = []
    final = Trainer(resume=run, echo=lines.append).train()
    assert final["step"] == 2 and len(lines) == 1 and lines[0].startswith("nothing to train")


def test_trainer_allow_config_change_argument(tmp_path, capsys):
    from rlvr import Trainer
    from rlvr.errors import ConfigError

    run = _short_run(tmp_path, capsys)
    with pytest.raises(ConfigError, match=r"differs .* algo.clip_high"):
        Trainer(resume=run, overrides={"algo.clip_high": 0.3, "trainer.steps": 3})
    trainer = Trainer(resume=run, overrides={"algo.clip_high": 0.3, "trainer.steps": 3}, allow_config_change=True,
                      echo=lambda *a: None)
    assert trainer.train()["step"] == 3
    changes = json.loads((run / "run.json").read_text())["config_changes"][0]["changes"]
    assert changes == {"algo.clip_high": {"from": 0.2, "to": 0.3}}
