"""The `Sandbox`: worker slots that run model-written programs under the layers the package
describes (`rlvr.rewards.sandbox`): its own uid, cgroup and network namespace per slot, the exec
chain from `launch`, and the verdict from the host side."""

from __future__ import annotations

import contextlib
import functools
import os
import queue
import shutil
import sys
import tempfile
import threading
import time
import warnings
import weakref
from concurrent.futures import ThreadPoolExecutor

import rlvr.rewards.sandbox.cgroup as cgroup
import rlvr.rewards.sandbox.devices as devices
import rlvr.rewards.sandbox.launch as launch
import rlvr.rewards.sandbox.netns as netns
import rlvr.rewards.sandbox.seccomp as seccomp
from rlvr.rewards.sandbox.procs import become_subreaper, is_subreaper, reap, sweep_uid
from rlvr.rewards.sandbox.results import Limits, RunResult, Verdict, classify

__all__ = ["ISOLATIONS", "Sandbox", "SandboxWarning", "cgroup_host", "detect_isolation", "default_python"]

ISOLATIONS = ("auto", "bwrap", "unshare", "none")
"""Sandbox isolation modes (`auto` picks the strongest that works here)."""


class SandboxWarning(UserWarning):
    """Full isolation is unavailable on this host."""


_DEFAULT_LIMITS = Limits()
_warned: set[str] = set()
_isolation_cache: dict[tuple, str] = {}
_cgroups: list = []  # [(CgroupHost | None, reason)] once found
_cgroup_lock = threading.Lock()
_warm_times: dict[tuple[str, str], float] = {}  # (interpreter, isolation) -> when its trusted run last ran here
_CLOSED = "sandbox: closed; make a new Sandbox"
REWARM_S = 60.0
"""A sample whose group still held more than ``cgroup.WARM_AGAIN_ABOVE`` at its removal makes the
sandbox repeat its trusted run, at most this often: pages that run charged here may have been
evicted since and read back by samples (a sample that reads other files repeats it needlessly,
once a minute at most, in that sample's own call)."""

WARM_SOURCE = "import bisect, collections, functools, heapq, itertools, json, math, re, string, typing\nprint('ok')"
"""The trusted run outside any sample group (``Sandbox._warm``): the sandbox's own start-up and the
grader's imports, with the modules graded programs import most."""


@contextlib.contextmanager
def _spawning(group: cgroup.SampleCgroup | None, slot_net: netns.SlotNet | None):
    """Around the fork of a sample's chain: the starting thread sits in the sample's cgroup (v1:
    the sample is born in it) and in the slot's network namespace, and is back home after."""
    with group.spawning() if group is not None else contextlib.nullcontext(), netns.entered(slot_net):
        yield


def _close_nets(nets: list) -> None:
    """Let the slots' network namespaces go (each dies with its last reference)."""
    for k, net in enumerate(nets):
        if net is not None:
            net.close()
            nets[k] = None


def _plain_name(name: str) -> str:
    """``name`` if it names a file directly inside the program's directory, else ValueError."""
    if not name or os.path.basename(name) != name or name in (".", ".."):
        raise ValueError(f"sandbox: file name {name!r} must be a plain name")
    return name


def _memfd(content: bytes) -> int:
    """An fd holding ``content`` from its start, for bwrap to copy into the sandbox (any size: a
    pipe would block past its buffer before bwrap reads it)."""
    fd = os.memfd_create("rlvr-task", os.MFD_CLOEXEC)
    try:
        os.write(fd, content)  # a memfd takes a whole write at once
        os.lseek(fd, 0, os.SEEK_SET)
    except OSError:
        os.close(fd)
        raise
    return fd


def _warn_once(key: str, message: str) -> None:
    if key in _warned:
        return
    _warned.add(key)
    banner = "!" * 78
    print(f"{banner}\nrlvr sandbox WARNING: {message}\n{banner}", file=sys.stderr, flush=True)
    warnings.warn(message, SandboxWarning, stacklevel=3)


def default_python() -> str:
    """An interpreter under /usr that the sandbox can see (a venv under $HOME or a repo is not)."""
    for path in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.access(path, os.X_OK):
            return path
    return sys._base_executable if hasattr(sys, "_base_executable") else sys.executable


