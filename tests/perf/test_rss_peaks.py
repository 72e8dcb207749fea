"""`runtime.memory.RssPeaks`: each phase's own peak resident set, and the lifetime one kept."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="Linux high-water mark")


PHASES = """
import torch
from rlvr.runtime.memory import RssPeaks
peaks = RssPeaks()
peaks.begin()
held = torch.ones(256 << 20 >> 2)  # 256 MB, touched
big = peaks.end()
del held  # a large block: glibc's default hands it back to the kernel at once
peaks.begin()
small = peaks.end()  # a phase that allocated nothing: the resident set without it
print(big, small, peaks.lifetime)
"""


def test_a_phase_reports_its_own_peak_and_the_lifetime_peak_is_kept():
    # A fresh process: one that ran a step keeps freed memory mapped (runtime.allocator).
    out = subprocess.run([sys.executable, "-c", PHASES], capture_output=True, text=True, check=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    big, small, lifetime = map(float, out.stdout.split())
    assert big - small > 200
    assert lifetime >= big


def test_the_step_logs_a_peak_per_phase(tmp_path, capsys):
    import json

    from rlvr.cli import main

    args = ["train", "model.path=", "rollout.prompts_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=4",
            "task.heldout_size=4", "trainer.threads=1", "trainer.eval_every=0", "trainer.steps=2",
            f"trainer.out_dir={tmp_path}", "trainer.name=r", "trainer.save_every=0"]
    assert main(args) == 0, capsys.readouterr().err
    line = json.loads((tmp_path / "r" / "metrics.jsonl").read_text().splitlines()[-1])
    phases = {k: v for k, v in line.items() if k.startswith("perf/peak_rss_mb/")}
    assert set(phases) == {f"perf/peak_rss_mb/{p}" for p in ("rollout", "logprob", "update")}
    assert all(0 < v <= line["perf/peak_rss_mb"] for v in phases.values())
