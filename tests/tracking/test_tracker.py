"""Every sink receives the same metric series as metrics.jsonl (read back with each tool's own reader)."""

from __future__ import annotations

import importlib.util
import json
import struct
from pathlib import Path

import numpy as np
import pytest

from rlvr.errors import ConfigError, DiskFull
from rlvr.safe_io import free_space
from rlvr.tracking.tracker import JsonlTracker, Tracker, make_trackers, mlflow_key

CONFIG = {"seed": 3, "algo": {"objective": "ppo_clip", "clip_high": 0.28}, "trainer": {"steps": 6}}


def _series() -> list[dict]:
    """Per-step metrics as the trainer logs them: eval keys only on some steps, negative and tiny values."""
    rng = np.random.default_rng(0)
    lines = [{"step": 0, "eval/heldout_accuracy": 0.125}]
    for step in range(1, 7):
        line = {"step": step, "reward/mean": float(rng.random()), "loss/policy": float(-rng.random() * 1e-3),
                "response/length_max": 16}
        if step % 3 == 0:
            line["eval/heldout_accuracy"] = float(rng.random())
        lines.append(line)
    return lines


def _by_key(lines: list[dict]) -> dict[str, list[tuple[int, float]]]:
    out: dict[str, list[tuple[int, float]]] = {}
    for line in lines:
        for key, value in line.items():
            if key != "step":
                out.setdefault(key, []).append((line["step"], float(value)))
    return out


def _read_tensorboard(run: Path) -> dict:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _read_mlflow(run: Path) -> dict:
    from mlflow.tracking import MlflowClient

    run_id = json.loads((run / "trackers.json").read_text())["mlflow_run_id"]
    client = MlflowClient(tracking_uri=(run / "mlruns").resolve().as_uri())
    keys = client.get_run(run_id).data.metrics
    return {k: sorted((m.step, m.value) for m in client.get_metric_history(run_id, k)) for k in keys}


def _leveldb_records(path: Path):
    """Records of a W&B `.wandb` file: LevelDB log format (32 KiB blocks, 7-byte headers) after a 7-byte magic."""
    data, pos, block, pending = path.read_bytes(), 7, 32768, b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 0 and length == 0:
            continue
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            yield pending


def _read_wandb(run: Path) -> dict:
    from wandb.proto import wandb_internal_pb2

    out: dict[str, list] = {}
    for file in sorted(run.glob("wandb/offline-run-*/run-*.wandb")):
        for raw in _leveldb_records(file):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(raw)
            if record.WhichOneof("record_type") != "history":
                continue
            items = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            step = items.pop("_step")
            for key, value in items.items():
                if not key.startswith("_"):
                    out.setdefault(key, []).append((step, float(value)))
    return out


READERS = {"tensorboard": _read_tensorboard, "wandb": _read_wandb, "mlflow": _read_mlflow}


@pytest.mark.parametrize("sink", list(READERS))
def test_sink_receives_the_jsonl_series(sink, tmp_path):
    pytest.importorskip(sink)
    run = tmp_path / "grpo_s3"
    run.mkdir()
    trackers = make_trackers([sink], run)
    assert [t.name for t in trackers] == ["jsonl", sink] and all(isinstance(t, Tracker) for t in trackers)
    for tracker in trackers:
        tracker.log_config(CONFIG)
    for line in _series():
        for tracker in trackers:
            tracker.log_metrics(line["step"], {k: v for k, v in line.items() if k != "step"})
    for tracker in trackers:
        tracker.close()

    jsonl = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert jsonl == _series()
    want, got = _by_key(jsonl), READERS[sink](run)
    if sink == "mlflow":  # its file store makes each `/` a folder: the area, then `.`
        want = {mlflow_key(k): v for k, v in want.items()}
    assert sorted(got) == sorted(want)
    for key, points in want.items():
        assert [s for s, _ in got[key]] == [s for s, _ in points], key
        values = [v for _, v in points]
        if sink == "tensorboard":  # TensorBoard stores scalars as float32
            values = [float(np.float32(v)) for v in values]
        assert [v for _, v in got[key]] == values, key


