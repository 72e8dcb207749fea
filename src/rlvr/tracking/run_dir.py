"""The run directory: config.yaml, run.json, metrics.jsonl, samples.jsonl, checkpoints/.

Everything is written so that a crash or a kill never leaves a half-written file behind:
whole files go through a temp file + rename; JSONL files are appended one complete line at a
time and, on resume, cut back to the checkpoint's step.

One process writes a run at a time: `RunDir.create` takes an exclusive lock on the directory
(`fcntl.flock` on `.lock`, which the kernel drops when its holder dies, kill -9 included) and
`release` gives it back; a second writer gets a one-line `RunLocked` naming the holder.
`RunDir.claim` picks a new run's directory and makes it in one step (`mkdir` fails where one
exists), so two runs of the same name never share one.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

from rlvr.errors import ConfigError, DiskFull, RunInterrupted
from rlvr.safe_io import atomic_write_text, free_space, open_new_or_regular
from rlvr.tracking.lock import DirLock
from rlvr.tracking.run_files import checkpoint_dirs, read_lines, read_object

PACKAGES = ("torch", "transformers", "tokenizers", "safetensors", "numpy", "pyyaml", "tqdm", "matplotlib",
            "tensorboard", "wandb", "mlflow-skinny", "rlvr")
# Environment variables that change numerics or scheduling; recorded when set.
DETERMINISM_ENV = ("PYTHONHASHSEED", "CUBLAS_WORKSPACE_CONFIG", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                   "CUDA_VISIBLE_DEVICES", "NCCL_ALGO", "TORCH_DETERMINISTIC")


DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
NEARLY_FULL_BYTES = 64 * 1024


def disk_full(err: BaseException, path: str | Path) -> bool:
    """Whether `err` came from a full disk: ENOSPC/EDQUOT anywhere in its chain, the message of a
    library that reports it as text (safetensors), or, for one that says only "write failed"
    (torch.save), the disk at `path` nearly full right now (checked before cleaning up)."""
    seen = err
    while seen is not None:
        if getattr(seen, "errno", None) in DISK_FULL_ERRNOS or any(
                text in str(seen) for text in ("No space left on device", "Disk quota exceeded")):
            return True
        seen = seen.__cause__ or seen.__context__
    try:
        stats = os.statvfs(Path(path) if Path(path).exists() else Path(path).parent)
    except OSError:
        return False
    return stats.f_bavail * stats.f_frsize < NEARLY_FULL_BYTES


def disk_full_message(run_path: Path, what: str) -> str:
    return (f"disk full: no space left on the device of '{run_path}' while {what}; free space there "
            f"({free_space(run_path)} now), then continue with rlvr train --resume {run_path}")


@contextmanager
def disk_errors(run: RunDir, what: str = "writing the run's files"):
    """A full disk met in the body becomes one `DiskFull` line naming the run and the fix."""
    try:
        yield
    except DiskFull:
        raise
    except OSError as err:
        if not disk_full(err, run.path):
            raise
        where = f" ({err.filename})" if getattr(err, "filename", None) else ""
        raise DiskFull(disk_full_message(run.path, what + where)) from None


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def fingerprint(path: str | Path) -> dict:
    """sha256 and size of a data file; for a folder, of its files' relative paths and contents in order; for
    a Hub dataset id, of its cached snapshot folder, with the id and the revision."""
    path = Path(path)
    if not path.exists():
        from rlvr.hub import cached_dataset

        snapshot = cached_dataset(str(path))  # a Hub dataset id: the cached snapshot it was read from
        if snapshot is None:
            return {"path": str(path), "missing": True}
        return {**fingerprint(snapshot), "hub_dataset": str(path), "revision": snapshot.name}
    digest, size = hashlib.sha256(), 0
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for file in files:
        if path.is_dir():
            digest.update(str(file.relative_to(path)).encode() + b"\0")
        with open(file, "rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
                size += len(chunk)
    return {"path": str(path.resolve()), "sha256": digest.hexdigest(), "bytes": size, "files": len(files)}


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_info() -> list[dict]:
    import torch

    if not torch.cuda.is_available():
        return []
    gpus = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        gpus.append({"name": props.name, "memory_gb": round(props.total_memory / 2**30, 1),
                     "capability": f"{props.major}.{props.minor}"})
    return gpus


def manifest(command: list[str], seed: int, *, config: dict | None = None, data_files=()) -> dict:
    """Provenance of a run: what ran, from which code, on what, with which data.

    `config`: the resolved config as a dict (stored with its hash); `data_files`: paths of dataset
    files or folders the run reads, each recorded with a sha256 fingerprint.
    """
    import torch

    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    sha = _git("rev-parse", "HEAD")
    diff = _git("diff", "HEAD") if sha else None
    info = {
        "command": command,
        "seed": seed,
        "git_sha": sha,
        "git_dirty": bool(_git("status", "--porcelain")) if sha else None,
        "git_diff_sha256": hashlib.sha256(diff.encode()).hexdigest() if diff else None,
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "packages": versions,
        "torch_threads": torch.get_num_threads(),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cuda": torch.version.cuda,
        "gpus": gpu_info(),
        "env": {k: os.environ[k] for k in DETERMINISM_ENV if k in os.environ},
        "datasets": [fingerprint(p) for p in data_files],
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    if config is not None:
        info["config"] = config
        info["config_sha256"] = hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()
    return info


def finish_manifest(run: RunDir, status: str, *, exit_status: int, final: dict | None = None,
                    error: str | None = None, runtime: dict | None = None, **extra) -> dict:
    """Record how a run ended in run.json: status, exit status, end time, duration (and final
    metrics, and `runtime` facts only known after running, e.g. which decode engine ran)."""
    info = read_object(run.path / "run.json", tolerant=True)  # how the run ended matters more than what it held
    ended = datetime.now(UTC)
    info.update(status=status, exit_status=exit_status, ended=ended.isoformat(timespec="seconds"))
    if runtime:
        info["runtime"] = runtime
    try:
        info["duration_s"] = round((ended - datetime.fromisoformat(info["started"])).total_seconds(), 1)
    except (KeyError, TypeError, ValueError):
        pass
    if final is not None:
        info["final"] = final
    if error is not None:
        info["error"] = error
    info.update(extra)
    try:
        run.write_json("run.json", info)
    except OSError as err:  # a full disk: the run's reserve makes room for this one record
        if not disk_full(err, run.path) or not run.free_reserve():
            raise
        run.write_json("run.json", info)
    return info


@contextmanager
def recorded_exit(run: RunDir):
    """Mark run.json `failed` (exit 1) or `interrupted` (with the signal: 130 for Ctrl-C, a
    `RunInterrupted`'s own status for SIGTERM) if the body raises, then re-raise.

    A SIGKILL cannot be recorded; such a run keeps `status: running` with no `ended`.
    """
    try:
        yield
    except RunInterrupted as err:
        finish_manifest(run, "interrupted", exit_status=err.exit_status, signal=err.signal_name)
        raise
    except KeyboardInterrupt:
        finish_manifest(run, "interrupted", exit_status=130, signal="SIGINT")
        raise
    except BaseException as err:
        finish_manifest(run, "failed", exit_status=1, error=f"{type(err).__name__}: {err}"[:2000])
        raise


class StopSignals:
    """SIGTERM and SIGINT, caught while a run trains: the first asks the loop to stop at its next
    safe point (after the current step is logged and checkpointed), a second one stops it at once
    (`RunInterrupted` raised from the handler). Used as a context manager; the previous handlers
    are restored on exit. Installed only in the main thread (Python delivers signals there), and a
    signal the process was started ignoring (e.g. SIGINT under nohup) stays ignored."""

    SIGNALS = ("SIGTERM", "SIGINT")

    def __init__(self, echo=print):
        self.echo = echo
        self.received: str | None = None  # the first signal's name
        self._previous: dict[int, object] = {}

    @property
    def exit_status(self) -> int:
        return 128 + int(getattr(signal, self.received)) if self.received else 0

    def check(self, step: int | None = None) -> None:
        """Raise `RunInterrupted` if a signal came (where stopping is safe)."""
        if self.received:
            raise RunInterrupted(self.received, self.exit_status, step)

    def adopt(self, name: str | None) -> None:
        """Stop as if `name` had come here (a signal another learner rank or the launcher received)."""
        if name and not self.received:
            self.received = name
            self.echo(f"{name} received by another learner rank or the launcher: stopping after this step")

    def _handle(self, signum, _frame) -> None:
        name = signal.Signals(signum).name
        if self.received:
            raise RunInterrupted(name, 128 + signum)
        self.received = name
        self.echo(f"received {name}: stopping after this step (send it again to stop now)")

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for name in self.SIGNALS:
                number = getattr(signal, name)
                previous = signal.getsignal(number)
                if previous is signal.SIG_IGN:
                    continue
                self._previous[number] = previous
                signal.signal(number, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for number, previous in self._previous.items():
            signal.signal(number, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()


LOCK_FILE = ".lock"


def is_run_dir(path: Path) -> bool:
    """A run's directory: it holds config.yaml and run.json (both written when a run starts)."""
    return (path / "config.yaml").is_file() and (path / "run.json").is_file()


def check_output_path(out: str | Path, option: str, *, reads=(), allowed=(), replaces: bool = False) -> None:
    """Refuse (one-line `ConfigError`) an output path inside a run directory: one of `reads` (the
    runs the command reads) or any other, where only the run's own training writes. `allowed`:
    paths in a run the command may write all the same (the run's report.html); `replaces`: the
    command deletes what is at `out` first (`--force`), so `out` must not hold a run either."""
    target = Path(out).resolve()
    if target in {Path(a).resolve() for a in allowed}:
        return
    runs = [Path(r).resolve() for r in reads]
    runs += [d for d in (target, *target.parents) if d not in runs and is_run_dir(d)]
    for run in runs:
        if target == run or target.is_relative_to(run):
            raise ConfigError(f"{option}: '{out}' is inside the run directory '{run}', whose files only its "
                              f"training writes; choose a path outside it")
        if replaces and run.is_relative_to(target):
            raise ConfigError(f"{option}: '{out}' holds the run directory '{run}'; choose a path that holds no run")
    if replaces and target.is_dir():
        held = next((f.parent for f in target.rglob("run.json") if is_run_dir(f.parent)), None)
        if held is not None:
            raise ConfigError(f"{option}: '{out}' holds the run directory '{held}'; choose a path that holds no run")


RESERVE_FILE = ".disk_reserve"
RESERVE_BYTES = 64 * 1024  # run.json is a few KB; an atomic rewrite needs its old and new copies at once


class RunDir:
    """Paths and append-only logs of one run, and its writer's lock."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.checkpoints = self.path / "checkpoints"
        self.lock = DirLock(self.path / LOCK_FILE)

    @classmethod
    def claim(cls, path: str | Path) -> RunDir:
        """A new run directory at `path`, or `path-2`, `path-3` ... where one exists, made and
        locked: `mkdir` fails on an existing directory, so two runs starting at once with the
        same name get one directory each."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        candidate, suffix = path, 2
        while True:
            try:
                candidate.mkdir()
            except FileExistsError:
                candidate, suffix = path.with_name(f"{path.name}-{suffix}"), suffix + 1
                continue
            run = cls(candidate)
            run.create(new=True)
            return run

    @property
    def metrics_file(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def samples_file(self) -> Path:
        return self.path / "samples.jsonl"

    def create(self, *, new: bool = False) -> None:
        """Make the directory and take its lock, held until `release` (a no-op while held).
        `new`: the directory must not hold a run yet (checked under the lock)."""
        self.path.mkdir(parents=True, exist_ok=True)
        self.lock.acquire(f"run directory '{self.path}'")
        if new and (self.path / "config.yaml").exists():
            self.lock.release()
            raise ConfigError(f"run_dir: '{self.path}' already holds a run; pass resume=True to continue it "
                              f"or choose another directory")
        if self.checkpoints.exists() and not self.checkpoints.is_dir():
            self.lock.release()
            checkpoint_dirs(self.checkpoints)  # the one-line error naming it
        self.checkpoints.mkdir(exist_ok=True)

    def reserve(self) -> None:
        """Hold `RESERVE_BYTES` of the disk in a hidden file while the run trains: when the disk
        fills up, `free_reserve` frees it so run.json can still record how the run ended."""
        path = self.path / RESERVE_FILE
        if not os.path.lexists(path):
            try:  # O_EXCL: a link planted under the name is never written through
                with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644), "wb") as handle:
                    handle.write(b"\0" * RESERVE_BYTES)
                    handle.flush()
                    os.fsync(handle.fileno())
            except BaseException:
                path.unlink(missing_ok=True)
                raise
        stats = os.statvfs(self.path)
        if stats.f_bavail * stats.f_frsize < RESERVE_BYTES:  # the disk a failed run just filled: stop before
            self.free_reserve()                               # anything is changed
            raise OSError(errno.ENOSPC, "No space left on device beyond the run's reserve", str(self.path))

    def remove_if_empty(self) -> None:
        """Remove the run directory if nothing but its (empty) folders, the reserve and the lock
        are in it, and release it; only by the lock's holder (another writer's run is never touched)."""
        if not self.lock.held:
            return
        self.release()
        for folder in (self.checkpoints, self.path):
            try:
                folder.rmdir()
            except OSError:
                return

    def free_reserve(self) -> bool:
        """Free the reserve; False if there was none (or this process does not hold the run)."""
        if not self.lock.held:
            return False
        try:
            (self.path / RESERVE_FILE).unlink()
        except FileNotFoundError:
            return False
        return True

    def release(self) -> None:
        """The end of this process's writing: free the reserve, then the lock (no-ops where not held)."""
        self.free_reserve()
        self.lock.release()

    def write_json(self, name: str, data: dict) -> None:
        atomic_write_text(self.path / name, json.dumps(data, indent=2, default=str) + "\n")

    def read_json(self, name: str) -> dict:
        """A JSON object file of the run ({} where there is none); damage is a one-line error naming it."""
        return read_object(self.path / name)

    def append(self, file: Path, record: dict) -> None:
        """Add one complete line; a write that fails (a full disk) is cut back, leaving no torn line."""
        line = (json.dumps(record, default=float) + "\n").encode()
        fd = open_new_or_regular(file, os.O_WRONLY | os.O_APPEND | os.O_CREAT)  # never through a planted link
        size = os.fstat(fd).st_size
        try:
            while line:
                line = line[os.write(fd, line):]
        except BaseException:
            os.ftruncate(fd, size)
            raise
        finally:
            os.close(fd)

    def truncate_after(self, step: int) -> None:
        """Drop log lines past `step` (and any torn last line) so a resume never duplicates steps."""
        for file in (self.metrics_file, self.samples_file):
            if not file.exists():
                continue
            kept = [line for line, record in read_lines(file, tolerant=False) if record.get("step", -1) <= step]
            atomic_write_text(file, "".join(f"{line}\n" for line in kept))


def now() -> float:
    return time.perf_counter()
