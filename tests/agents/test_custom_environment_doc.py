"""docs/custom-environment.md: its environment (one tool, from scratch) runs as written, plays an
episode by hand, and trains through `rlvr.Trainer`; an environment passed without its task is refused."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import rlvr
from rlvr.errors import ConfigError

PAGE = Path(__file__).resolve().parents[2] / "docs" / "custom-environment.md"


def _script() -> str:
    return re.search(r"```python\n(.*?)```", PAGE.read_text(), re.DOTALL).group(1)


def test_the_pages_environment_is_short_and_runs(tmp_path):
    script = _script()
    assert len(script.splitlines()) < 60
    run = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(Path(rlvr.__file__).parents[1])})
    assert run.returncode == 0, run.stderr[-2000:]
    first = run.stdout.splitlines()
    assert first[0].startswith("reverse ")
    assert "StepResult(observation='cba', reward=0.0, done=False" in run.stdout  # the tool reversed "abc"
    assert "reward=1.0, done=True, info={'success': True" in run.stdout  # the right answer ends the episode
    assert "done: step 2" in run.stdout and "'agent/finish_" in run.stdout
    assert (tmp_path / "runs" / "grpo_task_s0" / "metrics.jsonl").is_file()


def test_an_environment_without_its_task_is_refused():
    from rlvr import Trainer

    namespace: dict = {}
    exec(_script().split('if __name__ == "__main__":')[0], namespace)
    with pytest.raises(ConfigError) as err:
        Trainer("", train_dataset=namespace["ReverseEnv"]())
    assert "ReverseEnv is an environment (reset/step), not a task; wrap it" in str(err.value)
    assert "docs/custom-environment.md" in str(err.value) and "\n" not in str(err.value)
    task = namespace["ReverseTask"](heldout_size=4)
    assert len(task.heldout()) == 4 and task.heldout()[0].prompt.startswith("reverse ")
