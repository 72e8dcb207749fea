"""Fixtures for the tracking tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from fake_runs import make_run


@pytest.fixture
def fake_runs(tmp_path) -> Path:
    """2 recipes (ppo_clip, gspo) × 3 seeds under tmp_path/runs."""
    root = tmp_path / "runs"
    for seed in (0, 1, 2):
        make_run(root, f"ppo_s{seed}", seed=seed, rate=0.03)
        make_run(root, f"gspo_s{seed}", seed=seed, rate=0.08, overrides=("algo.objective=gspo",))
    return root
