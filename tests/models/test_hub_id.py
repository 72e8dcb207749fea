"""`model.path=org/name`: a Hugging Face Hub id, read through the hub cache (HF_HUB_OFFLINE honoured),
tested on a cache built here in the hub's layout (models--org--name/blobs, snapshots/<rev>, refs/main)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import rlvr

ASSET = Path(rlvr.__file__).parent / "assets" / "countdown-warmstart"
REVISION = "0123456789abcdef0123456789abcdef01234567"


def hub_cache(root: Path, repo: str, source: Path) -> Path:
    """`source`'s files as the hub cache holds a download of `repo` at REVISION: content-addressed
    blobs, a snapshot folder of symlinks to them, and refs/main naming the revision."""
    folder = root / ("models--" + repo.replace("/", "--"))
    snapshot = folder / "snapshots" / REVISION
    (folder / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for file in sorted(p for p in source.rglob("*") if p.is_file()):
        data = file.read_bytes()
        blob = folder / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        link = snapshot / file.relative_to(source)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text(REVISION)
    return snapshot


def _run(args: list[str], cache: Path, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache),
           "PYTHONPATH": str(Path(rlvr.__file__).parents[1])}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_a_hub_id_resolves_through_the_cache_offline(tmp_path):
    snapshot = hub_cache(tmp_path / "cache", "acme/countdown-tiny", ASSET)
    code = ("from rlvr.models.causal_lm import resolve_model_path as r; "
            "print(r('acme/countdown-tiny')); print(r('acme/countdown-tiny@" + REVISION + "'))")
    out = _run(["-c", code], tmp_path / "cache", tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == [str(snapshot), str(snapshot)]

    missing = _run(["-m", "rlvr.cli", "train", "model.path=acme/nothing-here"], tmp_path / "cache", tmp_path)
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert ("'acme/nothing-here' is no local directory and not in the Hugging Face cache with HF_HUB_OFFLINE set"
            in missing.stderr)
    # the download hint names the command the installed huggingface-hub ships (`hf`; it dropped `huggingface-cli`)
    assert "(hf download acme/nothing-here)" in missing.stderr
    assert (Path(sys.executable).parent / "hf").is_file()


def test_rlvr_train_on_a_hub_id(tmp_path):
    hub_cache(tmp_path / "cache", "acme/countdown-tiny", ASSET)
    short = ["trainer.steps=1", "trainer.eval_every=0", "task.heldout_size=4", "rollout.prompts_per_step=2",
             "rollout.group_size=2", "trainer.threads=1", "rollout.max_new_tokens=4"]
    run = _run(["-m", "rlvr.cli", "train", "model.path=acme/countdown-tiny", *short], tmp_path / "cache", tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    config = (tmp_path / "runs" / "grpo_countdown_s0" / "config.yaml").read_text()
    assert "path: acme/countdown-tiny" in config
    local = tmp_path / "acme" / "countdown-tiny"  # a local directory of that path is read first, as before
    local.mkdir(parents=True)
    run = _run(["-m", "rlvr.cli", "train", "model.path=acme/countdown-tiny", *short], tmp_path / "cache", tmp_path)
    assert run.returncode == 2 and "no Hugging Face model at 'acme/countdown-tiny' (missing config.json)" in run.stderr
