"""Run model-written programs so that they cannot touch the host.

Design. Every program runs in its own process tree:

1. **Process layer, always on.** ``Popen`` in a new session with an allow-list environment,
   ``python -E -s -S``, stdin from ``/dev/null`` (or a host file the program cannot name), rlimits
   applied by ``prlimit`` in the exec chain (CPU, address space, file size, open files,
   processes, no core; no ``preexec_fn``, which is unsafe next to threads), a reader that drains
   stdout and stderr concurrently with a byte cap, a wall-clock ``SIGKILL`` of the process
   group, then ``wait()`` so no zombie is left.
2. **Unprivileged uid per worker slot.** As root, slot ``k`` runs as uid/gid ``uid_range[k]``:
   root ignores ``RLIMIT_NPROC``, and one uid per slot keeps a fork bomb in one sample from
   starving the others. After every run every process of that uid is killed (a backstop that also
   catches ``setsid`` daemons without namespaces), so each range is reserved host-wide (``uids``).
3. **Namespaces.** ``bwrap`` (bubblewrap) when installed and working: new user, pid, net, ipc,
   uts, cgroup and mount namespaces; only ``/usr`` (read-only), a private ``/proc``, ``/dev``
   and a size-capped ``/tmp``; the program's files read-only at ``/task``; a fresh size-capped
   tmpfs as its working directory ``/work``; ``--die-with-parent`` so killing our ``bwrap``
   tears the pid namespace down. Without bwrap, as root: ``unshare`` of net/pid/ipc/uts with a
   shell as pid 1 (the program must not be pid 1: pid 1 ignores SIGXCPU). Neither: rlimits only.
   Anything short of bwrap prints one loud warning per process, never a silent downgrade.

The sandbox reports how a program ended (``Verdict.OK`` = exit status 0, or one of the limit
verdicts); deciding PASS or FAIL is the grader's job (``rlvr.rewards.code``), done outside.

Deviations from a full isolation design: no cgroup layer (rlimits only: ``RLIMIT_AS`` is the memory
limit) and no seccomp filter; remote backends are not implemented.
"""

from __future__ import annotations

import enum
import json
import os
import queue
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

__all__ = ["ISOLATIONS", "Verdict", "Limits", "RunResult", "Sandbox", "SandboxWarning", "detect_isolation"]

ISOLATIONS = ("auto", "bwrap", "unshare", "none")
"""Sandbox isolation modes (`auto` picks the strongest that works here)."""


class Verdict(str, enum.Enum):  # noqa: UP042 - kept: enum.StrEnum would change str()/format() of the members
    """How a program (sandbox) or a test (grader) ended."""

    OK = "OK"  # sandbox only: exited with status 0; the grader turns it into PASS or FAIL
    PASS = "PASS"
    FAIL = "FAIL"
    TIMEOUT = "TIMEOUT"
    MEMORY_LIMIT = "MEMORY_LIMIT"
    OUTPUT_LIMIT = "OUTPUT_LIMIT"
    RESOURCE_LIMIT = "RESOURCE_LIMIT"
    RUNTIME_ERROR = "RUNTIME_ERROR"
    SANDBOX_ERROR = "SANDBOX_ERROR"  # our fault: never a silent zero


class SandboxWarning(UserWarning):
    """Full isolation is unavailable on this host."""


@dataclass(frozen=True)
class Limits:
    """Per-program limits. ``cpu_s`` defaults to the wall clock rounded up."""

    wall_s: float = 5.0  # wall clock, then SIGKILL of the whole tree
    cpu_s: int | None = None  # RLIMIT_CPU seconds (SIGXCPU), None = ceil(wall_s)
    memory_mb: int = 512  # RLIMIT_AS (virtual memory)
    file_mb: int = 16  # RLIMIT_FSIZE: largest file the program may write
    disk_mb: int = 64  # size of the working tmpfs (bwrap) and of /tmp inside
    nofile: int = 64  # RLIMIT_NOFILE
    nproc: int = 32  # RLIMIT_NPROC for the slot's uid (effective only when not root)
    output_bytes: int = 1 << 20  # stdout and stderr caps, each; more = OUTPUT_LIMIT


