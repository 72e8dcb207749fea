"""Per-sample cgroups: how a place for them is found (cgroup v2 delegation on a fake hierarchy,
so every host runs it), the loud warning and unchanged results when there is none, and on a host
that has them, the real thing: limits written, peak memory read, the group removed."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import warnings

import pytest
from _page_cache import clean_files_under_usr, evict
from _threads import in_thread

import rlvr.rewards.sandbox.sandbox as sbx
from rlvr.rewards.sandbox import Limits, Sandbox, Verdict, cgroup
from rlvr.rewards.sandbox.results import classify


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
    assert group.events() == {"oom_kill": 0, "memory_max": 0, "pids_max": 0}
    (d / "memory.peak").write_text(str(256 << 20))  # at its limit, whatever the counter says
    assert group.events()["memory_max"] == 1
    (d / "memory.events").write_text("low 0\nhigh 0\nmax 9\noom 2\noom_kill 2\n")
    (d / "memory.peak").write_text("123456\n")
    assert group.events() == {"oom_kill": 2, "memory_max": 9, "pids_max": 0} and group.peak_bytes() == 123456


@pytest.mark.parametrize(("events", "verdict", "detail"), [
    ({}, Verdict.TIMEOUT, "wall clock"),
    ({"oom_kill": 0, "memory_max": 0, "pids_max": 0}, Verdict.TIMEOUT, "wall clock"),
    # held at its limit, the kernel reclaiming and no process killed, until the clock ran out
    ({"oom_kill": 0, "memory_max": 3, "pids_max": 0}, Verdict.MEMORY_LIMIT,
     "cgroup memory limit reached, then the wall clock"),
    ({"oom_kill": 0, "memory_max": 0, "pids_max": 5}, Verdict.RESOURCE_LIMIT,
     "cgroup process limit, then the wall clock"),
    ({"oom_kill": 1, "memory_max": 3, "pids_max": 0}, Verdict.MEMORY_LIMIT,
     "cgroup memory limit (1 processes killed)"),
])
def test_a_timed_out_run_names_the_limit_its_cgroup_reached(events, verdict, detail):
    assert classify(-9, "", True, False, True, "bwrap", events) == (verdict, detail)


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
    assert memfd.extra["memory_max"] >= 1  # reached its limit: what names a run held there until the clock
    assert held.extra["memory_max"] == 0
    assert memfd.extra["memory_peak_bytes"] <= 100 << 20
    parents = set(sbx.cgroup_host()[0].parents.values())
    assert not [n for p in parents for n in os.listdir(p) if n.startswith(f"rlvr-sbx-{os.getpid()}-")]
    sb.close()


def test_v1_spawning_thread_enters_every_controller_and_comes_home(tmp_path):
    dirs = [tmp_path / c / "rlvr-sbx-1-0" for c in ("memory", "pids", "cpu")]
    homes = [tmp_path / c / "tasks" for c in ("memory", "pids", "cpu")]
    for d in dirs:
        d.mkdir(parents=True)
    group = cgroup.SampleCgroup([str(d) for d in dirs], 1, home=[str(h) for h in homes])

    def spawn():
        with group.spawning():  # "0": the writing thread moves itself (no global lock, unlike a pid)
            inside = [(d / "tasks").read_text() for d in dirs] + [h.exists() for h in homes]
        return inside, [h.read_text() for h in homes]

    assert in_thread(spawn) == (["0", "0", "0", False, False, False], ["0", "0", "0"])
    assert not group.inherits  # the main thread: its memory map's owner, never carried into a group
    for d in dirs:
        (d / "tasks").unlink()
    with group.spawning():
        pass
    assert not any((d / "tasks").exists() for d in dirs)
    homes[1].parent.rename(tmp_path / "gone")  # cannot go home: loud, not a thread left in a sample's group
    with pytest.raises(RuntimeError, match="could not leave a sample cgroup"):
        in_thread(spawn)


def _v1_host():
    host = sbx.cgroup_host()[0]
    return host if host is not None and host.version == 1 else None


def _threads_in_sample_groups() -> list[str]:
    found = []
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/cgroup") as f:
            found += [f"{tid}: {line}" for line in f.read().splitlines() if "rlvr-sbx-" in line]
    return found


@pytest.mark.skipif(_v1_host() is None, reason="needs per-sample cgroups on cgroup v1 (a hybrid host, as root)")
@pytest.mark.parametrize("mode", ["none", "bwrap"])
def test_real_v1_sample_is_born_in_its_group_and_no_trainer_thread_stays(mode, monkeypatch):
    if mode == "bwrap" and sbx.detect_isolation() != "bwrap":
        pytest.skip("bubblewrap unavailable")

    def no_move(self, pid):  # moving the sample in after it started is what being born there avoids
        raise AssertionError(f"moved {pid} into its group")

    monkeypatch.setattr(cgroup.SampleCgroup, "join", no_move)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sb = Sandbox(workers=2, isolation=mode, limits=Limits(wall_s=10, memory_mb=200, nproc=16))
    try:
        shown = sb.run("print(open('/proc/self/cgroup').read())")  # from the main thread: handed to a worker
        assert shown.verdict is Verdict.OK, shown
        lines = {line.split(":", 2)[1]: line.split(":", 2)[2] for line in shown.stdout.split()}
        for controller in cgroup.CONTROLLERS:  # under bwrap the cgroup namespace was made inside the group
            seen = lines[controller]
            assert seen == "/" if mode == "bwrap" else os.path.basename(seen).startswith(f"rlvr-sbx-{os.getpid()}-")
        held = sb.run_many([dict(source="x = b'x' * (96 << 20)\nprint(len(x) >> 20)")] * 2)
        assert all(r.verdict is Verdict.OK and r.extra["memory_peak_bytes"] >= 96 << 20 for r in held)
        monkeypatch.setattr(sbx.launch.subprocess, "Popen", lambda *a, **k: (_ for _ in ()).throw(OSError("no fork")))
        failed = sb.run("print(1)")  # the fork fails while the thread is inside: it still goes home
        assert failed.verdict is Verdict.SANDBOX_ERROR and "no fork" in failed.detail
    finally:
        sb.close()
    assert _threads_in_sample_groups() == []


@pytest.mark.skipif(sbx.cgroup_host()[0] is None, reason="no per-sample cgroups on this host")
def test_peak_memory_is_each_samples_own():
    """The second program in a slot must not inherit the first one's peak (each gets a new group)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sb = Sandbox(workers=1, isolation="none", limits=Limits(wall_s=10, memory_mb=300, nproc=16))
    big, small = (sb.run(s) for s in ("x = b'x' * (128 << 20)", "print(1)"))
    sb.close()
    assert big.verdict is small.verdict is Verdict.OK
    assert big.extra["memory_peak_bytes"] >= 128 << 20 and small.extra["memory_peak_bytes"] < 32 << 20


