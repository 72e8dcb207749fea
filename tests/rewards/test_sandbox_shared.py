"""What a sandbox makes once and its samples share: a network namespace per slot and the
device directory bound as every sample's ``/dev`` (the samples' view of both is tested in
``test_hostile.py``), and how a sandbox lets them go."""

from __future__ import annotations

import os
import shutil
import socket
import stat
import tempfile
import threading
import time
from pathlib import Path

import pytest
from _threads import in_thread

import rlvr.rewards.sandbox.sandbox as sbx
from rlvr.rewards.sandbox import Limits, Sandbox, Verdict, devices, netns

ROOT = os.geteuid() == 0


def _thread_netns() -> str:
    return os.readlink("/proc/thread-self/ns/net")


@pytest.fixture()
def slot_net():
    if not ROOT:
        pytest.skip("making a network namespace needs root (CAP_SYS_ADMIN)")
    net, why = netns.make()
    if net is None:
        pytest.skip(f"no network namespace here: {why}")
    yield net
    net.close()


def test_a_slot_namespace_is_entered_by_one_thread_and_left(slot_net):
    home, slot = _thread_netns(), f"net:[{os.fstat(slot_net.fd).st_ino}]"
    seen: dict[str, str] = {}

    def starter():  # as the sandbox's worker thread does around a sample's fork
        with netns.entered(slot_net):
            seen["inside"] = _thread_netns()
            seen["main thread"] = os.readlink("/proc/self/ns/net")  # /proc/self: the thread group leader
        seen["after"] = _thread_netns()
        try:
            with netns.entered(slot_net):
                raise KeyError("the body fails")
        except KeyError:
            seen["after a failure"] = _thread_netns()

    in_thread(starter)
    assert slot != home
    assert seen == {"inside": slot, "main thread": home, "after": home, "after a failure": home}
    assert _thread_netns() == home


def test_the_main_thread_never_enters_a_slot_namespace(slot_net):
    """A signal handler runs on the main thread and could raise between the two moves."""
    home = _thread_netns()
    with pytest.raises(RuntimeError, match="main thread"), netns.entered(slot_net):
        pass
    assert _thread_netns() == home != f"net:[{os.fstat(slot_net.fd).st_ino}]"
    with netns.entered(None):  # no namespace: nothing to enter, on any thread
        pass


def test_a_namespace_left_holding_a_socket_is_replaced(slot_net):
    """``clean`` keeps an empty namespace and replaces one where a socket is still bound."""
    assert not slot_net.holds_sockets() and netns.clean(slot_net) is slot_net

    sock = in_thread(lambda: _bound_inside(slot_net))
    try:
        assert slot_net.holds_sockets()
        old = os.fstat(slot_net.fd).st_ino
        fresh = netns.clean(slot_net)
        assert fresh is not None and os.fstat(fresh.fd).st_ino != old and not fresh.holds_sockets()
        fresh.close()
    finally:
        sock.close()


def test_a_namespace_that_cannot_be_replaced_is_let_go_once(slot_net, monkeypatch):
    """Where no fresh namespace can be made, ``clean`` gives the old one's fds back (once: a
    second close must not close numbers another thread has since been given) and returns None."""
    sock = in_thread(lambda: _bound_inside(slot_net))
    try:
        monkeypatch.setattr(netns, "make", lambda: (None, "no thread to be had"))
        assert netns.clean(slot_net) is None and (slot_net.fd, slot_net.sockets) == (-1, -1)
        reused = os.open("/dev/null", os.O_RDONLY)  # may take one of the numbers given back
        slot_net.close()
        os.fstat(reused)  # still open
        os.close(reused)
    finally:
        sock.close()


def _bound_inside(net: netns.SlotNet) -> socket.socket:
    with netns.entered(net):
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(f"\0rlvr-test-left-{os.getpid()}")
    return sock