@dataclass
class RunResult:
    verdict: Verdict
    returncode: int | None
    stdout: str
    stderr: str
    elapsed: float
    isolation: str
    detail: str = ""  # why, for SANDBOX_ERROR and limit verdicts
    extra: dict = field(default_factory=dict)


_RESOURCE_MARKERS = (
    "Resource temporarily unavailable",  # fork/clone under RLIMIT_NPROC
    "can't start new thread",
    "File too large",  # RLIMIT_FSIZE (Python ignores SIGXFSZ and sees EFBIG)
    "Too many open files",
    "No space left on device",
)
_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONIOENCODING": "utf-8", "OMP_NUM_THREADS": "1"}
_warned: set[str] = set()
_isolation_cache: dict[tuple, str] = {}


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


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def _bwrap_prefix(python: str, task_dir: str, limits: Limits, status_fd: int) -> list[str]:
    args = ["bwrap", "--unshare-all", "--die-with-parent", "--new-session",
            "--ro-bind", "/usr", "/usr"]
    for name in ("bin", "lib", "lib64", "sbin", "lib32"):
        target = os.path.join("/", name)
        if os.path.islink(target):
            args += ["--symlink", os.readlink(target), target]
        elif os.path.isdir(target):
            args += ["--ro-bind", target, target]
    prefix = os.path.dirname(os.path.dirname(os.path.realpath(python)))
    if not prefix.startswith("/usr"):
        args += ["--ro-bind", prefix, prefix]
    disk = str(limits.disk_mb << 20)
    args += ["--proc", "/proc", "--dev", "/dev", "--size", disk, "--tmpfs", "/tmp",
             "--size", disk, "--tmpfs", "/work", "--ro-bind", task_dir, "/task", "--chdir", "/work",
             "--json-status-fd", str(status_fd), "--clearenv", "--cap-drop", "ALL"]
    for key, value in {**_ENV, "HOME": "/work", "TMPDIR": "/tmp"}.items():
        args += ["--setenv", key, value]
    return args


