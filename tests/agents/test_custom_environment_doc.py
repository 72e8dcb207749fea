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


def test_the_pages_environment_warm_starts_by_sft_on_its_demonstrations(tmp_path):
    """`sft(config, out, task=ReverseTask(...))`: the page's scripted demonstrator plays the episodes
    and a fresh tiny model learns its actions (the loss on held-out demonstrations falls), saved as a
    model directory that loads."""
    import random

    import torch

    from rlvr.agents.batch import to_rollouts
    from rlvr.agents.collect import demonstrations
    from rlvr.builder.build import build_model
    from rlvr.config import load_config
    from rlvr.models.causal_lm import load_causal_lm
    from rlvr.models.policy import CausalPolicy
    from rlvr.sft.supervised import masked_sft_loss, sft

    scope: dict = {"__name__": "page"}
    exec(_script(), scope)  # the page's classes, without its __main__ block
    task = scope["ReverseTask"](heldout_size=8, max_turns=2, max_total_tokens=48)
    config = load_config(None, ["model.path=", "model.max_seq_len=64", "sft.steps=60", "sft.batch_size=8",
                                "rollout.max_new_tokens=12", "seed=0"])

    def loss_of(model, tokenizer) -> float:  # on the held-out episodes, as the demonstrator plays them
        episodes = demonstrations(task, tokenizer, task.heldout(), random.Random(1))
        with torch.no_grad():
            return float(masked_sft_loss(CausalPolicy(model), to_rollouts(episodes, tokenizer.pad_token_id)))

    torch.manual_seed(0)
    before = loss_of(*build_model(config))
    lines: list[str] = []
    sft(config, tmp_path / "warm", task=task, echo=lines.append)
    after = loss_of(*load_causal_lm(str(tmp_path / "warm"), seed=0))
    assert after < 0.6 * before, (before, after)
    assert any(line.startswith("sft done: greedy held-out accuracy") for line in lines)