def _task_root() -> str | None:
    """Where each run's files go without bwrap (which copies them in): ``/dev/shm`` when it is a
    writable tmpfs directory (removing a directory from a journaling disk costs milliseconds per
    program), else the temp directory."""
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK | os.X_OK) else None


_TASK_ROOT = _task_root()


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def cgroup_host() -> tuple[cgroup.CgroupHost | None, str]:
    """This process's place for sample cgroups, found once: (host, "") or (None, why not)."""
    with _cgroup_lock:
        if not _cgroups:
            _cgroups.append(cgroup.CgroupHost.find() if sys.platform.startswith("linux") else (None, "not Linux"))
        return _cgroups[0]


def detect_isolation(python: str | None = None, base_uid: int = 60000) -> str:
    """The strongest mode that works here: ``bwrap``, ``unshare`` (root) or ``none``."""
    python = python or default_python()
    key = (python, base_uid)
    if key in _isolation_cache:
        return _isolation_cache[key]
    mode = "none"
    probe = Sandbox(workers=1, isolation="bwrap", python=python, base_uid=base_uid, _probe=True)
    if shutil.which("bwrap") and (not _is_root() or launch.CHROOT or shutil.which("setpriv")):
        if probe.run("print(6*7)", limits=Limits(wall_s=10)).stdout.strip() == "42":
            mode = "bwrap"
    if mode == "none" and _is_root() and shutil.which("unshare") and shutil.which("setpriv"):
        probe.isolation = "unshare"
        if probe.run("print(6*7)", limits=Limits(wall_s=10)).stdout.strip() == "42":
            mode = "unshare"
    probe.close()  # its uid goes back: the sandbox being built after the probe starts at base_uid
    _isolation_cache[key] = mode
    return mode


