"""The command line a sandboxed program runs under, and the loop that runs it: stdin fed through a
pipe, stdout and stderr drained with a cap, the wall clock enforced, bwrap's status read.

Nothing of the sample runs before it is in its cgroup with ``oom_score_adj`` 1000 (``admit``),
and no ``preexec_fn`` (unsafe next to threads) does it. Where the cgroup allows it (v1), the
process is born there (``around_spawn``); otherwise it is moved in while it waits:

- **bwrap**: its pid 1 waits on ``--block-fd`` after the mounts, before it starts the program; the
  parent admits that pid as soon as bwrap reports it (a cgroup move overlaps bwrap's setup),
  then releases the block. The rlimits come from the gate's ``ulimit`` line, without its wait, in
  front of bwrap (not ``prlimit(2)`` on the waiting pid 1 from here: that needs CAP_SYS_RESOURCE,
  which root in a container often lacks; a process lowering its own limits needs nothing).
- **unshare, none**: a ``/bin/sh`` **gate** in front sets the rlimits (``ulimit``, with the
  options whose units POSIX shells share) and reads one line from its stdin pipe before it execs
  the rest; the parent admits it while it waits, then writes the line.

As root, the slot's uid is taken by an exec first in the chain, not by ``Popen(user=)``: CPython
then forks instead of using ``vfork``, copying the trainer's page tables (0.2-0.7 s a program from
a parent holding 0.5-2 GB on a loaded 2-core VM, against 20-27 ms by ``vfork``; the copy would
also be charged to a sample cgroup the process is born in). In front of bwrap that exec is
coreutils' ``chroot`` to ``/`` with numeric ``+uid`` ids (``uid_prefix``): it only clears the
groups, sets the gid and uid and execs, where ``setpriv`` first looks the uid up as a user name
through NSS (loading ``libnss_systemd``), about 1 ms of CPU a program.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import selectors
import shutil
import signal
import subprocess
import time

from rlvr.rewards.sandbox.results import Limits

__all__ = ["ENV", "SETUP_S", "WAKE_BURST", "WAKE_INTERVAL_S", "CHROOT", "gate", "bwrap_prefix", "admit",
           "setpriv_prefix", "uid_prefix", "shquote", "execute", "Ended"]

# RLIMIT_NPROC is -p in dash and busybox, -u in bash (whose -p is the read-only pipe size).
_LIMITS = ('ulimit -t "$1" && ulimit -S -t "$2" && ulimit -v "$3" && ulimit -f "$4" && ulimit -n "$5" && ulimit -c 0 '
           '&& { ulimit -p "$6" 2>/dev/null || ulimit -u "$6"; }')
_GATE = _LIMITS + ' && read -r _ || exit 125; shift 6; exec "$@"'
_NO_WAIT = _LIMITS + ' || exit 125; shift 6; exec "$@"'


def gate(limits: Limits, wait: bool = True) -> list[str]:
    """The start gate with ``limits``: exits 125, running nothing, if a limit cannot be set or (with
    ``wait``) the parent closes stdin without opening the gate. Without ``wait`` it only sets the
    limits (bwrap waits on its own ``--block-fd``); a shell is a cheaper exec than ``prlimit``."""
    cpu = limits.cpu_s if limits.cpu_s is not None else max(1, int(-(-limits.wall_s // 1)))
    return ["/bin/sh", "-c", _GATE if wait else _NO_WAIT, "rlvr-sbx", str(cpu + 1), str(cpu),
            str(limits.memory_mb << 10), str(limits.file_mb << 11), str(limits.nofile),
            str(limits.nproc)]  # -v in KiB, -f in 512-byte blocks


WAKE_BURST = 64
WAKE_INTERVAL_S = 0.01
"""The reader of a run's output wakes at most ``WAKE_BURST`` times at once, then at most once per
``WAKE_INTERVAL_S``: its CPU is the trainer's, outside the sample's quota, and 24 processes writing
one byte at a time woke it for every byte (0.40 s of CPU per 2 s sample, 0.13 s for an honest one).
An honest program wakes it a few times (its output, the ends of its pipes, bwrap's status); what a
program writes in between waits in its pipes and is read in one wake."""

SETUP_S = 10.0
"""How long the sandbox may take to start a program (cgroup, uid drop, bwrap's mounts) before the
run is a SANDBOX_ERROR; the wall clock of ``Limits.wall_s`` starts only when the program does."""

ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1",
       "PYTHONIOENCODING": "utf-8", "OMP_NUM_THREADS": "1"}


def bwrap_prefix(python: str, task_files: dict[str, int], limits: Limits, status_fd: int | None,
                 block_fd: int | None, seccomp_fd: int | None, new_net: bool = True,
                 dev_dir: str | None = None) -> list[str]:
    """New user (nested ones disabled), pid, ipc, uts, cgroup and mount namespaces, and a new
    network namespace unless ``new_net`` is False (the caller starts bwrap inside a slot's own:
    ``netns``); a read-only ``/proc`` (the sample cannot lower the ``oom_score_adj`` it was
    admitted with: that write has no floor without CAP_SYS_RESOURCE, which root in a container
    often lacks) and a ``/dev`` the sample cannot write, with a sized ``/dev/shm``: bwrap's own,
    made read-only, or ``dev_dir`` (``devices``, owned by a user the sample's namespace does not
    map) in one bind. The program's files are copied in from ``task_files`` (name -> an fd bwrap
    reads to its end) under ``/task``, and the root is then made read-only: only ``/work``, ``/tmp``
    and ``/dev/shm``, each sized, take writes (bwrap's root tmpfs, owned by the sample's user, is
    not sized). Each fd only when given: bwrap's status lines on ``status_fd``, its pid 1 waiting
    on ``block_fd`` (after the mounts, before it starts the program), the seccomp filter read from
    ``seccomp_fd``."""
    args = [*_BWRAP, *(() if new_net else ("--share-net",)), *_root(python)]
    disk = str(limits.disk_mb << 20)
    shm = ["--size", str(limits.shm_mb << 20), "--tmpfs", "/dev/shm"]
    # a read-only remount of a bind holding devices would make them unopenable (nodev)
    dev = ["--dev-bind", dev_dir, "/dev", *shm] if dev_dir else ["--dev", "/dev", *shm, "--remount-ro", "/dev"]
    args += ["--proc", "/proc", "--remount-ro", "/proc", *dev, "--size", disk, "--tmpfs", "/tmp", "--size", disk,
             "--tmpfs", "/work"]
    for name, fd in task_files.items():
        args += ["--file", str(fd), f"/task/{name}"]
    args += ["--remount-ro", "/", "--chdir", "/work", "--clearenv", "--cap-drop", "ALL"]
    for flag, fd in (("--json-status-fd", status_fd), ("--block-fd", block_fd), ("--seccomp", seccomp_fd)):
        if fd is not None:
            args += [flag, str(fd)]
    return args + _SANDBOX_ENV


_BWRAP = (shutil.which("bwrap") or "bwrap", "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent",
          "--new-session")
_SANDBOX_ENV = [arg for key, value in {**ENV, "HOME": "/work", "TMPDIR": "/tmp"}.items()
                for arg in ("--setenv", key, value)]


@functools.lru_cache(maxsize=8)
def _root(python: str) -> tuple[str, ...]:
    """The read-only system a sample sees: ``/usr``, the top-level links into it (or binds where
    they are directories) and the interpreter's prefix when it lives elsewhere; looked up once."""
    args = ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "lib", "lib64", "sbin", "lib32"):
        target = os.path.join("/", name)
        if os.path.islink(target):
            args += ["--symlink", os.readlink(target), target]
        elif os.path.isdir(target):
            args += ["--ro-bind", target, target]
    prefix = os.path.dirname(os.path.dirname(os.path.realpath(python)))
    if not prefix.startswith("/usr"):
        args += ["--ro-bind", prefix, prefix]
    return tuple(args)


