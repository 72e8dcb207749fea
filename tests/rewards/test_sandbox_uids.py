"""Slot uids are unique per sandbox on a host: ranges reserved in a flock-guarded registry, given
back on close, and reclaimed from owners that died without giving them back."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from rlvr.rewards.sandbox import Sandbox, uids
from rlvr.rewards.sandbox.uids import allocate_uids, release_uids

HOLDER = textwrap.dedent("""
    import sys
    from rlvr.rewards import sandbox
    from rlvr.rewards.sandbox import uids
    if sys.argv[1] == "sandbox":
        sb = sandbox.Sandbox(workers=3, isolation="none", base_uid=63000)
        start = sb.uid_range.start
    else:
        start, _ = uids.allocate_uids(63000, 3, sys.argv[2])
    print(start, flush=True)
    sys.stdin.read()  # hold the range until the parent closes our stdin (or kills us)
""")


def _holder(kind: str, directory, env=None) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, kind, str(directory)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})
    return proc, int(proc.stdout.readline())


def test_two_processes_get_disjoint_ranges_and_a_dead_owners_range_is_reclaimed(tmp_path):
    child, child_start = _holder("raw", tmp_path)
    try:
        mine, token = allocate_uids(63000, 3, str(tmp_path))
        assert child_start == 63000 and mine == 63003  # disjoint: the child holds 63000-63002
        release_uids(token, str(tmp_path))
        assert allocate_uids(63000, 2, str(tmp_path))[0] == 63003  # still held by the live child
    finally:
        child.kill()
        child.wait()
    # The child died without releasing: its range is free again, a reused pid would not hold it either.
    assert allocate_uids(63000, 3, str(tmp_path))[0] == 63000


def test_ranges_in_one_process_are_disjoint_and_released(tmp_path):
    first, t1 = allocate_uids(100, 4, str(tmp_path))
    second, t2 = allocate_uids(100, 4, str(tmp_path))
    assert (first, second) == (100, 104)
    release_uids(t1, str(tmp_path))
    assert allocate_uids(100, 2, str(tmp_path))[0] == 100  # the freed gap is reused
    assert allocate_uids(100, 3, str(tmp_path))[0] == 108  # too big for what is left of the gap
    release_uids(t2, str(tmp_path))
    release_uids(t2, str(tmp_path))  # twice is harmless


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="slot uids are reserved as root only")
def test_two_sandboxes_in_two_processes_never_share_uids(tmp_path, monkeypatch):
    monkeypatch.setattr(uids, "UID_REGISTRY", str(tmp_path))
    child, child_start = _holder("sandbox", tmp_path, env={"RLVR_SANDBOX_UID_DIR": str(tmp_path)})
    try:
        with Sandbox(workers=3, isolation="none", base_uid=63000) as sb:
            assert set(sb.uid_range).isdisjoint(range(child_start, child_start + 3))
            assert sb.run("print(6*7)").stdout.strip() == "42"
        with Sandbox(workers=2, isolation="none", base_uid=63000) as again:  # the closed one's range is back
            assert again.uid_range.start == 63003
    finally:
        child.stdin.close()
        child.wait(timeout=30)
    with Sandbox(workers=1, isolation="none", base_uid=63000) as sb:  # the child released on exit
        assert sb.uid_range.start == 63000
