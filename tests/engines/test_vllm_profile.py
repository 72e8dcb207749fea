"""bench/vllm_profile.py's command line at a tiny batch: its table's parts of the engine call add
up to the call, and the step count fits the token budget (about 40 s: a vLLM engine start)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
MAX_NEW = 4


def _ms(table: str, part: str) -> float:
    """The 'ms per call' column of the row named `part` (indented with &nbsp;)."""
    match = re.search(rf"^\| (?:&nbsp;)*{re.escape(part)} \| ([0-9.]+) \|", table, re.MULTILINE)
    assert match, f"no row {part!r} in\n{table}"
    return float(match.group(1))


def test_the_profile_table_accounts_for_the_engine_call():
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run([sys.executable, "bench/vllm_profile.py", "--repeats", "1", "--prompts", "2", "--group",
                          "2", "--max-new-tokens", str(MAX_NEW), "--threads", "1"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    table = out.stdout
    parts = ["rlvr: before generate", "reset_prefix_cache", "LLM.generate", "rlvr: after generate"]
    assert sum(_ms(table, p) for p in parts) == pytest.approx(_ms(table, "engine call"), abs=0.03)
    assert 0 < _ms(table, "model forward") < _ms(table, "runner.execute_model") < _ms(table, "LLM.generate")
    steps = int(re.search(r"model-runner steps per call: (\d+)", table).group(1))
    tokens = int(re.search(r"completion tokens: vLLM (\d+)", table).group(1))
    assert 1 <= steps <= MAX_NEW + 1  # the prefill samples each row's first token, one decode step per token after
    assert 4 <= tokens <= 4 * MAX_NEW  # vLLM's: 2 prompts x 2 rows