def admit(pid: int) -> None:
    """Make the gated process the OOM killer's first choice (1000: sandboxed code dies before the
    trainer under memory pressure). Raises OSError when the kernel refuses."""
    with open(f"/proc/{pid}/oom_score_adj", "w") as f:
        f.write("1000")


def setpriv_prefix(uid: int) -> list[str]:
    """Drop root to the slot's uid for good: real, effective and saved ids, no supplementary
    groups, ``no_new_privs`` (inside ``unshare``, which needs root to make the namespaces, or in
    front of the program)."""
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs", "--"]


CHROOT = shutil.which("chroot", path="/usr/sbin:/usr/bin:/sbin:/bin")


def uid_prefix(uid: int) -> list[str]:
    """Drop root to the slot's uid in front of bwrap: the ids and groups of ``setpriv_prefix``
    (``chroot`` sets real, effective and saved ids as root; ``+`` makes them numbers, never
    names to look up; ``/`` is the root already), without ``no_new_privs``, which bwrap sets
    itself before it starts the sample (only the fixed ``ulimit`` shell and bwrap, neither
    setuid, run in between). ``setpriv_prefix`` where coreutils' ``chroot`` is missing."""
    if CHROOT is None:
        return setpriv_prefix(uid)
    return [CHROOT, f"--userspec=+{uid}:+{uid}", "--groups=", "--skip-chdir", "/"]