def test_making_a_namespace_without_the_capability_says_why(monkeypatch):
    monkeypatch.setattr(netns, "_libc", None)
    net, why = netns.make()
    assert net is None and "unshare" in why


# ----------------------------------------------------------------------------- closing a sandbox

def _open_fds() -> set[int]:
    return set(map(int, os.listdir("/proc/self/fd")))


@pytest.mark.skipif(sbx.detect_isolation() != "bwrap", reason="bubblewrap unavailable")
def test_close_waits_for_runs_in_flight_and_later_runs_raise():
    sb = Sandbox(workers=1, limits=Limits(wall_s=5.0))
    started = threading.Event()
    result: dict = {}

    def slow():
        started.set()
        result["run"] = sb.run("import time; time.sleep(0.5); print('done')")

    worker = threading.Thread(target=slow)
    worker.start()
    started.wait()
    time.sleep(0.1)
    sb.close()  # returns only once the run in flight has given its slot back
    assert "run" in result and result["run"].verdict is Verdict.OK and result["run"].stdout == "done\n"
    assert all(net is None for net in sb._netns)
    worker.join()
    with pytest.raises(RuntimeError, match="closed"):
        sb.run("print(1)")
    sb.close()  # a second close does nothing


@pytest.mark.skipif(sbx.detect_isolation() != "bwrap", reason="bubblewrap unavailable")
def test_close_from_a_pool_thread_and_run_many_after_close():
    """``close`` from one of the sandbox's own pool threads neither joins itself nor hangs; after
    it ``run_many`` raises without starting a new pool."""
    sb = Sandbox(workers=2, limits=Limits(wall_s=5.0))
    assert sb.run_many([dict(source="print(1)")])[0].stdout == "1\n"
    sb._executor().submit(sb.close).result(timeout=30)
    assert sb._closed and sb._pool is None and all(net is None for net in sb._netns)
    threads = threading.active_count()
    with pytest.raises(RuntimeError, match="closed"):
        sb.run_many([dict(source="print(1)")])
    assert sb._pool is None and threading.active_count() <= threads


@pytest.mark.skipif(sbx.detect_isolation() != "bwrap", reason="bubblewrap unavailable")
def test_close_inside_a_run_of_the_same_thread_does_not_wait_for_itself(monkeypatch):
    """A signal handler's ``close`` interrupts a run of its own thread: the slot that run holds
    is not waited for (it comes back when the run ends)."""
    sb = Sandbox(workers=1, limits=Limits(wall_s=5.0))
    closed = []
    real = sb._run_in_slot

    def run_then_close(*args, **kwargs):
        result = real(*args, **kwargs)
        if not closed:
            closed.append(True)
            sb.close()  # on the thread holding the slot
        return result

    monkeypatch.setattr(sb, "_run_in_slot", run_then_close)
    done = []
    worker = threading.Thread(target=lambda: done.append(sb.run("print(1)")))
    worker.start()
    worker.join(timeout=30)
    assert not worker.is_alive() and done[0].stdout == "1\n" and sb._closed


@pytest.mark.skipif(sbx.detect_isolation() != "bwrap", reason="bubblewrap unavailable")
def test_texts_that_cannot_be_encoded_leave_no_fd_open():
    with Sandbox(workers=1) as sb:
        sb.run("print(1)")
        before = _open_fds()
        for job in (dict(source="print('\ud800')"), dict(source="print(1)", stdin="\ud800"),
                    dict(source="print(1)", files={"a.py": "x = 1", "b.py": "'\ud800'"}),
                    dict(source="print(1)", argv=["a\0b"])):
            r = sb.run(**job)
            assert r.verdict is Verdict.SANDBOX_ERROR, (job, r)
        assert _open_fds() == before


# ------------------------------------------------------------------------------ device directory

