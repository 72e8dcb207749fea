"""Per-sample cgroups: how a place for them is found (cgroup v2 delegation on a fake hierarchy,
so every host runs it), the loud warning and unchanged results when there is none, and on a host
that has them, the real thing: limits written, peak memory read, the group removed."""

from __future__ import annotations

import os
import warnings

import pytest

from rlvr.rewards import sandbox as sbx
from rlvr.rewards.sandbox import Limits, Sandbox, Verdict, cgroup


def _fake_v2(tmp_path, monkeypatch, own="/", controllers="cpu memory pids"):
    for name, text in {"cgroup.controllers": controllers, "cgroup.subtree_control": "", "cgroup.procs": "1\n"}.items():
        (tmp_path / name).write_text(text)
    monkeypatch.setattr(cgroup, "_mounts", lambda: [(str(tmp_path), "cgroup2", set())])
    monkeypatch.setattr(cgroup, "_own_paths", lambda: {"": own})


def test_v2_moves_this_process_into_a_leaf_then_delegates(tmp_path, monkeypatch):
    _fake_v2(tmp_path, monkeypatch)
    host, why = cgroup.CgroupHost.find()
    assert why == "" and host.version == 2 and host.parents == {"": str(tmp_path)}
    leaf = tmp_path / f"rlvr-trainer-{os.getpid()}"
    assert (leaf / "cgroup.procs").read_text() == str(os.getpid())  # out of the way of "no internal processes"
    assert set((tmp_path / "cgroup.subtree_control").read_text().split()) == {"+memory", "+pids", "+cpu"}
    group = host.create(256 << 20, 24, 0.5)
    d = tmp_path / os.path.basename(group.dirs[0])
    assert [(d / f).read_text() for f in ("memory.max", "pids.max", "cpu.max")] == [str(256 << 20), "24",
                                                                                     "50000 100000"]
    group.join(4242)
    assert (d / "cgroup.procs").read_text() == "4242" and group.procs == [str(d / "cgroup.procs")]
    assert group.events() == {"oom_kill": 0, "pids_max": 0}
    (d / "memory.events").write_text("low 0\nhigh 0\nmax 9\noom 2\noom_kill 2\n")
    (d / "memory.peak").write_text("123456\n")
    assert group.events()["oom_kill"] == 2 and group.peak_bytes() == 123456


def test_v2_a_child_of_a_trainer_uses_the_delegated_parent(tmp_path, monkeypatch):
    _fake_v2(tmp_path, monkeypatch, own="/rlvr-trainer-77")
    (tmp_path / "cgroup.subtree_control").write_text("cpu memory pids\n")  # as the kernel shows it
    (tmp_path / "rlvr-trainer-77").mkdir()
    host, why = cgroup.CgroupHost.find()
    assert why == "" and host.parents == {"": str(tmp_path)}


def test_v2_refusals_are_reasons_not_crashes(tmp_path, monkeypatch):
    _fake_v2(tmp_path, monkeypatch, controllers="cpu pids")
    host, why = cgroup.CgroupHost.find()
    assert host is None and "lacks controllers ['memory']" in why
    (tmp_path / "cgroup.controllers").write_text("cpu memory pids")
    (tmp_path / "cgroup.subtree_control").unlink()
    (tmp_path / "cgroup.subtree_control").mkdir()  # the write fails, as with other processes in the group
    host, why = cgroup.CgroupHost.find()
    assert host is None and "other processes share it" in why
    assert (tmp_path / "cgroup.procs").read_text() == str(os.getpid())  # moved back (the leaf is then removed)


def test_no_cgroup_warns_loudly_once_and_runs(capsys, monkeypatch):
    monkeypatch.setattr(sbx, "_warned", set())
    monkeypatch.setattr(sbx, "_cgroups", [(None, "test: nothing delegated")])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = Sandbox(workers=1, isolation="none", limits=Limits(wall_s=3))
        Sandbox(workers=1, isolation="none", limits=Limits(wall_s=3))
    assert sum("no per-sample cgroup (test: nothing delegated)" in str(w.message) for w in caught) == 1
    assert capsys.readouterr().err.count("no per-sample cgroup") == 1
    result = first.run("print(6 * 7)")
    assert result.verdict is Verdict.OK and result.stdout == "42\n" and "memory_peak_bytes" not in result.extra


@pytest.mark.skipif(sbx.cgroup_host()[0] is None, reason="no per-sample cgroups on this host")
def test_real_cgroup_limits_and_peak_memory():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sb = Sandbox(workers=1, isolation="none", limits=Limits(wall_s=5, memory_mb=200, nproc=16))
    held = sb.run("x = b'x' * (64 << 20)\nprint(len(x) >> 20)")
    assert held.verdict is Verdict.OK and 64 << 20 <= held.extra["memory_peak_bytes"] <= 200 << 20
    memfd = sb.run("import os\nfds = [os.memfd_create('m') for _ in range(40)]\n"
                   "for fd in fds: os.write(fd, b'x' * (8 << 20))",  # 320 MB outside RLIMIT_AS
                   limits=Limits(wall_s=20, memory_mb=100, nproc=16))  # a generous clock: a loaded host is slow
    assert memfd.verdict is Verdict.MEMORY_LIMIT and memfd.extra["oom_kill"] >= 1
    assert memfd.extra["memory_peak_bytes"] <= 100 << 20
    parents = set(sbx.cgroup_host()[0].parents.values())
    assert not [n for p in parents for n in os.listdir(p) if n.startswith(f"rlvr-sbx-{os.getpid()}-")]
    sb.close()