def shquote(s: str) -> str:
    return "'" + s.replace("'", "'\"'\"'") + "'"


class Ended:
    """How the process tree ended, as seen from outside."""

    def __init__(self, rc, stdout, stderr, elapsed, timed_out, overflow, started, init_pid=None):
        self.rc, self.stdout, self.stderr, self.elapsed = rc, stdout, stderr, elapsed
        self.timed_out, self.overflow, self.started = timed_out, overflow, started
        self.init_pid = init_pid  # bwrap's child, the sandbox's pid 1 (None without bwrap or before it reported)


def _child_pid(raw: bytes) -> int | None:
    """bwrap's child (the sandbox's pid 1, as the host numbers it) once its status line is complete."""
    for line in raw.decode(errors="replace").splitlines(keepends=True):
        if line.endswith("\n"):
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if isinstance(message, dict) and type(message.get("child-pid")) is int:
                return message["child-pid"]
    return None


def _status(raw: bytes) -> tuple[bool, int | None]:
    """(the child started, its exit code) from bwrap's JSON status lines; a malformed line is skipped."""
    started, code = False, None
    for line in raw.decode(errors="replace").splitlines():
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if isinstance(message, dict):
            started = started or "child-pid" in message
            if code is None and type(message.get("exit-code")) is int:
                code = message["exit-code"]
    return started, code


