"""The processes of a slot uid, and the backstop that kills them all after every run."""

from __future__ import annotations

import os
import signal
import sys
import time

__all__ = ["uid_processes", "sweep_uid", "reap", "is_subreaper", "become_subreaper"]


def uid_processes(uid: int) -> tuple[list[int], list[int]]:
    """(live, zombie) pids owned by ``uid``."""
    live, zombies = [], []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.stat(f"/proc/{name}").st_uid != uid:
                    continue
                with open(f"/proc/{name}/stat", "rb") as f:
                    state = f.read().rsplit(b")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            (zombies if state in (b"Z", b"X") else live).append(int(name))
    return live, zombies


def sweep_uid(uid: int, wait_s: float = 3.0) -> int:
    """SIGKILL every live process owned by ``uid`` (a slot uid nothing else uses) until none is left.

    Zombies that are ours (we are a child subreaper, see ``become_subreaper``) are reaped, so
    they do not count against the slot's RLIMIT_NPROC. Returns how many kill signals were sent.
    """
    killed = 0
    deadline = time.monotonic() + wait_s
    while True:
        live, zombies = uid_processes(uid)
        for pid in zombies:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
        if not live or time.monotonic() > deadline:
            return killed
        for pid in live:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except OSError:
                pass
        time.sleep(0.002)


def reap(pid: int, uid: int, wait_s: float = 1.0) -> bool:
    """Wait until ``pid``, a killed process of ``uid`` (bwrap's pid 1, which comes to us, the
    subreaper, when our bwrap exits first), is gone: reaped here if it is our child, else by its
    parent. True once it is gone (or its pid names another uid's process, never waited for),
    False if it is still there after ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            if os.stat(f"/proc/{pid}").st_uid != uid:
                return True
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return True
        except FileNotFoundError:
            return True
        except ChildProcessError:  # not ours (yet): its parent reaps it
            pass
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)


def is_subreaper() -> bool:
    """Whether ``become_subreaper`` took effect in this process."""
    return _subreaper


_subreaper = False


def become_subreaper() -> None:
    """Adopt orphaned descendants (bwrap's pid-1 outlives our bwrap by a moment), so we reap them
    instead of leaving zombies to a container init that may reap slowly."""
    global _subreaper
    if _subreaper or not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        _subreaper = libc.prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass
