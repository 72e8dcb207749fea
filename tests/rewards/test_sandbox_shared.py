"""What a sandbox makes once and its samples share: a network namespace per slot and the
device directory bound as every sample's ``/dev`` (the samples' view of both is tested in
``test_hostile.py``)."""

from __future__ import annotations

import os
import shutil
import stat
import threading

import pytest

from rlvr.rewards.sandbox import devices, netns

ROOT = os.geteuid() == 0


def _thread_netns() -> str:
    return os.readlink("/proc/thread-self/ns/net")


@pytest.mark.skipif(not ROOT, reason="making a network namespace needs root (CAP_SYS_ADMIN)")
def test_a_slot_namespace_is_entered_by_one_thread_and_left():
    fd, why = netns.make()
    if fd is None:
        pytest.skip(f"no network namespace here: {why}")
    try:
        home, slot = _thread_netns(), f"net:[{os.fstat(fd).st_ino}]"
        seen: dict[str, str] = {}

        def starter():  # as the sandbox's worker thread does around a sample's fork
            with netns.entered(fd):
                seen["inside"] = _thread_netns()
                seen["main thread"] = os.readlink("/proc/self/ns/net")  # /proc/self: the thread group leader
            seen["after"] = _thread_netns()
            try:
                with netns.entered(fd):
                    raise KeyError("the body fails")
            except KeyError:
                seen["after a failure"] = _thread_netns()

        worker = threading.Thread(target=starter)
        worker.start()
        worker.join()
        assert slot != home
        assert seen == {"inside": slot, "main thread": home, "after": home, "after a failure": home}
        assert _thread_netns() == home
    finally:
        netns.close([fd])


def test_entered_none_is_a_no_op():
    before = _thread_netns()
    with netns.entered(None):
        assert _thread_netns() == before


def test_making_a_namespace_without_the_capability_says_why(monkeypatch):
    monkeypatch.setattr(netns, "_libc", None)
    fd, why = netns.make()
    assert fd is None and "unshare" in why


@pytest.fixture()
def fresh_devices(monkeypatch):
    monkeypatch.setattr(devices, "_made", [])
    yield
    for path in devices._made:
        if path:
            shutil.rmtree(path, ignore_errors=True)


@pytest.mark.skipif(not ROOT, reason="device nodes need root (CAP_MKNOD)")
def test_device_directory_is_made_once_and_again_when_gone(fresh_devices):
    path = devices.device_dir()
    if path is None:
        pytest.skip("no mount here honours device nodes")
    assert devices.device_dir() == path
    info = os.lstat(path)
    assert info.st_uid == 0 and stat.S_IMODE(info.st_mode) == 0o755
    for name, (major, minor) in devices.DEVICES.items():
        node = os.lstat(os.path.join(path, name))
        assert stat.S_ISCHR(node.st_mode) and stat.S_IMODE(node.st_mode) == 0o666
        assert (os.major(node.st_rdev), os.minor(node.st_rdev)) == (major, minor)
    assert {name: os.readlink(os.path.join(path, name)) for name in devices.LINKS} == devices.LINKS
    with open(os.path.join(path, "zero"), "rb") as f:
        assert f.read(4) == b"\0" * 4
    shutil.rmtree(path)  # a temp cleaner took it
    again = devices.device_dir()
    assert again is not None and again != path and os.path.isdir(os.path.join(again, "shm"))


def test_no_device_directory_without_root(fresh_devices, monkeypatch):
    monkeypatch.setattr(devices.os, "geteuid", lambda: 1000)
    assert devices.device_dir() is None


def test_no_device_directory_where_mounts_refuse_devices(fresh_devices, monkeypatch, tmp_path):
    """A ``nodev`` mount makes nodes that cannot be opened: the directory is not used."""
    real_open = os.open

    def nodev_open(path, flags, *args, **kwargs):
        if str(path).endswith("/null"):
            raise PermissionError(13, "Permission denied")
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(devices.os, "open", nodev_open)
    monkeypatch.setattr(devices, "PLACES", (str(tmp_path),))
    monkeypatch.setattr(devices.os, "mknod", lambda path, mode, dev: open(path, "w").close())
    monkeypatch.setattr(devices.os, "geteuid", lambda: 0)
    assert devices.device_dir() is None
    assert os.listdir(tmp_path) == []  # the half-made directory is removed