class Sandbox:
    """A pool of ``workers`` sandbox slots; ``run`` is thread-safe, ``run_many`` fans out.

    >>> sb = Sandbox(workers=1)                                          # doctest: +SKIP
    >>> sb.run("print(input())", stdin="hi").stdout                      # doctest: +SKIP
    'hi\\n'
    """

    def __init__(self, *, workers: int = 2, limits: Limits = _DEFAULT_LIMITS, isolation: str = "auto",
                 python: str | None = None, base_uid: int = 60000, _probe: bool = False):
        if workers < 1:
            raise ValueError(f"sandbox: workers must be >= 1, got {workers}")
        if isolation not in ISOLATIONS:
            raise ValueError(f"sandbox: isolation must be auto|bwrap|unshare|none, got {isolation!r}")
        self.workers, self.limits, self.python, self.base_uid = workers, limits, python or default_python(), base_uid
        if not os.access(self.python, os.X_OK):
            raise ValueError(f"sandbox: interpreter {self.python!r} is not executable")
        self.root = _is_root()
        self.uid_range, self._release = range(base_uid, base_uid + workers), lambda: None
        if self.root:  # slot uids are used (and swept) as root only; otherwise every slot is our uid
            from rlvr.rewards.sandbox.uids import reserve

            become_subreaper()
            self.uid_range, self._release = reserve(self, base_uid, workers)
        if isolation == "auto":
            isolation = detect_isolation(self.python, base_uid)
        self.isolation = isolation
        self.cgroups, cgroup_reason = cgroup_host()
        self.seccomp, seccomp_reason = seccomp.bpf_program() if isolation == "bwrap" else (None, "")
        # The slots' namespaces serve only samples the filter holds to AF_UNIX (``netns``).
        shared_net = isolation == "bwrap" and self.root and self.seccomp is not None and not _probe
        self._netns = self._slot_netns() if shared_net else [None] * workers
        self._close_netns = weakref.finalize(self, _close_nets, self._netns)  # once: in close() or at collection
        self._closed = False
        self._held = threading.local()  # how many slots the calling thread holds (``close`` skips them)
        self._own_devices = isolation == "bwrap" and not _probe and devices.device_dir() is not None
        self._slots: queue.Queue[int] = queue.Queue()
        for k in range(workers):
            self._slots.put(k)
        self._pool: ThreadPoolExecutor | None = None
        self.counters = {"runs": 0, "sandbox_errors": 0, "swept": 0}
        self._lock = threading.Lock()
        self._probe = _probe
        if not _probe:
            self._announce(cgroup_reason, seccomp_reason)
            self._warm()

    def _slot_netns(self) -> list[netns.SlotNet | None]:
        """One empty network namespace per slot (``netns``), or none where this process cannot
        make them: bwrap then makes one for every sample."""
        made: list[netns.SlotNet | None] = []
        for _ in range(self.workers):
            net, _why = netns.make()
            if net is None:
                _close_nets(made)
                return [None] * self.workers
            made.append(net)
        return made

    def _warm(self, slot: int | None = None, again: bool = False) -> None:
        """Charge the page cache every sample needs to this process's own cgroup: the chain's
        binaries and libraries, the interpreter's start-up and ``WARM_SOURCE``'s modules, read by
        one trusted run outside any sample group, once per interpreter and isolation mode in this
        process. Otherwise the first sample to read them holds their pages, its group's reclaim
        drops them, and every later sample reads them from disk again (into a group whose reclaim
        drops them once more). ``again`` (from ``run``, in its
        ``slot``) repeats it, at most once per ``REWARM_S``. Never in a probe, whose mode may not work."""
        key = (self.python, self.isolation)
        last = _warm_times.get(key)
        if self._probe or self.cgroups is None or self.isolation == "none" or (
                last is not None and (not again or time.monotonic() - last < REWARM_S)):
            return
        _warm_times[key] = time.monotonic()
        own_slot = slot is None
        slot = self._slots.get() if own_slot else slot
        try:
            self._run_in_slot(slot, WARM_SOURCE, None, {}, [], self.limits, trusted=True)
        finally:
            if own_slot:
                self._slots.put(slot)

    def _announce(self, cgroup_reason: str, seccomp_reason: str) -> None:
        if self.cgroups is None:
            _warn_once("cgroup", f"no per-sample cgroup ({cgroup_reason}): a sample's memory (tmpfs, shm, many "
                       "processes) and CPU are bounded only by per-process rlimits. Run as root on a cgroup v2 "
                       "host, or delegate the memory, pids and cpu controllers to this process's cgroup.")
        if self.isolation == "bwrap" and self.seccomp is None:
            _warn_once("seccomp", f"no seccomp filter ({seccomp_reason}): sandboxed code can reach io_uring, bpf, "
                       "keyctl and other kernel interfaces. Install libseccomp2 and the pyseccomp package.")
        if self.isolation == "bwrap" and self.root:
            return
        if self.isolation == "bwrap":
            _warn_once("bwrap-nonroot", "running as a non-root user: every sandbox slot shares your uid, "
                       "so RLIMIT_NPROC is shared between concurrent programs")
        elif self.isolation == "unshare":
            _warn_once("unshare", "bubblewrap (bwrap) is not available: model-written code runs under "
                       "unshare (no network, own pid namespace, unprivileged uid) but SEES THE HOST "
                       "FILESYSTEM (world-readable files, world-writable dirs). Install bubblewrap.")
        else:
            _warn_once("none", "NO SANDBOX ISOLATION: bubblewrap is unavailable and this is not root, so "
                       "model-written code runs with rlimits only, as your user, with network and your "
                       "files reachable. Install bubblewrap (apt-get install bubblewrap).")

    # ------------------------------------------------------------------------------ public

    def run(self, source: str, *, stdin: str | bytes | None = None, files: dict[str, str] | None = None,
            argv: list[str] | None = None, limits: Limits | None = None) -> RunResult:
        """Run ``source`` as ``main.py`` (plus ``files``) with ``stdin`` text; block until done."""
        if self._closed:
            raise RuntimeError(_CLOSED)
        if threading.get_native_id() == os.getpid() and (
                any(self._netns) or (self.cgroups is not None and self.cgroups.version == 1)):
            # The main thread neither carries a sample into its cgroup as it starts
            # (``cgroup.spawning``) nor enters a slot's network namespace (``netns.entered``); a
            # worker thread does both, which saves moving the sample in afterwards (~10 ms on v1).
            return self._executor().submit(self.run, source, stdin=stdin, files=files, argv=argv,
                                           limits=limits).result()
        slot = self._slots.get()
        if self._closed:  # closed while this call waited for a slot
            self._slots.put(slot)
            raise RuntimeError(_CLOSED)
        self._held.count = getattr(self._held, "count", 0) + 1
        try:
            result = self._run_in_slot(slot, source, stdin, files or {}, argv or [], limits or self.limits)
            if (result.extra.get("memory_left_bytes") or 0) > cgroup.WARM_AGAIN_ABOVE:
                self._warm(slot, again=True)
            return result
        finally:
            self._held.count -= 1
            self._slots.put(slot)

    def run_many(self, jobs: list[dict]) -> list[RunResult]:
        """Run each job (keyword arguments of ``run``) on the worker pool; results in order."""
        if self._closed:
            raise RuntimeError(_CLOSED)
        pool = self._executor()
        futures = [pool.submit(lambda j=j: self.run(**j)) for j in jobs]
        return [f.result() for f in futures]

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            with self._lock:
                if self._closed:  # a run that passed its own check as close() began
                    raise RuntimeError(_CLOSED)
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="rlvr-sandbox")
        return self._pool

    def close(self) -> None:
        """Wait for the runs in flight, then give back what the slots hold (their uids and network
        namespaces); later runs raise. Once, from any thread: the pool's own (not joined; its
        threads end once idle) or a signal handler's (the slot its interrupted run holds is not
        waited for)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False)
        for _ in range(self.workers - getattr(self._held, "count", 0)):  # runs elsewhere give theirs back
            self._slots.get()
        self._release()  # the slot uids go back (once; also at exit or when the sandbox is collected)
        self._close_netns()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ------------------------------------------------------------------------------ one run

    def _command(self, uid, task, argv, limits, status_w, block_r, seccomp_r, new_net: bool = True,
                 dev_dir: str | None = None) -> tuple[list[str], str, dict]:
        """(command, cwd, env) for this isolation mode (bwrap's waits on ``block_r``, the others at
        the start gate ``launch.execute`` puts in front). ``task``: the program's files, a dict of
        name -> fd that bwrap copies in, or the host directory holding them for the other modes;
        ``new_net``: bwrap makes the sample's network namespace, else it is started inside the slot's;
        ``dev_dir``: the sample's ``/dev`` (``devices``), else bwrap makes one."""
        py = [self.python, "-E", "-s", "-S"]  # like -I, but the script dir stays importable
        if self.isolation == "bwrap":
            return ((launch.uid_prefix(uid) if self.root else []) + launch.gate(limits, wait=False)
                    + launch.bwrap_prefix(self.python, task, limits, status_w, block_r, seccomp_r, new_net, dev_dir)
                    + py + ["/task/main.py", *argv]), "/", {}
        host_dir = task
        local_env = {**launch.ENV, "HOME": host_dir, "TMPDIR": host_dir}
        drop = launch.setpriv_prefix(uid) if self.root else []
        if self.isolation == "unshare":  # unshare needs root: the uid is dropped inside, after the namespaces
            script = " ".join(launch.shquote(a) for a in py + [os.path.join(host_dir, "main.py"), *argv])
            return (["unshare", "--net", "--pid", "--fork", "--kill-child", "--mount-proc", "--ipc", "--uts", "--"]
                    + drop + ["/bin/sh", "-c", f"{script}; exit $?"], host_dir, local_env)
        return drop + py + [os.path.join(host_dir, "main.py"), *argv], host_dir, local_env

    def _host_dir(self, task: dict[str, bytes], uid: int) -> str:
        """A fresh directory holding the program's files, owned by the slot's uid (the modes
        without bwrap run the program from there)."""
        host_dir = tempfile.mkdtemp(prefix="rlvr-sbx-", dir=_TASK_ROOT)
        try:
            for name, content in task.items():
                with open(os.path.join(host_dir, name), "wb") as f:
                    f.write(content)
            if self.root:
                for path in (host_dir, *(os.path.join(host_dir, name) for name in task)):
                    os.chown(path, uid, uid)
            os.chmod(host_dir, 0o700)
        except BaseException:  # not handed to the run yet: removed here
            shutil.rmtree(host_dir, ignore_errors=True)
            raise
        return host_dir

    def _reaped(self, ended, group, uid) -> bool:
        """Whether the run is known to have left nothing of the slot's uid behind, without a sweep
        of ``/proc``. Under bwrap every process of the sample lives in its pid namespace, which
        dies with bwrap's pid 1, and in its cgroup, which it cannot leave (no cgroup file is
        visible inside): a group read and found empty (none was running, all were killed) and pid
        1 gone (reaped here, its last zombie, as we are the subreaper) leave nothing. Any other
        ending (no cgroup, an error before the program ran, a member that would not die, a group
        that could not be read, no subreaper) is swept."""
        if self.isolation != "bwrap" or group is None or ended is None or ended.init_pid is None:
            return False
        return group.found_empty and is_subreaper() and reap(ended.init_pid, uid)

    def _run_in_slot(self, slot, source, stdin, files, argv, limits, trusted: bool = False) -> RunResult:
        """One run in ``slot``; ``trusted`` (the sandbox's own warm run): outside any sample group,
        not counted."""
        uid = self.uid_range[slot]
        status_r = status_w = seccomp_r = block_r = block_w = group = ended = host_dir = None
        task_fds: dict[str, int] = {}
        # inet: a fresh namespace, its loopback up; the trusted run (maybe on the main thread) too
        slot_net = None if limits.inet or trusted else self._netns[slot]
        extra: dict = {}
        try:
            # Every text encoded before any fd is made: one that cannot be leaves nothing open.
            task = {_plain_name(name): text.encode("utf-8") for name, text in {**files, "main.py": source}.items()}
            data = stdin.encode() if isinstance(stdin, str) else stdin
            if self.isolation == "bwrap":
                for name, content in task.items():
                    task_fds[name] = _memfd(content)
            else:
                host_dir = self._host_dir(task, uid)
            if self.cgroups is not None and not trusted:
                group = self.cgroups.create(limits.memory_mb << 20, limits.nproc, limits.cpus)
            if self.isolation == "bwrap":
                status_r, status_w = os.pipe()
                block_r, block_w = os.pipe()
                program = seccomp.bpf_program(limits.inet)[0] if self.seccomp is not None else None
                seccomp_r = seccomp.seccomp_fd(program) if program is not None else None
            cmd, cwd, env = self._command(uid, task_fds or host_dir, argv, limits, status_w, block_r, seccomp_r,
                                          slot_net is None, devices.device_dir() if self._own_devices else None)
            # execute owns (and closes) these from here
            status_fd, passed_fds, block_fd = status_w, (block_r, seccomp_r, *task_fds.values()), block_w
            status_w = block_r = seccomp_r = block_w = None
            task_fds = {}

            def admit(pid: int) -> None:  # the gated process, or bwrap's pid 1 before it starts the program
                if group is not None and not group.inherits:
                    group.join(pid)
                launch.admit(pid)

            ended = launch.execute(cmd, cwd, env, data, status_r, status_fd, passed_fds, limits,
                                   on_start=admit, block_w=block_fd,
                                   around_spawn=functools.partial(_spawning, group, slot_net),
                                   on_stop=group.kill if group is not None else None)
            if group is not None:  # counted before the group is emptied: our own kills are not the program's
                extra["memory_peak_bytes"] = group.peak_bytes()  # the processes are killed: it no longer grows
                extra.update(group.events(extra["memory_peak_bytes"]))
            verdict, detail = classify(ended.rc, ended.stderr, ended.timed_out, ended.overflow, ended.started,
                                       self.isolation, extra)
            result = RunResult(verdict, ended.rc, ended.stdout, ended.stderr, ended.elapsed, self.isolation, detail)
        except Exception as err:  # noqa: BLE001 - any failure here is ours, reported as such
            result = RunResult(Verdict.SANDBOX_ERROR, None, "", "", 0.0, self.isolation,
                               detail=f"{type(err).__name__}: {err}")
        finally:
            try:
                for fd in (status_r, status_w, block_r, block_w, seccomp_r, *task_fds.values()):
                    if fd is not None:
                        try:
                            os.close(fd)
                        except OSError:
                            pass
                if group is not None:
                    group.empty()
                if self.root and not self._reaped(ended, group, uid):
                    swept = sweep_uid(uid)
                    if swept:
                        with self._lock:
                            self.counters["swept"] += swept
                if group is not None:
                    extra.setdefault("memory_peak_bytes", group.peak_bytes())
                    extra["memory_left_bytes"] = group.remove()
                if host_dir is not None:
                    shutil.rmtree(host_dir, ignore_errors=True)
            finally:
                if slot_net is not None:  # checked after every sample, whatever else failed
                    self._netns[slot] = None
                    self._netns[slot] = netns.clean(slot_net)
        result.extra.update(extra)
        if not trusted:
            with self._lock:
                self.counters["runs"] += 1
                self.counters["sandbox_errors"] += result.verdict is Verdict.SANDBOX_ERROR
        return result
