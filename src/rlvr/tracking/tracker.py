"""Metric sinks behind one small protocol: JSONL always, mirrors optional.

| name          | where it writes (inside the run directory) | extra                  |
|---------------|--------------------------------------------|------------------------|
| `jsonl`       | metrics.jsonl (always on, the source of truth) | -                  |
| `tensorboard` | tensorboard/ event files                   | `pip install rlvr[tensorboard]` |
| `wandb`       | wandb/ offline run (`WANDB_MODE=online` to upload; `wandb sync` later) | `rlvr[wandb]` |
| `mlflow`      | mlruns/ local file store (`mlflow ui --backend-store-uri RUN/mlruns`) | `rlvr[mlflow]` |

A full disk is the same one-line `DiskFull` for a mirror as for metrics.jsonl (`_DiskGuard`): a
mirror writes nothing once the run's disk has no room left (TensorBoard writes from a thread and
W&B from its service process; W&B drops records on a full disk without a word, so the disk is
checked before every write, not only the error translated), and a write that fails anyway is
reported as the full disk it is.

Each optional package is imported only when its sink is built. Run ids of the mirrors are kept
in `trackers.json` so a resumed run continues the same W&B / MLflow run. On resume TensorBoard
drops events past the checkpoint (`purge_step`), as metrics.jsonl does; W&B and MLflow cannot
delete, so steps logged between the last checkpoint and a crash appear there twice (the later
value is the one that counts).
"""

from __future__ import annotations

import json
import math
import os
import secrets
from collections.abc import Mapping
from pathlib import Path

from rlvr.errors import ConfigError, DiskFull
from rlvr.protocols import Tracker
from rlvr.tracking.run_dir import NEARLY_FULL_BYTES, RunDir, atomic_write_text, disk_full, disk_full_message
from rlvr.tracking.runs import flatten

STATE_FILE = "trackers.json"
WANDB_MODES = ("offline", "online", "disabled", "shared", "dryrun", "run")  # what wandb.init accepts


def _scalars(metrics: Mapping) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


class _State:
    """Small JSON file of mirror run ids, so resumes continue the same external run."""

    def __init__(self, run_dir: Path):
        self.path = run_dir / STATE_FILE

    def get(self, key: str):
        return json.loads(self.path.read_text()).get(key) if self.path.exists() else None

    def set(self, key: str, value) -> None:
        data = json.loads(self.path.read_text()) if self.path.exists() else {}
        atomic_write_text(self.path, json.dumps({**data, key: value}, indent=2) + "\n")


class JsonlTracker:
    """metrics.jsonl: one complete line `{"step": N, ...}` per call (the run directory's own log)."""

    name = "jsonl"

    def __init__(self, run_dir: Path):
        self.run = RunDir(run_dir)

    def log_config(self, config: Mapping) -> None:
        pass  # config.yaml is written by the trainer

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        self.run.append(self.run.metrics_file, {"step": step, **metrics})

    def close(self) -> None:
        pass


class TensorBoardTracker:
    name = "tensorboard"

    def __init__(self, run_dir: Path, resume_step: int | None = None):
        from torch.utils.tensorboard import SummaryWriter  # needs the `tensorboard` package

        purge = resume_step + 1 if resume_step is not None else None
        self.writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"), purge_step=purge, flush_secs=10)

    def log_config(self, config: Mapping) -> None:
        rows = "\n".join(f"|{k}|{v}|" for k, v in flatten(config).items())
        self.writer.add_text("config", "|key|value|\n|-|-|\n" + rows)  # cleanrl's hyperparameter table

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        for key, value in _scalars(metrics).items():
            self.writer.add_scalar(key, value, step)

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    name = "wandb"

    def __init__(self, run_dir: Path, resume_step: int | None = None):
        import wandb

        mode = os.environ.get("WANDB_MODE", "offline")
        if mode not in WANDB_MODES:  # wandb would fail deep inside its service, after the run started
            raise ConfigError(f"WANDB_MODE={mode!r} in the environment: must be one of {', '.join(WANDB_MODES)}; "
                              "set it so, or unset it (offline)")
        state = _State(run_dir)
        run_id = state.get("wandb_id") or secrets.token_hex(4)
        state.set("wandb_id", run_id)
        self.run = wandb.init(dir=str(run_dir), project=os.environ.get("WANDB_PROJECT", "rlvr"), name=run_dir.name,
                              id=run_id, resume="allow", mode=mode,
                              settings=wandb.Settings(console="off", silent=True))

    def log_config(self, config: Mapping) -> None:
        self.run.config.update(dict(config), allow_val_change=True)

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        self.run.log(_scalars(metrics), step=step)

    def close(self) -> None:
        import wandb

        self.run.finish()
        wandb.teardown()  # stop the background service so the offline .wandb file is complete on disk