def _prlimit_prefix(limits: Limits) -> list[str]:
    cpu = limits.cpu_s if limits.cpu_s is not None else max(1, int(-(-limits.wall_s // 1)))
    return ["prlimit", f"--cpu={cpu}:{cpu + 1}", f"--as={limits.memory_mb << 20}",
            f"--fsize={limits.file_mb << 20}", f"--nofile={limits.nofile}",
            f"--nproc={limits.nproc}", "--core=0", "--"]


def _uid_processes(uid: int) -> tuple[list[int], list[int]]:
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


def _sweep_uid(uid: int, wait_s: float = 3.0) -> int:
    """SIGKILL every live process owned by ``uid`` (a slot uid nothing else uses) until none is left.

    Zombies that are ours (we are a child subreaper, see ``_become_subreaper``) are reaped, so
    they do not count against the slot's RLIMIT_NPROC. Returns how many kill signals were sent.
    """
    killed = 0
    deadline = time.monotonic() + wait_s
    while True:
        live, zombies = _uid_processes(uid)
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


_subreaper = False


def _become_subreaper() -> None:
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


def detect_isolation(python: str | None = None, base_uid: int = 60000) -> str:
    """The strongest mode that works here: ``bwrap``, ``unshare`` (root) or ``none``."""
    python = python or default_python()
    key = (python, base_uid)
    if key in _isolation_cache:
        return _isolation_cache[key]
    mode = "none"
    probe = Sandbox(workers=1, isolation="bwrap", python=python, base_uid=base_uid, _probe=True)
    if shutil.which("bwrap") and shutil.which("prlimit"):
        if probe.run("print(6*7)", limits=Limits(wall_s=10)).stdout.strip() == "42":
            mode = "bwrap"
    if mode == "none" and _is_root() and shutil.which("unshare") and shutil.which("prlimit"):
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

    def __init__(self, *, workers: int = 2, limits: Limits = Limits(), isolation: str = "auto",
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
            from rlvr.rewards.uids import reserve

            _become_subreaper()
            self.uid_range, self._release = reserve(self, base_uid, workers)
        if isolation == "auto":
            isolation = detect_isolation(self.python, base_uid)
        self.isolation = isolation
        self._slots: queue.Queue[int] = queue.Queue()
        for k in range(workers):
            self._slots.put(k)
        self._pool: ThreadPoolExecutor | None = None
        self.counters = {"runs": 0, "sandbox_errors": 0, "swept": 0}
        self._lock = threading.Lock()
        if not _probe:
            self._announce()

    def _announce(self) -> None:
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
        slot = self._slots.get()
        try:
            return self._run_in_slot(slot, source, stdin, files or {}, argv or [], limits or self.limits)
        finally:
            self._slots.put(slot)

    def run_many(self, jobs: list[dict]) -> list[RunResult]:
        """Run each job (keyword arguments of ``run``) on the worker pool; results in order."""
        if self._pool is None:
            with self._lock:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="rlvr-sandbox")
        futures = [self._pool.submit(lambda j=j: self.run(**j)) for j in jobs]
        return [f.result() for f in futures]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        self._release()  # the slot uids go back (once; also at exit or when the sandbox is collected)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ------------------------------------------------------------------------------ one run

    def _run_in_slot(self, slot, source, stdin, files, argv, limits) -> RunResult:
        uid = self.uid_range[slot]
        host_dir = tempfile.mkdtemp(prefix="rlvr-sbx-")
        status_r = status_w = stdin_f = None
        try:
            for name, text in {**files, "main.py": source}.items():
                path = os.path.join(host_dir, name)
                if os.path.dirname(os.path.normpath(path)) != host_dir:
                    raise ValueError(f"sandbox: file name {name!r} must be a plain name")
                with open(path, "w", encoding="utf-8") as f:
                    f.write(text)
            if stdin is not None:  # a host file opened by us: the program cannot name it
                stdin_f = tempfile.TemporaryFile()
                stdin_f.write(stdin.encode() if isinstance(stdin, str) else stdin)
                stdin_f.seek(0)
            if self.root:
                os.chown(host_dir, uid, uid)
                for name in os.listdir(host_dir):
                    os.chown(os.path.join(host_dir, name), uid, uid)
            os.chmod(host_dir, 0o700)
            py = [self.python, "-E", "-s", "-S"]  # like -I, but the script dir stays importable
            if self.isolation == "bwrap":
                status_r, status_w = os.pipe()
                cmd = _prlimit_prefix(limits) + _bwrap_prefix(self.python, host_dir, limits, status_w) \
                    + py + ["/task/main.py", *argv]
                cwd, env = "/", {}
            elif self.isolation == "unshare":
                inner = " ".join(_shquote(a) for a in py + [os.path.join(host_dir, "main.py"), *argv])
                cmd = (["unshare", "--net", "--pid", "--fork", "--kill-child", "--mount-proc", "--ipc", "--uts", "--"]
                       + (["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs", "--"]
                          if self.root else []) + _prlimit_prefix(limits) + ["/bin/sh", "-c", f"{inner}; exit $?"])
                cwd, env = host_dir, {**_ENV, "HOME": host_dir, "TMPDIR": host_dir}
            else:
                cmd = _prlimit_prefix(limits) + py + [os.path.join(host_dir, "main.py"), *argv]
                cwd, env = host_dir, {**_ENV, "HOME": host_dir, "TMPDIR": host_dir}
            drop = self.root and self.isolation != "unshare"
            fds, status_w = status_w, None  # _execute owns (and closes) the write end from here
            result = self._execute(cmd, cwd, env, stdin_f, status_r, fds, limits, user=uid if drop else None)
        except Exception as err:  # noqa: BLE001 - any failure here is ours, reported as such
            result = RunResult(Verdict.SANDBOX_ERROR, None, "", "", 0.0, self.isolation,
                               detail=f"{type(err).__name__}: {err}")
        finally:
            for fd in (status_r, status_w):
                if fd is not None:
                    try:
                        os.close(fd)
                    except OSError:
                        pass
            if stdin_f is not None:
                stdin_f.close()
            if self.root:
                swept = _sweep_uid(uid)
                if swept:
                    with self._lock:
                        self.counters["swept"] += swept
            shutil.rmtree(host_dir, ignore_errors=True)
        with self._lock:
            self.counters["runs"] += 1
            self.counters["sandbox_errors"] += result.verdict is Verdict.SANDBOX_ERROR
        return result

    def _execute(self, cmd, cwd, env, stdin_f, status_r, status_w, limits, user) -> RunResult:
        start = time.monotonic()
        kwargs = dict(user=user, group=user, extra_groups=[]) if user is not None else {}
        try:
            proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=stdin_f if stdin_f is not None else subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                                    pass_fds=(status_w,) if status_w is not None else (), close_fds=True, **kwargs)
        finally:
            if status_w is not None:
                os.close(status_w)
        deadline = start + limits.wall_s
        out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
        bufs = {out_fd: bytearray(), err_fd: bytearray()}
        status = bytearray()
        sel = selectors.DefaultSelector()
        for f in (proc.stdout, proc.stderr):
            os.set_blocking(f.fileno(), False)
            sel.register(f.fileno(), selectors.EVENT_READ)
        if status_r is not None:
            os.set_blocking(status_r, False)
            sel.register(status_r, selectors.EVENT_READ)
        timed_out = overflow = False
        exited_at = None
        try:
            while sel.get_map():
                now = time.monotonic()
                if now >= deadline:
                    timed_out = True
                    break
                if exited_at is None and proc.poll() is not None:
                    exited_at = now
                if exited_at is not None and now - exited_at > 0.2:  # a leftover holds the pipes
                    break
                for key, _ in sel.select(timeout=min(0.05, deadline - now)):
                    fd = key.fd
                    try:
                        chunk = os.read(fd, 65536)
                    except BlockingIOError:
                        continue
                    if not chunk:
                        sel.unregister(fd)
                        continue
                    if fd == status_r:
                        status += chunk[:4096]
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
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            proc.wait()
            proc.stdout.close()
            proc.stderr.close()
        elapsed = time.monotonic() - start
        rc = proc.returncode
        if status_r is not None:  # bwrap reports the real exit code, and whether the child started
            try:
                status += os.read(status_r, 4096)
            except OSError:
                pass
            messages = [json.loads(line) for line in status.decode(errors="replace").splitlines()
                        if line.strip().startswith("{")]
            started = any("child-pid" in m for m in messages)
            codes = [m["exit-code"] for m in messages if "exit-code" in m]
            if codes:
                rc = codes[-1]
        else:
            started = True
        out = bufs[out_fd].decode("utf-8", errors="replace")
        err = bufs[err_fd].decode("utf-8", errors="replace")
        verdict, detail = _classify(rc, err, timed_out, overflow, started, self.isolation)
        return RunResult(verdict, rc, out, err, elapsed, self.isolation, detail)


def _shquote(s: str) -> str:
    return "'" + s.replace("'", "'\"'\"'") + "'"


def _classify(rc, stderr, timed_out, overflow, started, isolation) -> tuple[Verdict, str]:
    if overflow:
        return Verdict.OUTPUT_LIMIT, "stdout or stderr over the cap"
    tail = stderr[-2000:]
    if timed_out:  # a program that hit a limit and then hung (e.g. live threads) names the limit
        if "MemoryError" in tail:
            return Verdict.MEMORY_LIMIT, "MemoryError, then the wall clock"
        marker = next((m for m in _RESOURCE_MARKERS if m in tail), None)
        return (Verdict.RESOURCE_LIMIT, f"{marker}, then the wall clock") if marker else (Verdict.TIMEOUT, "wall clock")
    if not started:
        return Verdict.SANDBOX_ERROR, f"sandbox did not start: {stderr.strip()[-300:]}"
    if rc == 0:
        return Verdict.OK, ""
    sig = -rc if rc is not None and rc < 0 else (rc - 128 if rc is not None and rc > 128 and isolation != "none" else 0)
    if sig == signal.SIGXCPU:
        return Verdict.TIMEOUT, "cpu limit (SIGXCPU)"
    if sig == signal.SIGXFSZ:
        return Verdict.RESOURCE_LIMIT, "file size limit (SIGXFSZ)"
    if "MemoryError" in tail:
        return Verdict.MEMORY_LIMIT, "MemoryError"
    for marker in _RESOURCE_MARKERS:
        if marker in tail:
            return Verdict.RESOURCE_LIMIT, marker
    return Verdict.RUNTIME_ERROR, f"exit status {rc}"


def with_limits(limits: Limits, **changes) -> Limits:
    """A copy of ``limits`` with some fields changed."""
    return replace(limits, **changes)
