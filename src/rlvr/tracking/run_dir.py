"""The run directory: config.yaml, run.json, metrics.jsonl, samples.jsonl, checkpoints/.

Everything is written so that a crash or a kill never leaves a half-written file behind:
whole files go through a temp file + rename; JSONL files are appended one complete line at a
time and, on resume, cut back to the checkpoint's step.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

PACKAGES = ("torch", "transformers", "tokenizers", "safetensors", "numpy", "pyyaml", "tqdm", "rlvr")


def atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def manifest(command: list[str], seed: int) -> dict:
    """Provenance of a run: what ran, from which code, on what."""
    import torch

    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    sha = _git("rev-parse", "HEAD")
    return {
        "command": command,
        "seed": seed,
        "git_sha": sha,
        "git_dirty": bool(_git("status", "--porcelain")) if sha else None,
        "python": sys.version.split()[0],
        "packages": versions,
        "torch_threads": torch.get_num_threads(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


class RunDir:
    """Paths and append-only logs of one run."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.checkpoints = self.path / "checkpoints"

    @property
    def metrics_file(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def samples_file(self) -> Path:
        return self.path / "samples.jsonl"

    def create(self) -> None:
        self.checkpoints.mkdir(parents=True, exist_ok=True)

    def write_json(self, name: str, data: dict) -> None:
        atomic_write_text(self.path / name, json.dumps(data, indent=2, default=str) + "\n")

    def read_json(self, name: str) -> dict:
        return json.loads((self.path / name).read_text())

    def append(self, file: Path, record: dict) -> None:
        with open(file, "a") as handle:
            handle.write(json.dumps(record, default=float) + "\n")

    def truncate_after(self, step: int) -> None:
        """Drop log lines past `step` (and any torn last line) so a resume never duplicates steps."""
        for file in (self.metrics_file, self.samples_file):
            if not file.exists():
                continue
            kept = []
            for line in file.read_text().splitlines():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if record.get("step", -1) <= step:
                    kept.append(line)
            atomic_write_text(file, "".join(f"{line}\n" for line in kept))

    def read_metrics(self) -> list[dict]:
        if not self.metrics_file.exists():
            return []
        return [json.loads(line) for line in self.metrics_file.read_text().splitlines() if line.strip()]


def now() -> float:
    return time.perf_counter()