@pytest.mark.skipif(os.geteuid() != 0, reason="slot uids are used as root only")
@pytest.mark.parametrize("mode", ["none", "bwrap"])
def test_slot_uid_taken_in_the_exec_chain(mode):
    """As root the slot's uid comes from an exec in the chain, ``setpriv`` or ``chroot`` in front
    of bwrap (so the fork is a ``vfork``): real, effective and saved ids all the slot's, no
    supplementary groups, no new privileges."""
    if mode == "bwrap" and sbx.detect_isolation() != "bwrap":
        pytest.skip("bubblewrap unavailable")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sb = Sandbox(workers=1, isolation=mode, limits=Limits(wall_s=10), base_uid=62500)
    r = sb.run("import os\nprint(os.getresuid(), os.getresgid(), os.getgroups())\n"
               "print([l for l in open('/proc/self/status') if l.startswith('NoNewPrivs')][0].split()[1])")
    uid = sb.uid_range[0]
    sb.close()
    assert r.verdict is Verdict.OK, r
    assert r.stdout.split("\n")[:2] == [f"{(uid,) * 3} {(uid,) * 3} []", "1"]  # bwrap maps the uid to itself


_KERNEL_FILES = {
    2: {"memory.max": "max", "memory.swap.max": "max", "memory.oom.group": "0", "pids.max": "max",
        "cpu.max": "max 100000", "cgroup.procs": "", "cgroup.kill": "", "memory.current": "0",
        "memory.reclaim": "", "memory.peak": "0", "memory.stat": ""},
    1: {"memory.limit_in_bytes": "max", "memory.memsw.limit_in_bytes": "max", "memory.kmem.tcp.limit_in_bytes": "max",
        "memory.force_empty": "", "memory.max_usage_in_bytes": "0", "pids.max": "max", "cpu.cfs_period_us": "100000",
        "cpu.cfs_quota_us": "-1", "cgroup.procs": "", "tasks": "", "memory.usage_in_bytes": "0"},
}


