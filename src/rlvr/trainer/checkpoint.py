"""Atomic checkpoints: model + tokenizer + trainer state, written to a temp dir then renamed.

A checkpoint directory only ever appears complete. `latest_checkpoint` skips anything that is
not (a leftover temp dir from a kill) and names the problem if a complete-looking one is bad.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import numpy as np
import torch

from rlvr.errors import ConfigError

STATE_FILE = "trainer_state.pt"


def rng_state() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def save_checkpoint(directory: Path, step: int, model, tokenizer, state: dict, *, keep_last: int) -> Path:
    """Write checkpoints/step_NNNNNN atomically and prune to the newest `keep_last`."""
    final = directory / f"step_{step:06d}"
    tmp = directory / f".tmp_step_{step:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    torch.save({"step": step, **state}, tmp / STATE_FILE)
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    for old in sorted(directory.glob("step_*"))[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(directory: Path) -> Path | None:
    candidates = sorted(directory.glob("step_*")) if directory.exists() else []
    return candidates[-1] if candidates else None


def load_state(checkpoint: Path) -> dict:
    try:
        return torch.load(checkpoint / STATE_FILE, weights_only=False)
    except Exception as err:  # noqa: BLE001 - any unreadable file gets the same one-line answer
        raise ConfigError(f"checkpoint '{checkpoint}' is unreadable ({type(err).__name__}); "
                          "delete it to resume from the previous one") from None
