"""Whether a run directory can be resumed as asked: what it got from Python that its config
cannot rebuild, and how the config asked for differs from the one it saved."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlvr.errors import ConfigError
from rlvr.rewards.runner import spec_entries
from rlvr.tracking.run_files import read_config, read_manifest


def python_objects(run_dir: Path, *, tolerant: bool = False) -> str | None:
    """What a run got from Python that its config cannot rebuild (`train_dataset` rows or a
    `task` object, from run.json), or None. `tolerant`: a damaged run.json is a warning (None)."""
    info = read_manifest(run_dir, tolerant=tolerant)
    return next((key for key in ("train_dataset", "task") if key in info), None)


def check_resumable(run_dir: Path, *, rows: bool, task: bool) -> None:
    """A run trained on rows or a task object resumes only with them passed again."""
    needed = python_objects(run_dir)
    if needed == "train_dataset" and not rows or needed == "task" and not task:
        raise ConfigError(f"resume: '{run_dir}' trained on a {needed.replace('_', ' ')} passed from Python, which its "
                          f"config cannot rebuild; pass the same train_dataset to resume it")


def check_code_outside(run_dir: Path, reward_fn: str | None) -> None:
    """Refuse a resume whose `reward.fn` names a Python file inside the run folder: rlvr writes no
    code there, so such a file came with the folder (someone else's), and resuming would run it."""
    run = run_dir.resolve()
    for _, target in spec_entries(reward_fn) if reward_fn else []:
        file = target.rpartition(":")[0]
        if file.endswith(".py") and Path(file).resolve().is_relative_to(run):
            raise ConfigError(f"reward.fn: '{file}' lies inside the run folder '{run_dir}', where rlvr writes no code, "
                              f"so it came with the folder; resume with reward.fn=FILE.py:NAME naming your own file "
                              f"outside it")


# Extending a run changes its length, not what it trains; its name and parent folder only say where a
# run lives, and `--resume DIR` names the directory itself (a copied run resumes under its new name).
RESUME_FREE_KEYS = ("trainer.steps", "trainer.name", "trainer.out_dir")


def config_changes(run_dir: Path, config, *, allowed: bool) -> dict[str, tuple[Any, Any]]:
    """{key: (saved, new)} where `config` differs from the run's config.yaml (`RESUME_FREE_KEYS`
    aside); a ConfigError naming them unless `allowed` (a changed config makes the resumed run a
    different experiment from the one its first steps belong to)."""
    from rlvr.config import load_config, to_dict
    from rlvr.tracking.runs import flatten

    saved = flatten(to_dict(load_config(read_config(run_dir))))
    new = flatten(to_dict(config))
    changes = {key: (saved.get(key), new.get(key)) for key in sorted(saved.keys() | new.keys())
               if saved.get(key) != new.get(key) and key not in RESUME_FREE_KEYS}
    if changes and not allowed:
        listed = ", ".join(f"{key} ({old!r} -> {value!r})" for key, (old, value) in changes.items())
        raise ConfigError(f"resume: the config differs from '{run_dir / 'config.yaml'}' in {listed}; resume with the "
                          f"run's config, or pass --allow-config-change (allow_config_change=True) to record and "
                          f"keep the change")
    return changes