def test_mlflow_keeps_a_metric_beside_its_breakdown(tmp_path):
    """The trainer logs `perf/peak_rss_mb` and `perf/peak_rss_mb/rollout` in one step: in MLflow's file
    store the first is a file where the second needs a folder (NotADirectoryError on every run)."""
    pytest.importorskip("mlflow")
    sink = make_trackers(["mlflow"], tmp_path)[1]
    for step in (1, 2):
        sink.log_metrics(step, {"perf/peak_rss_mb": 100.0 + step, "perf/peak_rss_mb/rollout": 50.0 + step})
    sink.close()
    assert _read_mlflow(tmp_path) == {"perf/peak_rss_mb": [(1, 101.0), (2, 102.0)],
                                      "perf/peak_rss_mb.rollout": [(1, 51.0), (2, 52.0)]}


def test_tensorboard_resume_drops_steps_past_the_checkpoint(tmp_path):
    pytest.importorskip("tensorboard")
    first = make_trackers(["tensorboard"], tmp_path)[1]
    for step in range(1, 6):
        first.log_metrics(step, {"reward/mean": 0.0})
    first.close()  # killed after step 5; the newest checkpoint is step 3
    resumed = make_trackers(["tensorboard"], tmp_path, resume_step=3)[1]
    for step in (4, 5):
        resumed.log_metrics(step, {"reward/mean": 1.0})
    resumed.close()
    assert _read_tensorboard(tmp_path)["reward/mean"] == [(1, 0.0), (2, 0.0), (3, 0.0), (4, 1.0), (5, 1.0)]


def test_unknown_or_uninstalled_sink_is_a_config_error(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="unknown tracker 'tensorbord'; valid: jsonl, tensorboard"):
        make_trackers(["tensorbord"], tmp_path)
    monkeypatch.setitem(__import__("sys").modules, "wandb", None)  # as if not installed
    with pytest.raises(ConfigError, match=r"pip install 'rlvr\[wandb\]'"):
        make_trackers(["wandb"], tmp_path)
    assert [type(t) for t in make_trackers(["jsonl"], tmp_path)] == [JsonlTracker]


def test_optional_packages_are_imported_lazily():
    """Importing the tracking modules and the runs CLI pulls in no sink, plotting or torch package."""
    import subprocess
    import sys

    heavy = ("wandb", "mlflow", "tensorboard", "matplotlib", "torch", "transformers")
    code = ("import sys, rlvr.cli_runs, rlvr.tracking.tracker, rlvr.tracking.report, rlvr.tracking.export, "
            f"rlvr.tracking.runs, rlvr.tracking.plots; print([m for m in {heavy!r} if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("sink", list(READERS))
def test_a_full_disk_is_one_diskfull_line_and_spares_what_was_written(sink, tmpfs, fill_disk):
    """The mirror's writers (TensorBoard's thread, W&B's service, MLflow's file store) on a full
    disk: the one-line DiskFull metrics.jsonl gives, for a metric write and for close, and every
    byte already on disk kept (the files only ever grew), readable by the tool afterwards."""
    if importlib.util.find_spec(sink) is None:
        pytest.skip(f"the {sink} package is not installed")
    disk = tmpfs("4m")
    run = disk / "grpo_s3"
    run.mkdir()
    mirror = make_trackers([sink], run)[1]
    try:
        mirror.log_config(CONFIG)
        series = _series()
        for line in series[:4]:
            mirror.log_metrics(line["step"], {k: v for k, v in line.items() if k != "step"})
        if sink == "tensorboard":
            mirror.inner.writer.flush()
        written = {path: path.read_bytes() for path in run.rglob("*") if path.is_file()}
        fill_disk(disk)
        with pytest.raises(DiskFull) as logging:
            for line in series[4:]:
                mirror.log_metrics(line["step"], {k: v for k, v in line.items() if k != "step"})
        with pytest.raises(DiskFull) as closing:
            mirror.close()  # MLflow would rewrite its run's meta.yaml in place: refused, not torn
        for err in (logging, closing):
            message = str(err.value)
            assert "\n" not in message and message == (
                f"disk full: no space left on the device of '{run}' while training (writing the {sink} logs); "
                f"free space there ({free_space(run)} now), then continue with rlvr train --resume {run}")
        for path, data in written.items():
            assert path.read_bytes()[:len(data)] == data, f"{path.relative_to(run)} was rewritten"
    finally:
        (disk / "filler").unlink(missing_ok=True)
        mirror.inner.close()  # with room again, the run is still the tool's to read
    got, want = READERS[sink](run), _by_key(series[:4])
    if sink == "tensorboard":  # float32 scalars
        want = {k: [(step, float(np.float32(v))) for step, v in points] for k, points in want.items()}
    if sink == "wandb":  # its service may not have written every step before the disk filled
        want = {k: [p for p in points if p in got[k]] for k, points in want.items() if k in got}
    assert got == want
