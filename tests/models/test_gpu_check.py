"""bench/gpu_check.sh without a GPU: the script parses, and its dry run (`--device cpu --tiny`)
goes through every part (agreement, GRPO full and LoRA, TRL when installed, the VLM) on the CPU."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from _archs import ROOT

SCRIPT = ROOT / "bench" / "gpu_check.sh"


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_the_gpu_check_script_parses():
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True).returncode == 0


@pytest.mark.slow  # about 150 s on 2 cores: four processes, each importing torch and transformers
@pytest.mark.skipif(shutil.which("timeout") is None, reason="needs coreutils timeout")
def test_the_dry_run_goes_through_every_part_on_the_cpu(tmp_path):
    pytest.importorskip("peft")
    env = {**os.environ, "PYTHON": sys.executable, "NO_INSTALL": "1", "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)}
    done = subprocess.run(["bash", str(SCRIPT), "--device", "cpu", "--tiny"], capture_output=True, text=True,
                          env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith('{"')]  # not TRL's dicts
    by_check = {}
    for r in records:
        by_check.setdefault(r["check"], []).append(r)
    assert not [r for r in records if r.get("failed")], done.stdout[-3000:]
    assert by_check["versions"][0]["torch"] and by_check["logprob_agreement"][0]["ok"]
    assert {r["mode"] for r in by_check["packed_agreement"]} == {"packed", "shared"}
    assert all(r["ok"] for r in by_check["packed_agreement"])
    assert {"full", "lora"} <= {r["mode"] for r in by_check["grpo"]}  # and the fsdp modes
    assert all(r["s_per_step"] > 0 and r["completion_tokens_per_s"] > 0 for r in by_check["grpo"])
    assert len(by_check["build"]) == 1  # built once, reused by the later parts
    assert "trl" in by_check  # a result, or the reason it was skipped
    assert by_check["vlm"][0]["max_rollout_logprob_gap"] < 1e-3 and by_check["vlm_export"][0]["verified"]
