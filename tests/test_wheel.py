"""A plain `pip install .` (a built wheel, not the editable checkout) runs the packaged recipes by
name from an empty folder: every recipe's files resolve inside the installed package, and one file
task and the tiny-Qwen2 wiring recipe train a step."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHORT = ["trainer.steps=1", "trainer.eval_every=0", "task.heldout_size=2", "rollout.prompts_per_step=2",
         "rollout.group_size=2", "trainer.threads=1", "rollout.max_new_tokens=4"]
CHECK = """
import dataclasses, sys
from pathlib import Path
import rlvr
from rlvr.config import load_config
from rlvr.config.recipes import packaged_recipes
from rlvr.models.causal_lm import ASSETS, BUILTIN_PREFIX, REQUIRED
assert "/installed/" in rlvr.__file__, rlvr.__file__
for name in packaged_recipes():
    stack = [load_config(name)]
    while stack:
        node = stack.pop()
        for f in dataclasses.fields(node):
            v = getattr(node, f.name)
            if dataclasses.is_dataclass(v):
                stack.append(v)
            elif f.name in ("path", "heldout_path", "teacher_path") and isinstance(v, str) and v and v != REQUIRED:
                p = ASSETS / v[len(BUILTIN_PREFIX):] if v.startswith(BUILTIN_PREFIX) else Path(v)
                assert p.exists(), (name, v)
print(len(packaged_recipes()))
"""


@pytest.mark.slow
def test_an_installed_wheel_runs_packaged_recipes_from_an_empty_folder(tmp_path):
    wheels, installed, empty = tmp_path / "wheels", tmp_path / "installed", tmp_path / "empty"
    empty.mkdir()
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(wheels)], check=True, capture_output=True, timeout=600)
    wheel, = wheels.glob("rlvr-*.whl")
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(installed), str(wheel)],
                   check=True, capture_output=True, timeout=600)
    env = {**os.environ, "PYTHONPATH": str(installed), "OMP_NUM_THREADS": "1"}

    def run(*args):
        out = subprocess.run([sys.executable, *args], cwd=empty, env=env, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-2000:]
        return out.stdout

    assert int(run("-c", CHECK).split()[-1]) == len(list((ROOT / "recipes").glob("*.yaml")))
    run("-m", "rlvr.cli", "train", "gsm8k_fixture", *SHORT)
    run("-m", "rlvr.models.tiny_archs", "qwen2", str(tmp_path / "tiny-qwen2"))
    run("-m", "rlvr.cli", "train", "gsm8k_tiny_qwen2", f"model.path={tmp_path / 'tiny-qwen2'}", *SHORT)
    assert sorted(p.name for p in (empty / "runs").iterdir()) == ["gsm8k_fixture_s0", "gsm8k_tiny_qwen2_s0"]