def mlflow_key(key: str) -> str:
    """The name MLflow gets for a metric: its area, then the rest with `.` for `/`. MLflow's file store makes
    each `/` a folder, so `perf/peak_rss_mb` (a file) and `perf/peak_rss_mb/rollout` (a file in a folder of that
    name) cannot both exist; one folder level (the area) never collides.

    >>> mlflow_key("perf/peak_rss_mb/rollout"), mlflow_key("reward/mean"), mlflow_key("step")
    ('perf/peak_rss_mb.rollout', 'reward/mean', 'step')
    """
    area, slash, rest = key.partition("/")
    return area + slash + rest.replace("/", ".")


class MlflowTracker:
    name = "mlflow"

    def __init__(self, run_dir: Path, resume_step: int | None = None):
        # MLflow 3 keeps the file store but asks for this opt-in; a local folder needs no server.
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=(run_dir / "mlruns").resolve().as_uri())
        state = _State(run_dir)
        self.run_id = state.get("mlflow_run_id")
        if self.run_id is None:
            experiment = self.client.get_experiment_by_name("rlvr")
            experiment_id = experiment.experiment_id if experiment else self.client.create_experiment("rlvr")
            self.run_id = self.client.create_run(experiment_id, run_name=run_dir.name).info.run_id
            state.set("mlflow_run_id", self.run_id)
        else:
            self.client.update_run(self.run_id, status="RUNNING")

    def log_config(self, config: Mapping) -> None:
        from mlflow.entities import Param

        logged = self.client.get_run(self.run_id).data.params
        params = [Param(k, str(v)[:6000]) for k, v in flatten(config).items() if k not in logged]
        for i in range(0, len(params), 100):  # MLflow's batch limit for params
            self.client.log_batch(self.run_id, params=params[i:i + 100])

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        import time

        from mlflow.entities import Metric

        stamp = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(mlflow_key(k), v, stamp, step)
                                                    for k, v in _scalars(metrics).items()])

    def close(self) -> None:
        self.client.set_terminated(self.run_id, status="FINISHED")


class _DiskGuard:
    """A mirror behind the full-disk rule of the run's own files: no write is started on a disk
    with no room left (nothing half-written, no record silently dropped), and an error that
    comes from a full disk, whatever its type, becomes one `DiskFull` line."""

    def __init__(self, sink, run_dir: Path, name: str, resume_step: int | None):
        self.run_dir, self.name = run_dir, name
        self.inner = self._guarded(sink, run_dir, resume_step=resume_step)

    def _fail(self) -> DiskFull:
        return DiskFull(disk_full_message(self.run_dir, f"training (writing the {self.name} logs)"))

    def _guarded(self, call, *args, **kwargs):
        try:
            stats = os.statvfs(self.run_dir)
        except OSError:
            stats = None
        if stats is not None and stats.f_bavail * stats.f_frsize < NEARLY_FULL_BYTES:
            raise self._fail()
        try:
            return call(*args, **kwargs)
        except DiskFull:
            raise
        except Exception as err:  # MlflowException, TensorBoard's writer-thread OSError, ...
            if disk_full(err, self.run_dir):
                raise self._fail() from None
            raise

    def log_config(self, config: Mapping) -> None:
        self._guarded(self.inner.log_config, config)

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        self._guarded(self.inner.log_metrics, step, metrics)

    def close(self) -> None:
        self._guarded(self.inner.close)


SINKS = {"tensorboard": (TensorBoardTracker, "tensorboard"), "wandb": (WandbTracker, "wandb"),
         "mlflow": (MlflowTracker, "mlflow")}


def check_trackers(names: list[str]) -> None:
    """A one-line ConfigError for an unknown tracker or one whose package is not installed, said
    before a run directory is made (so a typo leaves no failed run behind)."""
    import importlib.util

    for name in dict.fromkeys(names):
        if name == "jsonl":
            continue
        if name not in SINKS:
            raise ConfigError(f"trainer.trackers: unknown tracker '{name}'; valid: jsonl, {', '.join(SINKS)}")
        if importlib.util.find_spec(name) is None:  # each sink's package has the sink's name
            raise ConfigError(f"trainer.trackers: '{name}' needs an optional package ({name}); "
                              f"pip install 'rlvr[{SINKS[name][1]}]'")


def make_trackers(names: list[str], run_dir: str | Path, *, resume_step: int | None = None) -> list[Tracker]:
    """The JSONL sink plus each named mirror, in order. `resume_step`: the checkpoint a resume starts from."""
    run_dir = Path(run_dir)
    trackers: list[Tracker] = [JsonlTracker(run_dir)]
    for name in dict.fromkeys(names):
        if name == "jsonl":
            continue
        if name not in SINKS:
            raise ConfigError(f"trainer.trackers: unknown tracker '{name}'; valid: jsonl, {', '.join(SINKS)}")
        cls, extra = SINKS[name]
        try:
            trackers.append(_DiskGuard(cls, run_dir, name, resume_step))
        except ImportError as err:
            raise ConfigError(f"trainer.trackers: '{name}' needs an optional package ({err.name or err}); "
                              f"pip install 'rlvr[{extra}]'") from None
    return trackers
