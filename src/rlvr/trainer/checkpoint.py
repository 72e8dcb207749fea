"""Atomic checkpoints: model + tokenizer + trainer state, written to a temp dir then renamed.

A checkpoint directory only ever appears complete. `latest_checkpoint` skips anything that is
not (a leftover temp dir from a kill) and names the problem if a complete-looking one is bad.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
from pathlib import Path

import numpy as np
import torch

from rlvr.agents.batch import TurnTensors
from rlvr.batch import Rollouts
from rlvr.errors import ConfigError, DiskFull
from rlvr.runtime.safe_load import TRUST_FLAG, UntrustedPickle, load_trainer_state
from rlvr.safe_io import atomic_write_text, clear_temp
from rlvr.tracking.run_dir import disk_full, disk_full_message
from rlvr.tracking.run_files import checkpoint_dirs, read_checksums
from rlvr.trainer.scoring import Collected
from rlvr.types import Example

STATE_FILE = "trainer_state.pt"
STATE_DATA_CLASSES = (Collected, Rollouts, Example, TurnTensors)  # the replay buffer's groups
CHECKSUM_FILE = "checksums.json"


def _digests(directory: Path) -> dict[str, str]:
    """sha256 of every file in a checkpoint directory by its relative path (the optimizer shards in
    `optimizer/` too), except the checksum file itself. Links are not followed (rlvr writes none)."""
    files = sorted(f for f in directory.rglob("*") if f.is_file() and not f.is_symlink())
    return {f.relative_to(directory).as_posix(): hashlib.sha256(f.read_bytes()).hexdigest()
            for f in files if f.name != CHECKSUM_FILE or f.parent != directory}


def verify_checkpoint(checkpoint: Path, *, trusted: bool = False) -> str | None:
    """None if the checkpoint's files match its checksums, else what is wrong: a file that differs,
    or one rlvr loads that the checksums do not list (`trusted`: a checkpoint of an older rlvr,
    whose checksums left out `optimizer/`, passes with that)."""
    expected = read_checksums(checkpoint, CHECKSUM_FILE)
    if expected is None:
        return "missing or unreadable checksums.json"
    actual = _digests(checkpoint)
    bad = sorted(name for name in expected if actual.get(name) != expected[name])
    if bad:
        return f"checksum mismatch in {', '.join(bad)}"
    unlisted = [] if trusted else sorted(name for name in actual if name not in expected)
    return (f"files not in checksums.json: {', '.join(unlisted[:3])}; a checkpoint of an older rlvr you trust "
            f"resumes with {TRUST_FLAG}") if unlisted else None


def rng_state() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def save_checkpoint(directory: Path, step: int, model, tokenizer, state: dict, *, keep_last: int,
                    shards=(), writer: bool = True) -> Path:
    """Write checkpoints/step_NNNNNN atomically and prune to the newest `keep_last`.

    `shards` (`runtime.fsdp.ShardedState`s, data-parallel learners: the policy's, the
    critic's): every rank writes its optimizer shards into the temp folder first; the `writer`
    (rank 0) writes the rest and renames.
    A write that fails (a full disk, a second signal) removes the partial temp folder before the
    error goes on; a full disk becomes one `DiskFull` line."""
    final = directory / f"step_{step:06d}"
    tmp = directory / f".tmp_step_{step:06d}"
    if writer:
        clear_temp(tmp)  # a kill's leftover, or a link planted under the name: removed, never followed
        tmp.mkdir(parents=True)
    if shards:
        shards[0].barrier()  # the temp folder is there
        for sharded in shards:
            sharded.save_optimizer(tmp)
    if not writer:
        shards[0].barrier()  # rank 0 has renamed it
        return final
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        torch.save({"step": step, **state}, tmp / STATE_FILE)
        atomic_write_text(tmp / CHECKSUM_FILE, json.dumps(_digests(tmp), indent=1))
    except BaseException as err:
        full = isinstance(err, Exception) and disk_full(err, directory)  # before the cleanup frees space
        shutil.rmtree(tmp, ignore_errors=True)
        if full:
            run = directory.parent
            raise DiskFull(disk_full_message(run, f"writing checkpoint step {step} (the partial checkpoint "
                                                  f"was removed)")) from None
        raise
    clear_temp(final)
    tmp.rename(final)
    for old in checkpoint_dirs(directory)[:-keep_last]:  # never a user's copy beside them
        shutil.rmtree(old, ignore_errors=True)
    if shards:
        shards[0].barrier()
    return final


def remove_stale_temps(directory: Path) -> list[Path]:
    """Delete `.tmp_step_*` folders: checkpoints a kill interrupted before their rename. Only ever
    called before training (re)starts, when no save is in progress. Returns what was removed."""
    stale = sorted(directory.glob(".tmp_step_*")) if directory.exists() else []
    for tmp in stale:
        clear_temp(tmp)
    return stale


def checkpoint_step(checkpoint: Path) -> int:
    """The step of `checkpoints/step_NNNNNN`."""
    return int(checkpoint.name.removeprefix("step_"))


def latest_checkpoint(directory: Path, *, verify: bool = False, trusted: bool = False) -> Path | None:
    """The newest complete checkpoint; with `verify`, a corrupt newest one is a one-line error
    naming it and the last good one (deleting the bad one resumes from there); `trusted` as in
    `verify_checkpoint`."""
    candidates = checkpoint_dirs(directory)
    if not candidates or not verify:
        return candidates[-1] if candidates else None
    problem = verify_checkpoint(candidates[-1], trusted=trusted)
    if problem is None:
        return candidates[-1]
    good = next((c for c in reversed(candidates[:-1]) if verify_checkpoint(c, trusted=trusted) is None), None)
    fallback = f"the last good one is '{good}': delete the corrupt one to resume from it" if good \
        else "no earlier good checkpoint exists"
    raise ConfigError(f"checkpoint '{candidates[-1]}' is corrupt ({problem}); {fallback}")


def load_state(checkpoint: Path, *, trust_pickle: bool = False) -> dict:
    """The trainer state, loaded weights-only (`runtime.safe_load`): a file that names any other
    Python object is refused in one line unless `trust_pickle`."""
    try:
        return load_trainer_state(checkpoint / STATE_FILE, data_classes=STATE_DATA_CLASSES, trust_pickle=trust_pickle)
    except UntrustedPickle:
        raise
    except Exception as err:  # noqa: BLE001 - any unreadable file gets the same one-line answer
        raise ConfigError(f"checkpoint '{checkpoint}' is unreadable ({type(err).__name__}); "
                          "delete it to resume from the previous one") from None