@pytest.fixture()
def places(monkeypatch):
    """The device directory made under a root-only folder of its own in ``/dev``, by a process
    that has none yet."""
    if not ROOT or not devices._root_only("/dev"):
        pytest.skip("needs root and a /dev only root can write to")
    folder = tempfile.mkdtemp(prefix="rlvr-test-", dir="/dev")
    os.chmod(folder, 0o755)
    monkeypatch.setattr(devices, "_checked", [])
    monkeypatch.setattr(devices, "PLACES", (folder,))
    yield Path(folder)
    shutil.rmtree(folder, ignore_errors=True)


def test_device_directory_is_made_once_and_again_when_damaged(places):
    path = devices.device_dir()
    if path is None:
        pytest.skip("no mount here honours device nodes")
    assert path == str(places / devices.NAME) and devices.device_dir() == path
    info = os.lstat(path)
    assert info.st_uid == 0 and stat.S_IMODE(info.st_mode) == 0o755
    for name, (major, minor) in devices.DEVICES.items():
        node = os.lstat(os.path.join(path, name))
        assert stat.S_ISCHR(node.st_mode) and stat.S_IMODE(node.st_mode) == 0o666
        assert (os.major(node.st_rdev), os.minor(node.st_rdev)) == (major, minor)
    assert {name: os.readlink(os.path.join(path, name)) for name in devices.LINKS} == devices.LINKS
    with open(os.path.join(path, "zero"), "rb") as f:
        assert f.read(4) == b"\0" * 4
    os.unlink(os.path.join(path, "urandom"))  # a cleaner took an entry
    assert devices.device_dir() == path and os.path.exists(os.path.join(path, "urandom"))
    (places / devices.NAME / "extra").write_text("x")  # or left one
    assert devices.device_dir() == path and not os.path.exists(os.path.join(path, "extra"))
    shutil.rmtree(path)  # or took all of it
    assert devices.device_dir() == path and sorted(os.listdir(path)) == sorted({*devices.DEVICES, *devices.LINKS,
                                                                                  "shm"})
    assert os.listdir(places) == [devices.NAME]  # no temporary left


def test_a_place_others_may_write_to_is_never_used(monkeypatch, tmp_path):
    """bwrap binds by path: where anybody else may write (the temp directory, ``/dev/shm``), a
    link could take the directory's name between the check and the bind."""
    monkeypatch.setattr(devices, "_checked", [])
    os.chmod(tmp_path, 0o1777)
    monkeypatch.setattr(devices, "PLACES", (str(tmp_path),))
    assert not devices._root_only(str(tmp_path)) and devices.device_dir() is None
    assert os.listdir(tmp_path) == []
    assert not devices._root_only("relative/dev")


def test_a_directory_that_cannot_be_read_is_left_alone(places, monkeypatch):
    """An error reading the directory (here every listing refused) is no proof it is wrong: it is
    neither used nor removed."""
    path = devices.device_dir()
    if path is None:
        pytest.skip("no mount here honours device nodes")
    monkeypatch.setattr(devices, "_checked", [])
    real_listdir = os.listdir

    def refused(target):
        if str(target).startswith(path):
            raise OSError(24, "Too many open files")
        return real_listdir(target)

    monkeypatch.setattr(devices.os, "listdir", refused)
    assert devices.device_dir() is None
    monkeypatch.setattr(devices.os, "listdir", real_listdir)
    assert devices.device_dir() == path  # still there, as it was


def test_no_device_directory_without_root(places, monkeypatch):
    monkeypatch.setattr(devices.os, "geteuid", lambda: 1000)
    assert devices.device_dir() is None


def test_no_device_directory_where_mounts_refuse_devices(places, monkeypatch):
    """A ``nodev`` mount makes nodes that cannot be opened: the directory is not used."""
    real_open = os.open

    def nodev_open(path, flags, *args, **kwargs):
        if str(path).endswith("/null"):
            raise PermissionError(13, "Permission denied")
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(devices.os, "open", nodev_open)
    assert devices.device_dir() is None