def execute(cmd, cwd, env, stdin: bytes | None, status_r, status_w, extra_fds, limits: Limits,
            on_start=None, block_w: int | None = None, around_spawn=None, on_stop=None) -> Ended:
    """Run ``cmd`` in a new session, feed ``stdin`` while draining its output.

    With ``block_w`` (bwrap's ``--block-fd``, whose write end this owns and closes), ``on_start``
    gets bwrap's child, the sandbox's pid 1, as soon as bwrap reports it, while it sets up the
    mounts; one byte on ``block_w`` then lets it start the program. Otherwise the gate is put in
    front of ``cmd`` and ``on_start`` gets its pid at once; its line, then the data, go to
    stdin after ``on_start`` returns. An exception in ``on_start`` kills the tree (before the
    block is released) and propagates. ``around_spawn`` (a context manager factory) is entered
    around the fork, by the thread that forks. ``on_stop`` (no arguments) is called when the run
    ends, before the tree is killed and waited for: the sandbox kills the sample's cgroup there.

    The wall clock (and ``Ended.elapsed``) starts when the program is let go, after ``on_start``:
    the sandbox's own start-up (a cgroup move, bwrap's namespaces) is not charged to it, so a
    verdict near the limit does not flip with the host's load. Before that, ``SETUP_S`` bounds
    the start-up; a sandbox that never lets the program go is reported as not started."""
    start = time.monotonic()
    pass_fds = tuple(fd for fd in (status_w, *extra_fds) if fd is not None)
    proc = None
    try:
        with around_spawn() if around_spawn is not None else contextlib.nullcontext():
            proc = subprocess.Popen(cmd if block_w is not None else gate(limits) + cmd, cwd=cwd, env=env,
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    start_new_session=True, pass_fds=pass_fds, close_fds=True)
    except BaseException:
        if proc is not None:  # started, but the starting thread could not go back home: end it unreleased
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            for f in (proc.stdin, proc.stdout, proc.stderr):
                f.close()
        if block_w is not None:  # nothing waits on it any more
            os.close(block_w)
        raise
    finally:
        for fd in pass_fds:
            os.close(fd)
    deadline = start + limits.wall_s + SETUP_S  # until the program starts; then its own wall clock
    out_fd, err_fd, in_fd = proc.stdout.fileno(), proc.stderr.fileno(), proc.stdin.fileno()
    bufs = {out_fd: bytearray(), err_fd: bytearray()}
    status = bytearray()
    sel = selectors.DefaultSelector()
    for fd in (out_fd, err_fd, in_fd) + ((status_r,) if status_r is not None else ()):
        os.set_blocking(fd, False)
        if fd != in_fd:
            sel.register(fd, selectors.EVENT_READ)
    pending = memoryview((b"" if block_w is not None else b"\n") + (stdin or b""))  # the gate's line, the data
    admitted, init_pid = False, None

    def admit(pid: int) -> None:
        nonlocal admitted, block_w, start, deadline, init_pid
        init_pid = pid if block_w is not None else None
        if on_start is not None:
            on_start(pid)
        admitted, start = True, time.monotonic()  # the program starts now: its clock, not the sandbox's
        deadline = start + limits.wall_s
        if block_w is not None:
            os.write(block_w, b"x")
            os.close(block_w)
            block_w = None
        sel.register(in_fd, selectors.EVENT_WRITE)

    timed_out = overflow = False
    exited_at = None
    wakes, woke_at = 0, 0.0
    try:
        if block_w is None:  # the gate in front: admitted at once
            admit(proc.pid)
        while len(sel.get_map()) > (admitted and in_fd in sel.get_map()):
            now = time.monotonic()
            if now >= deadline:
                timed_out = admitted  # never started in time: the sandbox's failure, not a TIMEOUT
                break
            if exited_at is None and proc.poll() is not None:
                exited_at = now
            if exited_at is not None and now - exited_at > 0.2:  # a leftover holds the pipes
                break
            if wakes > WAKE_BURST and (pause := min(woke_at + WAKE_INTERVAL_S, deadline) - now) > 0:
                time.sleep(pause)  # the program's writes wait in its pipes, read together after
                continue
            ready = sel.select(timeout=min(0.05, deadline - now))
            if any(key.fd != in_fd for key, _ in ready):
                wakes, woke_at = wakes + 1, time.monotonic()
            for key, _ in ready:
                fd = key.fd
                if fd == in_fd:
                    try:
                        pending = pending[os.write(fd, pending[:65536]):]
                    except BlockingIOError:
                        continue
                    except OSError:  # the program closed its stdin or exited: the rest is not read
                        pending = pending[:0]
                    if not pending:
                        sel.unregister(fd)
                        proc.stdin.close()
                    continue
                try:
                    chunk = os.read(fd, 65536)
                except BlockingIOError:
                    continue
                if not chunk:
                    sel.unregister(fd)
                    continue
                if fd == status_r:
                    status += chunk[:4096]
                    if not admitted and (pid := _child_pid(bytes(status))) is not None:
                        admit(pid)
                    continue
                buf = bufs[fd]
                room = limits.output_bytes - len(buf)
                buf += chunk[:max(room, 0)]
                if len(chunk) > room:
                    overflow = True
            if overflow:
                break
    finally:
        sel.close()
        if on_stop is not None:
            on_stop()
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        if block_w is not None:  # never released: closed only once the tree is dead
            os.close(block_w)
        proc.wait()
        for f in (proc.stdin, proc.stdout, proc.stderr):
            try:
                f.close()
            except OSError:
                pass
    elapsed = time.monotonic() - start
    rc, started = proc.returncode, True
    if status_r is not None:  # bwrap reports whether the child started, and its exit code
        try:
            status += os.read(status_r, 4096)
        except OSError:
            pass
        started, code = _status(bytes(status))
        rc = code if code is not None else rc
    out = bufs[out_fd].decode("utf-8", errors="replace")
    err = bufs[err_fd].decode("utf-8", errors="replace")
    return Ended(rc, out, err, elapsed, timed_out, overflow, started, init_pid)