def _fake_kernel(monkeypatch, version: int) -> None:
    """``mkdir`` in a fake hierarchy makes the interface files the kernel would; ``rmdir`` removes
    a group with them, as the kernel does for an empty group."""
    mkdir, rmdir = os.mkdir, os.rmdir

    def fake_mkdir(path, *args):
        mkdir(path, *args)
        controller = os.path.basename(os.path.dirname(path))  # v1: each hierarchy has its own files
        for name, text in _KERNEL_FILES[version].items():
            if version == 2 or name.split(".")[0] in (controller, "cgroup", "tasks"):
                with open(os.path.join(path, name), "w") as f:
                    f.write(text)

    def fake_rmdir(path):
        for name in _KERNEL_FILES[version]:
            if os.path.exists(os.path.join(path, name)):
                os.unlink(os.path.join(path, name))
        rmdir(path)

    monkeypatch.setattr(cgroup.os, "mkdir", fake_mkdir)
    monkeypatch.setattr(cgroup.os, "rmdir", fake_rmdir)


@pytest.mark.parametrize("version", [2, 1])
@pytest.mark.parametrize("charged", [9 << 20, 4096, 0])
def test_sample_group_limits_kill_reclaim_and_removal(version, charged, tmp_path, monkeypatch):
    """The whole life of a sample group on a fake hierarchy of either version: the optional limits
    written where the kernel has them (no swap, the OOM kill of the whole group on v2; swap and the
    TCP-buffer counter at a quarter of the memory on v1), the group killed at once (``cgroup.kill``
    on v2) and its CPU quota lifted, its page cache reclaimed (``memory.reclaim`` of what
    ``memory.stat`` counts reclaimable on v2, its limit lowered to 0 on v1) before it is removed,
    whatever it holds (a small charge too: the page cache a sample leaves is a channel to the
    next), and no reclaim pass for a group that holds nothing."""
    _fake_kernel(monkeypatch, version)
    parents = {"": str(tmp_path)} if version == 2 else {c: str(tmp_path / c) for c in cgroup.CONTROLLERS}
    for p in parents.values():
        os.makedirs(p, exist_ok=True)
    group = cgroup.CgroupHost(version, parents).create(256 << 20, 24, 0.5)
    mem = group.dirs[0] if version == 2 else next(d for d in group.dirs if d.startswith(parents["memory"]))

    def read(name, d=mem):
        with open(os.path.join(d, name)) as f:
            return f.read()

    if version == 2:
        assert [read(n) for n in ("memory.max", "memory.swap.max", "memory.oom.group", "cpu.max")] == [
            str(256 << 20), "0", "1", "50000 100000"]
    else:
        assert [read(n) for n in ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes",
                                  "memory.kmem.tcp.limit_in_bytes")] == [str(256 << 20), str(256 << 20),
                                                                         str(64 << 20)]
        assert read("cpu.cfs_quota_us", group.dirs[2]) == "50000"
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        with open(os.path.join(group.dirs[0], "cgroup.procs"), "w") as f:
            f.write(f"{sleeper.pid}\n{os.getpid()}\n")  # the caller itself is never killed
        assert group.kill() == [sleeper.pid]
        if version == 2:
            assert read("cgroup.kill") == "1" and read("cpu.max") == "max"
            assert sleeper.poll() is None  # one write to cgroup.kill does it, not a signal per member
        else:
            assert sleeper.wait(timeout=5) == -signal.SIGKILL  # no cgroup.kill on v1: one SIGKILL each
            assert read("cpu.cfs_quota_us", group.dirs[2]) == "-1"
    finally:
        sleeper.kill()
        sleeper.wait()
    reclaimed = []
    real_write = cgroup._write
    monkeypatch.setattr(cgroup, "_write", lambda path, value: (reclaimed.append((os.path.basename(path), value)),
                                                              real_write(path, value)))
    with open(os.path.join(mem, "memory.current" if version == 2 else "memory.usage_in_bytes"), "w") as f:
        f.write(str(charged))
    if version == 2:  # what the kernel counts reclaimable: file pages and reclaimable slab, in bytes
        with open(os.path.join(mem, "memory.stat"), "w") as f:
            f.write(f"anon 0\nfile {charged // 2}\nkernel 8192\nslab_reclaimable 4096\nslab_unreclaimable 4096\n")
    assert group.remove() == charged
    expected = [("memory.reclaim", str(charged // 2 + 4096))] if version == 2 else [("memory.limit_in_bytes", "0")]
    assert reclaimed == (expected if charged else [])
    assert not any(os.path.exists(d) for d in group.dirs)


def _record_page_cache_at_removal(monkeypatch) -> list[int]:
    """Each sample group's page cache (its file LRU lists) just before its removal, in order."""
    seen: list[int] = []
    real = cgroup.SampleCgroup.remove

    def remove(group):
        stat = cgroup._keyed(group._file("memory.stat", "memory.stat"))
        seen.append(stat["active_file"] + stat["inactive_file"])
        return real(group)

    monkeypatch.setattr(cgroup.SampleCgroup, "remove", remove)
    return seen


def _evict_start_up_files(python: str) -> int:
    """Drop the page cache of the files a sandboxed start-up and the grader's imports read (the
    interpreter's stdlib byte code, clean and unmapped here); how many files."""
    stdlib = subprocess.run([python, "-E", "-s", "-S", "-c", "import os; print(os.path.dirname(os.__file__))"],
                            capture_output=True, text=True, check=True).stdout.strip()
    count = 0
    for folder in ("", "encodings", "json", "re", "collections"):
        cache = os.path.join(stdlib, folder, "__pycache__")
        for name in os.listdir(cache) if os.path.isdir(cache) else []:
            evict(os.path.join(cache, name))
            count += 1
    return count


@pytest.mark.skipif(os.geteuid() != 0 or sbx.cgroup_host()[0] is None or sbx.detect_isolation() != "bwrap",
                    reason="needs bwrap and per-sample cgroups, as root")
def test_start_up_files_are_charged_to_the_trainer_once_not_to_every_sample(monkeypatch):
    """A new sandbox's trusted first run, outside any sample group, reads what every sample reads
    (the chain, the interpreter's start-up, the grader's imports): afterwards a sample's group holds
    no page cache and is removed without a reclaim pass. Without that run, the first sample reads
    them into its own group (and its reclaim would drop them for the next sample to read again)."""
    seen = _record_page_cache_at_removal(monkeypatch)
    programs = ["print(1)", "import json, re, sys\nprint(json.dumps(sys.argv))"]
    python = sbx.default_python()
    pages = {}
    for warm in (False, True):
        monkeypatch.setattr(sbx, "_warm_times", {} if warm else {(python, "bwrap"): float("inf")})
        assert _evict_start_up_files(python) > 0
        seen.clear()
        with Sandbox(workers=1, isolation="bwrap", limits=Limits(wall_s=10)) as sb:
            results = [sb.run(p) for p in programs]
        assert [r.verdict for r in results] == [Verdict.OK] * 2, [r.detail or r.stderr for r in results]
        pages[warm] = list(seen)
    assert pages[True] == [0, 0]
    assert pages[False][0] > 0, pages


@pytest.mark.skipif(os.geteuid() != 0 or sbx.cgroup_host()[0] is None or sbx.detect_isolation() != "bwrap",
                    reason="needs bwrap and per-sample cgroups, as root")
@pytest.mark.parametrize("rewarm_s", [0.0, float("inf")])
def test_a_sample_left_charged_makes_the_sandbox_warm_again(rewarm_s, monkeypatch):
    """The trusted run's pages evicted later (memory pressure; here by hand) are read back by the
    next sample. One that also reads a 4 MB file nobody cached is left charged over
    ``WARM_AGAIN_ABOVE``: its reclaim drops the start-up files too, so with re-warming (``REWARM_S``
    passed) the samples after it hold none; without, the next one reads them back into its own."""
    folder = clean_files_under_usr("rlvr-rewarm", 1, 4 << 20)
    blob = str(folder / "0.bin")
    monkeypatch.setattr(sbx, "REWARM_S", rewarm_s)
    try:
        with Sandbox(workers=1, isolation="bwrap", limits=Limits(wall_s=10)) as sb:
            assert _evict_start_up_files(sb.python) > 0
            evict(blob)
            reader = "import sys\nwith open(sys.argv[1], 'rb') as f:\n    print(len(f.read()))"
            first = sb.run(reader, argv=[blob])
            seen = _record_page_cache_at_removal(monkeypatch)
            later = [sb.run("import json\nprint(json.dumps(1))") for _ in range(2)]
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    assert first.stdout.strip() == str(4 << 20) and first.extra["memory_left_bytes"] > cgroup.WARM_AGAIN_ABOVE
    assert [r.stdout for r in later] == ["1\n", "1\n"]
    assert seen == [0, 0] if rewarm_s == 0 else seen[0] > 0, seen  # (later ones may keep what they read)
