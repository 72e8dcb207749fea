"""What a sandbox makes once and its samples share: a network namespace per slot and the
device directory bound as every sample's ``/dev`` (the samples' view of both is tested in
``test_hostile.py``), and how a sandbox lets them go."""

from __future__ import annotations

import os
import shutil
import socket
import stat
import threading
import time

import pytest
from _threads import in_thread

from rlvr.rewards import sandbox as sbx
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

    def bind_inside():
        with netns.entered(slot_net):
            sock = socket.socket(socket.AF_UNIX)
            sock.bind("\0rlvr-test-left-behind")
        return sock

    sock = in_thread(bind_inside)
    try:
        assert slot_net.holds_sockets()
        old = os.fstat(slot_net.fd).st_ino
        fresh = netns.clean(slot_net)
        assert fresh is not None and os.fstat(fresh.fd).st_ino != old and not fresh.holds_sockets()
        fresh.close()
    finally:
        sock.close()


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
def places(monkeypatch, tmp_path):
    """The device directory made under ``tmp_path`` by a process that has none yet."""
    monkeypatch.setattr(devices, "_checked", [])
    monkeypatch.setattr(devices, "PLACES", (str(tmp_path),))
    return tmp_path


@pytest.mark.skipif(not ROOT, reason="device nodes need root (CAP_MKNOD)")
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
    os.unlink(os.path.join(path, "urandom"))  # a temp cleaner took an entry
    assert devices.device_dir() == path and os.path.exists(os.path.join(path, "urandom"))
    shutil.rmtree(path)  # or all of it
    assert devices.device_dir() == path and sorted(os.listdir(path)) == sorted({*devices.DEVICES, *devices.LINKS,
                                                                                  "shm"})
    assert [name for name in os.listdir(places) if name != devices.NAME] == []  # no temporary left


@pytest.mark.skipif(not ROOT, reason="device nodes need root (CAP_MKNOD)")
def test_a_directory_somebody_else_made_is_never_used(places):
    """Another user's directory (or one with an entry of their own) under the name is not a
    sample's ``/dev``, and is left as it is."""
    foreign = places / devices.NAME
    foreign.mkdir()
    (foreign / "null").write_text("not a device")
    os.chown(foreign, 1000, 1000)
    assert devices.device_dir() is None
    assert os.listdir(foreign) == ["null"] and os.lstat(foreign).st_uid == 1000


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
    monkeypatch.setattr(devices.os, "geteuid", lambda: 0)
    assert devices.device_dir() is None
