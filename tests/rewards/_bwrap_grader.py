"""A code grader over a bubblewrap sandbox, for the tests that need real isolation (skipped where
the machine has no root or no working bubblewrap; CI has both)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest

from rlvr.rewards.code import CodeGrader
from rlvr.rewards.sandbox import Limits, Sandbox, detect_isolation


def bwrap_grader(base_uid: int) -> Iterator[CodeGrader]:
    """Yield a grader with 2 sandbox workers (10 s, 256 MB) from uid `base_uid`, closed after."""
    if os.geteuid() != 0 or shutil.which("bwrap") is None or detect_isolation(base_uid=base_uid) != "bwrap":
        pytest.skip("needs root and a working bubblewrap (CI has both)")
    sandbox = Sandbox(workers=2, limits=Limits(wall_s=10.0, memory_mb=256), isolation="bwrap", base_uid=base_uid)
    yield CodeGrader(sandbox)
    sandbox.close()
