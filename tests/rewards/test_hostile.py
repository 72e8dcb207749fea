"""The hostile-program suite, run through the real sandbox.

Each program gets its verdict checked and the host checked afterwards: no process left under
the sandbox's slot uids, no sample cgroup left behind and the sample's peak memory (its cgroup's,
tmpfs and shm included) within the limit, no file created outside the sandbox (probe paths in
/tmp, /dev/shm, $HOME and the repo), canary files in $HOME and the repo unchanged, a loopback
TCP/UDP listener that never hears from a sandbox, a secret in the harness's environment that
never shows up in any output, and the harness itself alive with its OOM score untouched.
``test_all_at_once`` runs the whole suite 16 sandboxes wide.

Needs bubblewrap and root (CI runs as root and installs bubblewrap); skipped otherwise.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import shutil
import socket
import threading
import time
import uuid
from pathlib import Path

import pytest
from _page_cache import clean_files_under_usr, evict

from rlvr.rewards.code import CodeGrader
from rlvr.rewards.sandbox import Limits, Sandbox, Verdict, _uid_processes, cgroup_host, detect_isolation

REPO = Path(__file__).resolve().parents[2]
TOKEN = uuid.uuid4().hex[:12]
SECRET = f"hunter2-{TOKEN}"
BASE_UID = 61000
WALL = 2.0
LIMITS = Limits(wall_s=WALL, memory_mb=256, file_mb=8, disk_mb=32, nproc=24, output_bytes=1 << 16)

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("bwrap") is None or detect_isolation(base_uid=BASE_UID) != "bwrap",
    reason="needs root and a working bubblewrap (CI has both)",
)

PROBES = [f"/tmp/rlvr_pwned_{TOKEN}", f"/dev/shm/rlvr_pwned_{TOKEN}",
          str(Path.home() / f"rlvr_pwned_{TOKEN}"), str(REPO / f"rlvr_pwned_{TOKEN}")]


class Listener:
    """TCP and UDP on 127.0.0.1: counts every connection and datagram it receives."""

    def __init__(self):
        self.hits = 0
        self.tcp = socket.socket()
        self.tcp.bind(("127.0.0.1", 0))
        self.tcp.listen(16)
        self.port = self.tcp.getsockname()[1]
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("127.0.0.1", self.port))
        for sock in (self.tcp, self.udp):
            sock.settimeout(0.2)
            threading.Thread(target=self._serve, args=(sock,), daemon=True).start()
        self.stop = False

    def _serve(self, sock):
        while not getattr(self, "stop", False):
            try:
                if sock.type == socket.SOCK_STREAM:
                    conn, _ = sock.accept()
                    conn.close()
                else:
                    sock.recvfrom(100)
                self.hits += 1
            except OSError:
                continue


@pytest.fixture(scope="module")
def host():
    os.environ["RLVR_TEST_SECRET"] = SECRET
    canaries = {Path.home() / f".rlvr_canary_{TOKEN}": b"home canary", REPO / f".rlvr_canary_{TOKEN}": b"repo canary"}
    for path, data in canaries.items():
        path.write_bytes(data)
        path.chmod(0o644)
    listener = Listener()
    with open("/proc/self/oom_score_adj") as f:
        oom = f.read()
    yield {"port": listener.port, "listener": listener, "canaries": canaries, "oom_score_adj": oom, "uids": []}
    listener.stop = True
    for path in canaries:
        path.unlink(missing_ok=True)
    os.environ.pop("RLVR_TEST_SECRET", None)


@pytest.fixture(scope="module")
def sandbox(host):
    sb = Sandbox(workers=16, limits=LIMITS, isolation="bwrap", base_uid=BASE_UID)
    host["uids"].append(sb.uid_range)  # from the host-wide registry: another test process may hold BASE_UID..
    yield sb
    sb.close()


def _sandbox_processes(host, zombies: bool = False) -> list[int]:
    """Live (with ``zombies``: zombie) processes under any slot uid of this module's sandboxes."""
    return [pid for uids in host["uids"] for uid in uids for pid in _uid_processes(uid)[zombies]]


def _leftover_cgroups() -> list[str]:
    """Sample cgroups of this process still on the host (each is removed after its sample)."""
    found, _ = cgroup_host()
    if found is None:
        return []
    return [os.path.join(parent, name) for parent in set(found.parents.values()) for name in os.listdir(parent)
            if name.startswith(f"rlvr-sbx-{os.getpid()}-")]


def assert_host_unaffected(host, results):
    assert _sandbox_processes(host) == [], "a sandboxed process outlived its verdict"
    assert _sandbox_processes(host, zombies=True) == [], "a sandboxed process was left unreaped"
    assert _leftover_cgroups() == [], "a sample's cgroup outlived it"
    with open("/proc/self/oom_score_adj") as f:
        assert f.read() == host["oom_score_adj"], "the harness's OOM score changed"
    for probe in PROBES:
        assert not os.path.exists(probe), f"{probe} was created outside the sandbox"
    for path, data in host["canaries"].items():
        assert path.read_bytes() == data, f"canary {path} changed"
    assert host["listener"].hits == 0, "the loopback listener heard from a sandbox"
    for r in results:
        peak = r.extra.get("memory_peak_bytes")
        assert peak is None or peak <= LIMITS.memory_mb << 20, f"the sample's cgroup peaked at {peak >> 20} MB"
        assert SECRET not in r.stdout and SECRET not in r.stderr, "the harness's secret leaked"
        assert "repo canary" not in r.stdout and "home canary" not in r.stdout
    assert os.getpid() > 0 and threading.main_thread().is_alive()


# ---------------------------------------------------------------------------------- programs
# name -> (source, allowed verdicts, check on the result or None)

READS = """
import os
paths = ["/etc/passwd", "/etc/shadow", os.path.expanduser("~root/.ssh/id_rsa"), "/root/.netrc",
         "/proc/1/environ", "/proc/%(harness)d/environ", "%(repo)s/pyproject.toml",
         "%(repo)s/.rlvr_canary_%(token)s", "%(home)s/.rlvr_canary_%(token)s",
         "../../../../../../%(repo)s/pyproject.toml", "%(repo)s/data/gsm8k_fixture.jsonl"]
try:
    os.symlink("%(repo)s/pyproject.toml", "link")
    paths.append("link")
except OSError:
    pass
seen = []
for p in paths:
    try:
        with open(p, "rb") as f:
            data = f.read()
        seen.append((p, data[:200]))
    except OSError as e:
        pass
print("READABLE", [p for p, d in seen if b"SECRET" in d or b"[project]" in d or b"canary" in d or b"root:" in d])
for p, d in seen:
    print(p, d)
"""

WRITES = """
import os, importlib
os = importlib.reload(os)
for p in %(probes)r:
    try:
        with open(p, "w") as f:
            f.write("x")
        print("WROTE", p)
    except OSError as e:
        print("DENIED", p, type(e).__name__)
"""

NET = """
import socket
res = []
for target in [("1.1.1.1", 53), ("127.0.0.1", %(port)d), ("10.0.0.1", 80)]:
    try:
        s = socket.socket()
        s.settimeout(0.5)
        s.connect(target); res.append(("CONNECTED", target))
    except OSError as e:
        res.append((type(e).__name__, target))
try:
    socket.getaddrinfo("example.com", 80); res.append("DNS OK")
except OSError as e:
    res.append(("dns", type(e).__name__))
try:
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.sendto(b"hello", ("127.0.0.1", %(port)d)); u.sendto(b"hello", ("8.8.8.8", 53)); res.append("UDP sent")
except OSError as e:
    res.append(("udp", type(e).__name__))
print(res)
"""

KILLS = """
import os, signal
for attempt in (lambda: os.kill(os.getppid(), 9), lambda: os.kill(%(harness)d, 9), lambda: os.kill(-1, 9),
                lambda: os.killpg(0, 9)):
    try:
        attempt()
    except OSError as e:
        print(type(e).__name__)
print("still here")
"""

PROGRAMS = {
    "01_infinite_loop": ("while True: pass", {Verdict.TIMEOUT}, None),
    "02_sleep": ("import time\ntime.sleep(10**6)", {Verdict.TIMEOUT}, None),
    "03_ignore_signals": ("import signal\nfor s in (signal.SIGALRM, signal.SIGTERM, signal.SIGINT, signal.SIGXCPU):\n"
                          "    signal.signal(s, signal.SIG_IGN)\nwhile True: pass", {Verdict.TIMEOUT}, None),
    "04a_memory_chunks": ("x = []\nwhile True: x.append(bytearray(10 << 20))", {Verdict.MEMORY_LIMIT}, None),
    "04b_memory_huge": ("x = bytearray(8 << 30)", {Verdict.MEMORY_LIMIT}, None),
    "05a_fork_bomb": ("import os\nwhile True: os.fork()", {Verdict.RESOURCE_LIMIT}, None),
    "05b_popen_bomb": ("import subprocess, sys\nwhile True: subprocess.Popen([sys.executable, '-c', "
                       "'import time; time.sleep(100)'])", {Verdict.RESOURCE_LIMIT, Verdict.MEMORY_LIMIT}, None),
    "06_thread_bomb": ("import threading, time\nwhile True: threading.Thread(target=time.sleep, args=(100,)).start()",
                       {Verdict.RESOURCE_LIMIT}, None),
    "07_daemon": ("import os, time\nif os.fork() == 0:\n    os.setsid()\n"
                  "    if os.fork() == 0:\n        time.sleep(30)\n"
                  "    os._exit(0)\nprint('parent done')", {Verdict.OK}, lambda r: "parent done" in r.stdout),
    "08_09_reads": (READS, {Verdict.OK}, lambda r: "READABLE []" in r.stdout),
    "10_17_writes_reload_os": (WRITES, {Verdict.OK}, lambda r: "DENIED" in r.stdout),
    "11a_fill_one_file": ("with open('big', 'wb') as f:\n    while True: f.write(b'x' * (1 << 20))",
                          {Verdict.RESOURCE_LIMIT}, None),
    "11b_fill_disk": ("i = 0\nwhile True:\n    open(f'f{i}', 'wb').write(b'x' * (4 << 20)); i += 1",
                      {Verdict.RESOURCE_LIMIT}, None),
    "12_fds": ("fs = [open('/dev/null') for _ in range(10**5)]", {Verdict.RESOURCE_LIMIT}, None),
    "13_network": (NET, {Verdict.OK}, lambda r: "CONNECTED" not in r.stdout and "DNS OK" not in r.stdout),
    "14_kill_parent": (KILLS, {Verdict.OK, Verdict.RUNTIME_ERROR}, None),
    "15_output_flood": ("import sys\nwhile True:\n    sys.stdout.write('x' * 65536); sys.stderr.write('y' * 65536)",
                        {Verdict.OUTPUT_LIMIT}, lambda r: len(r.stdout) <= LIMITS.output_bytes),
    "16_stdin_eof": ("import sys\nprint(len(sys.stdin.read()))", {Verdict.OK}, lambda r: r.stdout.strip() == "0"),
    "17a_ctypes_fork": ("import ctypes, time\nlibc = ctypes.CDLL(None)\nwhile True:\n    pid = libc.fork()\n"
                        "    if pid == 0:\n        time.sleep(30)\n    if pid < 0:\n"
                        "        raise BlockingIOError(11, 'Resource temporarily unavailable')",
                        {Verdict.RESOURCE_LIMIT}, None),
    "17b_posix_fork": ("import posix\nwhile True: posix.fork()", {Verdict.RESOURCE_LIMIT}, None),
    "23_ptrace_vfork": ("import ctypes, os\nlibc = ctypes.CDLL(None)\nlibc.ptrace(0, 0, 0, 0)\n"
                        "while True:\n    try:\n"
                        "        os.posix_spawn('/usr/bin/python3', ['python3', '-c', 'while 1: pass'], {})\n"
                        "    except OSError:\n        pass", {Verdict.TIMEOUT, Verdict.RESOURCE_LIMIT}, None),
}


# ------------------------------------------------------------------ resources and kernel surface

MANY_PROCS_MEMORY = """
import os, time
for i in range(16):  # 16 x 150 MB, each process under its own RLIMIT_AS
    if os.fork() == 0:
        x = b"x" * (150 << 20)
        time.sleep(30)
        os._exit(0)
time.sleep(30)
"""

MEMFD_FILL = """
import os, time
held = []
for level in range(8):  # memfd pages are outside RLIMIT_AS; more descriptors in each child
    while len(held) < 50:
        fd = os.memfd_create("fill")
        os.write(fd, b"x" * (7 << 20))
        held.append(fd)
    if os.fork():
        time.sleep(30)
    for fd in held:
        os.close(fd)
    held.clear()
"""

TMPFS_FILL = """
import json
written = {}
for d in ["/dev/shm", "/dev", "/tmp", "/work", "/", "/task"]:
    n = 0
    try:
        for i in range(10000):
            with open(d + "/fill" + str(i), "wb") as f:
                f.write(b"x" * (4 << 20))
            n += 4
    except OSError:
        pass
    written[d] = n
print("FILL" + json.dumps(written))
"""

SESSION_FORK_BOMB = "import os\nwhile True:\n    if os.fork() == 0:\n        os.setsid()"

KERNEL = r'''
import ctypes, errno, json, os, platform, socket, threading
libc = ctypes.CDLL(None, use_errno=True)
arm = platform.machine() == "aarch64"
NR = {"bpf": 280 if arm else 321, "keyctl": 219 if arm else 250, "add_key": 217 if arm else 248,
      "perf_event_open": 241 if arm else 298, "io_uring_setup": 425, "pidfd_open": 434, "pidfd_getfd": 438,
      "clone3": 435, "kexec_load": 104 if arm else 246, "init_module": 105 if arm else 175,
      "process_vm_readv": 270 if arm else 310, "userfaultfd": 282 if arm else 323, "inotify_init1": 26 if arm else 294}
out = {}
def attempt(name, call):
    ctypes.set_errno(0)
    try:
        rc = call()
    except OSError as e:
        out[name] = errno.errorcode.get(e.errno, e.errno); return
    out[name] = "ALLOWED" if rc >= 0 else errno.errorcode.get(ctypes.get_errno(), ctypes.get_errno())
attempt("unshare_user", lambda: libc.unshare(0x10000000))
attempt("unshare_mount", lambda: libc.unshare(0x00020000))
attempt("unshare_net", lambda: libc.unshare(0x40000000))
child = lambda p: p if p else os._exit(0)  # a raw clone that succeeds returns 0 in a copy of this process
attempt("clone_newuser", lambda: child(libc.syscall(220 if arm else 56, 0x10000000 | 17, 0, 0, 0, 0)))
attempt("clone3", lambda: libc.syscall(NR["clone3"], 0, 0))
attempt("mount_tmpfs", lambda: libc.mount(b"none", b"/tmp", b"tmpfs", 0, None))
attempt("setns", lambda: libc.setns(os.open("/proc/self/ns/net", os.O_RDONLY), 0))
attempt("netlink", lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0).fileno())
attempt("packet", lambda: socket.socket(17, socket.SOCK_RAW, 0).fileno())
params = ctypes.create_string_buffer(120)
attempt("io_uring_setup", lambda: libc.syscall(NR["io_uring_setup"], 4, params))
attempt("bpf", lambda: libc.syscall(NR["bpf"], 0, 0, 0))
attempt("keyctl", lambda: libc.syscall(NR["keyctl"], 0, -3, 0))
attempt("add_key", lambda: libc.syscall(NR["add_key"], b"user", b"k", b"v", 1, -3))
attempt("perf_event_open", lambda: libc.syscall(NR["perf_event_open"], ctypes.create_string_buffer(128), 0, -1, -1, 0))
attempt("ptrace_traceme", lambda: libc.ptrace(0, 0, 0, 0))
attempt("ptrace_attach_init", lambda: libc.ptrace(16, 1, 0, 0))
attempt("pidfd_getfd", lambda: libc.syscall(NR["pidfd_getfd"], libc.syscall(NR["pidfd_open"], 1, 0), 0, 0))
attempt("process_vm_readv", lambda: libc.syscall(NR["process_vm_readv"], 1, 0, 0, 0, 0, 0))
attempt("kexec_load", lambda: libc.syscall(NR["kexec_load"], 0, 0, 0, 0))
attempt("init_module", lambda: libc.syscall(NR["init_module"], 0, 0, b""))
attempt("userfaultfd", lambda: libc.syscall(NR["userfaultfd"], 0))
attempt("inotify_init1", lambda: libc.syscall(NR["inotify_init1"], 0))
attempt("dnotify", lambda: libc.fcntl(os.open("/usr", os.O_RDONLY), 1026, 0x80000001))  # F_NOTIFY, DN_ACCESS|MULTISHOT
attempt("chroot", lambda: libc.chroot(b"/tmp"))
attempt("thread", lambda: threading.Thread(target=int).start() or 0)
attempt("fork", lambda: (lambda p: p if p else os._exit(0))(os.fork()))
print("KERNEL" + json.dumps(out))
'''

FORGE_EXIT = """
import ctypes, os, struct
libc = ctypes.CDLL(None, use_errno=True)
# bwrap's init (pid 1 here) reports the program's exit code to bwrap outside through an eventfd:
# take a copy of it and claim exit code 0, then exit 7.
for fd in os.listdir("/proc/1/fd"):
    try:
        if "eventfd" not in os.readlink("/proc/1/fd/" + fd):
            continue
        copy = libc.syscall(438, libc.syscall(434, 1, 0), int(fd), 0)
        if copy >= 0:
            os.write(copy, struct.pack("Q", 1))
            print("FORGED")
        with open("/proc/1/fd/" + fd, "wb", buffering=0) as f:
            f.write(struct.pack("Q", 1))
            print("FORGED")
    except OSError:
        pass
raise SystemExit(7)
"""

# A child runs into the cgroup's memory limit (memfd pages, outside RLIMIT_AS); the parent exits 0.
FORGE_THEN_OOM = FORGE_EXIT.replace("raise SystemExit(7)", """pid = os.fork()
if pid == 0:
    held = [os.memfd_create("f") for _ in range(60)]
    for fd in held:
        os.write(fd, b"x" * (7 << 20))
    os._exit(0)
os.waitpid(pid, 0)
raise SystemExit(0)""")


def _fill_contained(r) -> bool:
    line = next(x for x in r.stdout.splitlines() if x.startswith("FILL"))
    written = json.loads(line[4:])
    return written["/dev"] == written["/"] == written["/task"] == 0 and written["/dev/shm"] <= LIMITS.shm_mb \
        and written["/tmp"] <= LIMITS.disk_mb and written["/work"] <= LIMITS.disk_mb


def _kernel_denied(r) -> bool:
    line = next(x for x in r.stdout.splitlines() if x.startswith("KERNEL"))
    results = json.loads(line[6:])
    allowed = {"thread", "fork"}  # the two that must work, as controls
    return all(v == "ALLOWED" for k, v in results.items() if k in allowed) and \
        not [k for k, v in results.items() if k not in allowed and v == "ALLOWED"]


NEEDS_CGROUP = {"25_memory_many_processes", "26_memfd_fill", "30b_forged_status_then_memory"}
PROGRAMS.update({
    "25_memory_many_processes": (MANY_PROCS_MEMORY, {Verdict.MEMORY_LIMIT}, None),
    "26_memfd_fill": (MEMFD_FILL, {Verdict.MEMORY_LIMIT}, None),
    "27_tmpfs_shm_dev_fill": (TMPFS_FILL, {Verdict.OK}, _fill_contained),
    "28_session_fork_bomb": (SESSION_FORK_BOMB, {Verdict.RESOURCE_LIMIT}, None),
    "29_kernel_surface": (KERNEL, {Verdict.OK}, _kernel_denied),
    "30a_forged_exit_status": (FORGE_EXIT, {Verdict.RUNTIME_ERROR},
                               lambda r: r.returncode == 7 and "FORGED" not in r.stdout),
    # Whatever the status says, a limit verdict comes from the host's side (here the cgroup's OOM count).
    "30b_forged_status_then_memory": (FORGE_THEN_OOM, {Verdict.MEMORY_LIMIT}, None),
})


def _source(name: str, host) -> str:
    return PROGRAMS[name][0] % {"harness": os.getpid(), "repo": str(REPO), "home": str(Path.home()),
                                "token": TOKEN, "probes": PROBES, "port": host["port"]} if "%(" in PROGRAMS[name][0] \
        else PROGRAMS[name][0]


# The memory fills reach their limit within WALL on an idle host, but a loaded one can hold them
# below it until the clock (seen: 68 MB of 256 at 2 s); they sleep once full, so a longer clock
# costs nothing when the limit is reached and keeps a slow host from reading as a TIMEOUT.
FILL_WALL = 15.0


def _wall(name: str) -> float:
    return FILL_WALL if name in NEEDS_CGROUP else WALL


def _check(name, result):
    _, allowed, check = PROGRAMS[name]
    assert result.verdict in allowed, f"{name}: {result.verdict} ({result.detail}) {result.stderr[-300:]!r} " \
        f"{result.extra}"
    assert result.elapsed <= _wall(name) + 1.0, f"{name}: took {result.elapsed:.2f}s"
    if check is not None:
        assert check(result), f"{name}: {result.stdout[-500:]!r}"


def _skip_without_cgroups(name: str) -> None:
    if name in NEEDS_CGROUP and cgroup_host()[0] is None:
        pytest.skip(f"needs per-sample cgroups, unavailable here: {cgroup_host()[1]}")


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_hostile_program(name, sandbox, host):
    _skip_without_cgroups(name)
    result = sandbox.run(_source(name, host), limits=dataclasses.replace(LIMITS, wall_s=_wall(name)))
    _check(name, result)
    assert_host_unaffected(host, [result])


def test_24_fresh_dir_per_run(sandbox, host):
    first = sandbox.run("open('left_behind', 'w').write('secret from run 1')\nimport os\nprint(os.getcwd())")
    second = sandbox.run("import os\nprint(os.path.exists('left_behind'), os.listdir('.'))")
    assert first.verdict is Verdict.OK and second.verdict is Verdict.OK
    assert second.stdout.strip() == "False []"
    assert_host_unaffected(host, [first, second])


def test_18_19_20_grader_cannot_be_fooled(sandbox, host):
    grader = CodeGrader(sandbox)
    tests = ["assert add(1, 2) == 3", "assert add(5, 5) == 10"]
    cheats = {
        "exit_before_tests": "import sys\nprint('PASSED')\nsys.exit(0)\ndef add(a, b): return a + b",
        "os_exit": "import os\nprint('ALL TESTS PASSED')\nos._exit(0)",
        "eq_always_true": "class A:\n    def __eq__(self, o): return True\ndef add(a, b): return A()",
        "patch_builtins": "import builtins\nbuiltins.AssertionError = type('X', (Exception,), {})\n"
                          "builtins.isinstance = lambda *a: True\ndef add(a, b): return 0",
        "fake_result_lines": "import json\nfor i in range(2): print(json.dumps({'i': i, 'value': 3}))\n"
                             "def add(a, b): return 0",
    }
    grades = grader.grade_many([(code, tests) for code in cheats.values()])
    for name, grade in zip(cheats, grades):
        assert grade.verdict is Verdict.FAIL and grade.passed == 0, f"{name}: {grade}"
    prefix = grader.grade("print(1)", [{"input": "", "output": "1\n2\n"}])
    assert prefix.verdict is Verdict.FAIL  # only the first expected line: line counts must match
    honest = grader.grade("def add(a, b): return a + b", tests)
    assert honest.verdict is Verdict.PASS and honest.reward() == 1.0
    assert_host_unaffected(host, [])


FORGE_TESTS = ["assert is_prime(7)", "assert not is_prime(8)", "assert abs(area(2) - 12.57) < 0.01",
               "assert sorted(dedup([3, 1, 3])) == [1, 3]", "assert fib(2) < fib(5) <= 10",
               "assert math.isclose(area(1), 3.14, rel_tol=0.01)", "assert add(1, 2) == 3"]


def _forger(value) -> str:
    """Defines nothing; reads the grader's nonce out of the harness's frame and prints a result
    line claiming `value` for every probe of every test, before the harness gets to run them."""
    return ("import sys, json\n"
            "frame = sys._getframe(1)\n"
            "nonce = frame.f_locals['nonce']; tests = frame.f_locals['tests']\n"
            "for i, t in enumerate(tests):\n"
            "    claim = {'i': i, 'ok': True} if t['kind'] == 'stmt' else "
            f"{{'i': i, 'values': [{value!r}] * len(t['src'])}}\n"
            "    print(nonce + json.dumps(claim))\n"
            "sys.stdout.flush()\n")


def test_grader_cannot_be_forged_for_any_assertion_form(sandbox, host):
    """A program that finds the nonce and prints results for every test is graded exactly like an
    honest program whose functions return the values it claimed: forging buys nothing, for
    truthiness, negation, tolerances, chained and builtin-wrapped comparisons alike (tests whose
    probes are calls of the candidate's functions; see rlvr.rewards.asserts for whole-expression
    probes)."""
    grader = CodeGrader(sandbox)
    claims = [True, False, 0, 12.57, [1, 3], 5]
    honest = "is_prime = area = dedup = fib = add = lambda *a: %r\n"
    forged = grader.grade_many([(_forger(v), FORGE_TESTS) for v in claims])
    constant = grader.grade_many([(honest % (v,), FORGE_TESTS) for v in claims])
    for value, f, c in zip(claims, forged, constant):
        assert f.tests == c.tests, f"claiming {value!r}: forged {f.tests} vs honest constant {c.tests}"
        assert f.passed < len(FORGE_TESTS)
    real = "def is_prime(n): return n > 1 and all(n % d for d in range(2, n))\n" \
           "def area(r): return 3.1416 * r * r\ndef dedup(xs): return list(dict.fromkeys(xs))\n" \
           "def fib(n): return n if n < 2 else fib(n - 1) + fib(n - 2)\ndef add(a, b): return a + b\n"
    assert grader.grade(real, FORGE_TESTS).reward() == 1.0
    assert_host_unaffected(host, [])


def test_21_slow_but_correct_vs_over_the_limit_is_stable(sandbox, host):
    grader = CodeGrader(sandbox)
    tests = [{"input": "", "output": "ok\n"}]
    slow_ok = "import time\ntime.sleep(0.6)\nprint('ok')"
    too_slow = "import time\ntime.sleep(3.5)\nprint('ok')"
    grades = grader.grade_many([(slow_ok, tests)] * 8 + [(too_slow, tests)] * 8)
    assert [g.verdict for g in grades] == [Verdict.PASS] * 8 + [Verdict.TIMEOUT] * 8
    assert_host_unaffected(host, [])


HOG = "import os\nfor i in range(8):\n    if os.fork() == 0:\n        os.setsid()\n        break\nwhile True: pass"
HONEST = "print(sum(i * i for i in range(3_000_000)))"


def test_cpu_hogs_in_many_sessions_do_not_starve_an_honest_sample(host):
    """Four samples spinning 9 processes each, in their own sessions, next to an honest one: each
    sample's cgroup gets a fair share of the CPUs (and at most cpu.max), not one per process, so
    the honest sample finishes well inside a wall clock it would miss at 1/37 of the CPU."""
    if cgroup_host()[0] is None:
        pytest.skip(f"needs per-sample cgroups, unavailable here: {cgroup_host()[1]}")
    limits = Limits(wall_s=4.0, memory_mb=256, nproc=24, output_bytes=1 << 16)
    with Sandbox(workers=5, limits=limits, isolation="bwrap", base_uid=BASE_UID) as sb:
        host["uids"].append(sb.uid_range)
        alone = sb.run(HONEST)
        results = sb.run_many([dict(source=HOG)] * 4 + [dict(source=HONEST)])
        assert_host_unaffected(host, results)
    # Its uids go back to the host-wide registry, where another test process may take them next:
    # their processes would be that process's, not survivors of this sandbox.
    host["uids"].remove(sb.uid_range)
    assert alone.verdict is Verdict.OK, alone.detail
    assert [r.verdict for r in results] == [Verdict.TIMEOUT] * 4 + [Verdict.OK]
    assert results[-1].stdout == alone.stdout


def test_all_at_once_16_wide(sandbox, host):
    """The whole suite plus fork bombs next to correct programs, 16 sandboxes at a time."""
    names = [n for n in sorted(PROGRAMS) if n not in NEEDS_CGROUP or cgroup_host()[0] is not None]
    jobs = [dict(source=_source(n, host)) for n in names]
    bombs = [dict(source=PROGRAMS["05a_fork_bomb"][0])] * 6
    correct = [dict(source="print(sum(range(10)))")] * 10
    results = sandbox.run_many(jobs + bombs + correct)
    for name, result in zip(names, results):
        allowed = set(PROGRAMS[name][1])
        if allowed & {Verdict.MEMORY_LIMIT, Verdict.RESOURCE_LIMIT} or name == "27_tmpfs_shm_dev_fill":
            # 16 sandboxes on 2 busy cores: a hog may reach the wall clock before its memory or
            # process limit (or, writing 80 MB of tmpfs, before it is done). That kill contains it
            # just as well (the host checks below still run).
            allowed.add(Verdict.TIMEOUT)
        assert result.verdict in allowed, f"{name} under concurrency: {result.verdict} {result.detail}"
    for result in results[len(jobs):len(jobs) + len(bombs)]:
        assert result.verdict is Verdict.RESOURCE_LIMIT
    for result in results[len(jobs) + len(bombs):]:
        assert result.verdict is Verdict.OK and result.stdout == "45\n"
    assert_host_unaffected(host, results)
    assert sandbox.counters["sandbox_errors"] == 0


# ------------------------------------------------------------------------------ socket families

FAMILIES = r'''
import ctypes, errno, json, platform, socket
libc = ctypes.CDLL(None, use_errno=True)
SOCKET, SOCKETPAIR = (198, 199) if platform.machine() == "aarch64" else (41, 53)
L = ctypes.c_long
out = {}
for family in range(64):
    for high in (0, 1 << 32):  # high bits the kernel drops (it reads an int) must not pass the filter
        found = None
        for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM, socket.SOCK_SEQPACKET, socket.SOCK_RAW):
            ctypes.set_errno(0)
            fd = libc.syscall(L(SOCKET), L(family | high), L(kind), L(0))
            if fd >= 0:
                libc.close(fd); found = "ALLOWED"; break
            found = found or errno.errorcode.get(ctypes.get_errno(), "?")
        out[f"{family}/{high >> 32}"] = found
pair = (ctypes.c_int * 2)()
out["socketpair_vsock"] = "ALLOWED" if libc.syscall(L(SOCKETPAIR), L(40), L(1), L(0), pair) >= 0 else "refused"
print("FAMILIES" + json.dumps(out))
'''
NAMED_FAMILIES = {n: int(getattr(socket, n)) for n in dir(socket) if n.startswith("AF_") and n != "AF_ROUTE"}


@pytest.fixture(scope="module")
def families(sandbox, host):
    """What socket() answers inside the sandbox for every family, by default and with ``inet``."""
    seen = {}
    for inet in (False, True):
        r = sandbox.run(FAMILIES, limits=Limits(**{**LIMITS.__dict__, "inet": inet}))
        assert r.verdict is Verdict.OK, (r.detail, r.stderr[-500:])
        seen[inet] = json.loads(next(x for x in r.stdout.splitlines() if x.startswith("FAMILIES"))[8:])
    assert_host_unaffected(host, [])
    return seen


@pytest.mark.parametrize("name", sorted(NAMED_FAMILIES))
def test_socket_family_allow_list(name, families):
    """AF_UNIX opens; AF_INET and AF_INET6 only with ``Limits.inet``; every other family (AF_VSOCK,
    whose ports the network namespace does not cover, included) is refused, also with high bits
    set in the register the kernel truncates."""
    family = NAMED_FAMILIES[name]
    for inet, seen in families.items():
        opened = name == "AF_UNIX" or (inet and name in ("AF_INET", "AF_INET6"))
        for high in (0, 1):
            answer = seen[f"{family}/{high}"]
            if opened and high == 0:
                assert answer == "ALLOWED", f"{name} (inet={inet}): {answer}"
            elif not opened:
                assert answer != "ALLOWED", f"{name} (inet={inet}, high bits {high}) opened"


def test_socket_families_unnamed_and_socketpair_refused(families):
    for seen in families.values():
        opened = [k for k, v in seen.items() if v == "ALLOWED"]
        assert {k.split("/")[0] for k in opened} <= {"1", "2", "10"}, opened
        assert seen["socketpair_vsock"] == "refused"
    assert {k for k, v in families[False].items() if v == "ALLOWED"} == {"1/0", "1/1"}


def test_13b_network_with_inet_stays_in_its_own_namespace(sandbox, host):
    """With ``inet`` the sample can make AF_INET sockets, but its network namespace holds only its
    own loopback: the harness's listener on the host's 127.0.0.1 hears nothing."""
    r = sandbox.run(_source("13_network", host), limits=Limits(**{**LIMITS.__dict__, "inet": True}))
    assert r.verdict is Verdict.OK, (r.detail, r.stderr[-300:])
    assert "CONNECTED" not in r.stdout and "DNS OK" not in r.stdout and "ConnectionRefusedError" in r.stdout
    assert_host_unaffected(host, [r])


# ------------------------------------------------------------------------------------ OOM score

OOM_LOWER = r'''
import json, os
out = {}
for pid in ("self", "1"):
    try:
        with open(f"/proc/{pid}/oom_score_adj", "w") as f:
            f.write("0")
        out[pid + "_write"] = "written"
    except OSError as e:
        out[pid + "_write"] = type(e).__name__
    with open(f"/proc/{pid}/oom_score_adj") as f:
        out[pid] = int(f.read())
if os.fork() == 0:  # a child starts from its parent's score
    with open("/proc/self/oom_score_adj") as f:
        print("CHILD", int(f.read()), flush=True)
    os._exit(0)
os.wait()
print("OOM" + json.dumps(out))
'''


def test_oom_score_cannot_be_lowered(sandbox, host):
    """The sample and the sandbox's pid 1 stay the OOM killer's first choice (1000): ``/proc`` is
    read-only inside, so neither can lower its score below the trainer's."""
    r = sandbox.run(OOM_LOWER)
    assert r.verdict is Verdict.OK, (r.detail, r.stderr[-300:])
    seen = json.loads(next(x for x in r.stdout.splitlines() if x.startswith("OOM"))[3:])
    assert seen["self"] == 1000 and seen["1"] == 1000, seen
    assert seen["self_write"] != "written" and seen["1_write"] != "written", seen
    assert "CHILD 1000" in r.stdout
    assert_host_unaffected(host, [r])


# --------------------------------------------------------------------------- page cache cleanup

def _trainer_file_cache() -> int:
    """Bytes of page cache charged to the trainer's group and below (its sample groups included)."""
    found, _ = cgroup_host()
    parent = found.parents.get("memory") or found.parents[""]
    stat = dict(line.split() for line in Path(parent, "memory.stat").read_text().splitlines())
    return int(stat["total_cache"] if found.version == 1 else stat["file"])


def test_page_cache_of_removed_samples_is_not_left_on_the_trainer(sandbox, host, tmp_path):
    """Twelve samples each read an 8 MB file nobody has cached (under /usr, which they see): the
    pages are charged to each sample's group. Removing a group must reclaim them, not hand them to
    the trainer's group, whose charge would otherwise grow with every sample graded."""
    if cgroup_host()[0] is None:
        pytest.skip(f"needs per-sample cgroups, unavailable here: {cgroup_host()[1]}")
    n, size = 12, 8 << 20
    blobs = clean_files_under_usr("rlvr-cache", n, size)
    try:
        for i in range(n):
            evict(blobs / f"{i}.bin")  # nobody holds it cached
        before = _trainer_file_cache()
        reader = "import sys\nwith open(sys.argv[1], 'rb') as f:\n    print(len(f.read()))"
        results = sandbox.run_many([dict(source=reader, argv=[str(blobs / f"{i}.bin")]) for i in range(n)])
        grown = _trainer_file_cache() - before
    finally:
        shutil.rmtree(blobs, ignore_errors=True)
    assert [r.stdout.strip() for r in results] == [str(size)] * n, [(r.verdict, r.detail) for r in results]
    assert grown < n * size // 4, f"the trainer's page cache grew {grown >> 20} MB over {n} samples"
    assert_host_unaffected(host, results)


def _trainer_charge() -> int:
    """Bytes charged to the trainer's memory group and below (page cache and kernel memory too)."""
    found, _ = cgroup_host()
    parent = found.parents.get("memory") or found.parents[""]
    return int(Path(parent, "memory.usage_in_bytes" if found.version == 1 else "memory.current").read_text())


MISSING_PATHS = "import os, sys\nfor i in range(200_000):\n    try:\n        os.stat(f'/usr/lib/{sys.argv[1]}-{i}')\n" \
                "    except OSError:\n        pass\nprint('done')"


def test_kernel_memory_of_removed_samples_is_not_left_on_the_trainer(sandbox, host):
    """Three samples each look up 200,000 paths that do not exist: the kernel's negative dentries
    for them are kernel memory charged to each sample's group (tens of MB). Removing a group must
    reclaim what it can, not hand it all to the trainer's group (measured with the reclaim
    skipped: the trainer grew 114 MB over 3 such samples; with it, 12 MB)."""
    if cgroup_host()[0] is None:
        pytest.skip(f"needs per-sample cgroups, unavailable here: {cgroup_host()[1]}")
    limits = dataclasses.replace(LIMITS, wall_s=20.0)
    before = _trainer_charge()
    results = [sandbox.run(MISSING_PATHS, argv=[f"rlvr-missing-{uuid.uuid4().hex}"], limits=limits) for _ in range(3)]
    grown = _trainer_charge() - before
    assert [r.stdout for r in results] == ["done\n"] * 3, [(r.verdict, r.detail) for r in results]
    left = sum(r.extra["memory_left_bytes"] for r in results)
    if left < 3 * (8 << 20):  # e.g. a kernel booted with cgroup.memory=nokmem: dentries are not charged
        pytest.skip(f"this kernel did not charge the lookups to the samples' groups ({left >> 20} MB)")
    assert grown < left // 4, f"the trainer's group grew {grown >> 20} MB of the {left >> 20} MB left in 3 samples"
    assert_host_unaffected(host, results)


# ------------------------------------------------------------------------------- socket buffers

SOCKET_PAIR = r'''
import socket
def pair(kind, n):
    """(sender, reader) of a fresh `kind` socket: 'unix' (the n-th a stream when n % 4 == 0), 'tcp', else udp."""
    if kind == "unix":
        return socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM if n % 4 else socket.SOCK_STREAM)
    if kind == "tcp":
        ls = socket.socket(); ls.bind(("127.0.0.1", 0)); ls.listen(1)
        a = socket.create_connection(ls.getsockname()); b, _ = ls.accept(); ls.close()
        return a, b
    b = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); b.bind(("127.0.0.1", 0))
    a = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); a.connect(b.getsockname())
    return a, b
'''
"""The socket pairs both socket-buffer programs fill (a prefix of their source)."""

UNREAD_BUFFERS = SOCKET_PAIR + r'''
import json, os, time
def fill(kind):
    held, total, until = [], 0, time.monotonic() + 0.4  # a budget: the verdict must come in time
    try:
        while time.monotonic() < until:
            a, b = pair(kind, len(held))
            a.setblocking(False)
            held += [a, b]
            try:
                while time.monotonic() < until:
                    total += a.send(b"x" * 16384)
            except OSError:  # full (nothing reads b), or refused
                pass
    except OSError:  # out of descriptors, or the family is refused
        pass
    return total, held
queued = {}
for kind in ("tcp", "udp", "unix"):
    pipes = []
    for i in range(7):  # 21 holders and this one under the 24 processes of LIMITS
        r, w = os.pipe()
        if os.fork() == 0:
            total, held = fill(kind)
            os.write(w, str(total).encode()); os.close(w)
            time.sleep(30)  # holds every buffer unread until the sandbox ends
        os.close(w); pipes.append(r)
    queued[kind] = sum(int(os.read(r, 64) or b"0") for r in pipes)
    print("QUEUED" + json.dumps(queued), flush=True)
'''


def test_unread_socket_buffers_stay_within_the_memory_limit(sandbox, host):
    """21 processes fill every socket they can open and never read: socket buffers are kernel
    memory outside RLIMIT_AS (TCP and UDP on cgroup v1 outside the memory limit). TCP and UDP
    sockets are refused by default, so what a sample can hold unread (AF_UNIX) plus its peak stays
    under its memory limit."""
    r = sandbox.run(UNREAD_BUFFERS)
    assert r.verdict in (Verdict.TIMEOUT, Verdict.RESOURCE_LIMIT, Verdict.OK), (r.detail, r.stderr[-300:])
    queued = json.loads([x for x in r.stdout.splitlines() if x.startswith("QUEUED")][-1][6:])
    assert queued["tcp"] == 0 and queued.get("udp") == 0, queued
    peak = r.extra.get("memory_peak_bytes") or 0
    assert queued["unix"] + peak <= LIMITS.memory_mb << 20, f"{queued['unix'] >> 20} MB unread + {peak >> 20} MB"
    assert_host_unaffected(host, [r])


# ------------------------------------------------------------------------ time limit near the edge

def test_time_limit_counts_from_the_programs_start(sandbox, host, monkeypatch):
    """A sandbox start-up made 2.5 s slow (as a loaded host can make a cgroup move or bwrap's
    mounts) is not charged to the program: a 1 s program stays OK under a 3 s limit, every time,
    and a 4.5 s one is a TIMEOUT, every time. Charged from the launch, the first would run 3.5 s."""
    from rlvr.rewards.sandbox import launch

    admit = launch.admit

    def slow_admit(pid):
        admit(pid)
        time.sleep(2.5)

    monkeypatch.setattr(launch, "admit", slow_admit)
    limits = Limits(**{**LIMITS.__dict__, "wall_s": 3.0})
    program = "import time\ntime.sleep(%s)\nprint('done')"
    results = sandbox.run_many([dict(source=program % 1.0, limits=limits)] * 4
                               + [dict(source=program % 4.5, limits=limits)] * 4)
    assert [r.verdict for r in results] == [Verdict.OK] * 4 + [Verdict.TIMEOUT] * 4, \
        [(r.verdict, round(r.elapsed, 2)) for r in results]
    assert all(r.stdout == "done\n" for r in results[:4])
    assert_host_unaffected(host, results)


# -------------------------------------------------------------------------- page-cache channel

PAGE_CACHE = r'''
import ctypes, errno, json, mmap, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
L = ctypes.c_long
folder, mode, bits = sys.argv[1], sys.argv[2], sys.argv[3]
paths = [os.path.join(folder, f"{i}.bin") for i in range(len(bits))]
size = os.path.getsize(paths[0])
name = lambda e: errno.errorcode.get(e, str(e))
out = {}
if mode == "send":  # evict the files whose bit is 0, again and again for a concurrent receiver
    until = time.monotonic() + float(sys.argv[4])
    while True:
        seen = {"fadvise": set(), "pageout": set()}
        for path, bit in zip(paths, bits):
            if bit == "1":
                continue
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                seen["fadvise"].add("ok")
            except OSError as e:
                seen["fadvise"].add(name(e.errno))
            p = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
            rc = libc.madvise(ctypes.c_void_p(p), L(size), 21)  # MADV_PAGEOUT
            seen["pageout"].add("ok" if rc == 0 else name(ctypes.get_errno()))
            libc.munmap(ctypes.c_void_p(p), L(size))
            os.close(fd)
        if time.monotonic() >= until:
            break
        time.sleep(0.05)
    out = {k: sorted(v) for k, v in seen.items()}
else:  # probe each file's first page without reading it in
    time.sleep(float(sys.argv[4]))
    decoded = {"nowait": "", "mincore": "", "cachestat": ""}
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.preadv(fd, [bytearray(4096)], 0, os.RWF_NOWAIT)
            decoded["nowait"] += "1"
        except OSError as e:
            decoded["nowait"] += "0" if e.errno == errno.EAGAIN else f"[{name(e.errno)}]"
        p = libc.mmap(None, 4096, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        vec = (ctypes.c_ubyte * 1)()
        rc = libc.mincore(ctypes.c_void_p(p), L(4096), vec)
        decoded["mincore"] += str(vec[0] & 1) if rc == 0 else f"[{name(ctypes.get_errno())}]"
        libc.munmap(ctypes.c_void_p(p), L(4096))
        rng, stat = (ctypes.c_uint64 * 2)(0, 4096), (ctypes.c_uint64 * 5)()
        rc = libc.syscall(L(451), L(fd), rng, stat, L(0))  # cachestat (x86_64 and aarch64 alike)
        decoded["cachestat"] += str(min(stat[0], 1)) if rc == 0 else f"[{name(ctypes.get_errno())}]"
        os.close(fd)
    out = decoded
    ctx = ctypes.c_ulong(0)
    aio = libc.syscall(L(206 if os.uname().machine == "x86_64" else 0), L(1), ctypes.byref(ctx))  # io_setup
    out["io_setup"] = "ok" if aio == 0 else name(ctypes.get_errno())
print("CACHE" + json.dumps(out), flush=True)
'''
BITS = "1011001110001111"


def _cached(path: str) -> bool:
    """Whether the first page of ``path`` is in the page cache (the harness's own probe)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.preadv(fd, [bytearray(4096)], 0, os.RWF_NOWAIT)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


@pytest.mark.parametrize("order", ["next", "concurrent"])
def test_page_cache_channel_between_samples(order, sandbox, host):
    """A sample evicts the files of a shared read-only folder under ``/usr`` whose bit is 0
    (``posix_fadvise(DONTNEED)``, ``MADV_PAGEOUT``); another sample, the next one or one running
    at the same time, probes each file's first page without reading it in (``preadv2(RWF_NOWAIT)``,
    ``mincore``, ``cachestat``). The eviction and the probes are refused (seccomp) or answered as
    if every page were cached (the kernel's ``mincore`` on a file the sample cannot write), so no
    probe reads the bits back, and the harness still finds every file cached."""
    folder = clean_files_under_usr("rlvr-channel", len(BITS), 16 << 12)
    try:
        for i in range(len(BITS)):
            (folder / f"{i}.bin").read_bytes()  # cached, by the harness
        assert all(_cached(str(folder / f"{i}.bin")) for i in range(len(BITS)))
        send = dict(source=PAGE_CACHE, argv=[str(folder), "send", BITS, "0" if order == "next" else "1.5"])
        recv = dict(source=PAGE_CACHE, argv=[str(folder), "recv", BITS, "0" if order == "next" else "0.7"])
        if order == "next":
            sent = sandbox.run(**send)
            left = "".join("1" if _cached(str(folder / f"{i}.bin")) else "0" for i in range(len(BITS)))
            received = sandbox.run(**recv)
        else:
            sent, received = sandbox.run_many([send, recv])
            left = "".join("1" if _cached(str(folder / f"{i}.bin")) else "0" for i in range(len(BITS)))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    results = [sent, received]
    assert [r.verdict for r in results] == [Verdict.OK] * 2, [(r.detail, r.stderr[-300:]) for r in results]
    tried, probed = (json.loads(r.stdout.split("CACHE", 1)[1]) for r in results)
    assert left == "1" * len(BITS), f"the sender evicted pages: {left}"
    assert BITS not in probed.values(), probed
    assert tried["fadvise"] == ["EPERM"], tried
    refused = f"[{errno.errorcode[errno.EOPNOTSUPP]}]"
    assert probed["nowait"] == refused * len(BITS) and probed["cachestat"] == "[EPERM]" * len(BITS), probed
    assert probed["mincore"] == "1" * len(BITS) and probed["io_setup"] == "EPERM", probed
    assert_host_unaffected(host, results)


# ----------------------------------------------------------------------- socket buffers, charged

HOARD = SOCKET_PAIR + r'''
import os, sys, time
holders, budget, kind = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
until = time.monotonic() + budget  # one deadline for every holder
for h in range(holders):
    if os.fork() == 0:
        held, total = [], 0
        try:
            while time.monotonic() < until:
                a, b = pair(kind, len(held))
                a.setblocking(False)
                held += [a, b]
                try:
                    for _ in range(64 if kind == "udp" else 1 << 30):  # past a full queue a datagram is dropped
                        if time.monotonic() >= until:
                            break
                        total += a.send(b"x" * 16384)
                except OSError:  # full: nothing reads b
                    pass
        except OSError:  # out of descriptors
            pass
        # Once every holder has stopped sending, the living report what they hold: a holder the
        # OOM killer took freed its queues and reports nothing.
        time.sleep(max(0.0, until + 0.3 - time.monotonic()))
        os.write(1, f"HOLDING {h} {total}\n".encode())
        time.sleep(30)  # holds every buffer unread until the sandbox ends
time.sleep(budget + 0.6)
queued = 0
for name in ("tcp", "udp", "tcp6", "udp6"):  # this namespace's sockets: tx_queue:rx_queue in bytes
    for line in open(f"/proc/net/{name}").read().splitlines()[1:]:
        queued += sum(int(x, 16) for x in line.split()[4].split(":"))
print("HELD", queued, flush=True)
time.sleep(30)
'''


def _hoarded(r, kind: str) -> int:
    """Bytes a HOARD run held unread at one moment, after every holder stopped sending: AF_UNIX,
    what the living holders sent (a full AF_UNIX queue refuses more, it drops nothing; a holder
    the OOM killer took freed its queues and does not answer); TCP and UDP, the queues the kernel
    shows in its namespace."""
    if kind != "unix":
        return int(r.stdout.split("HELD ")[1].split()[0])
    return sum(int(line.split()[2]) for line in r.stdout.splitlines() if line.startswith("HOLDING "))


def test_unix_socket_buffers_are_charged_to_the_memory_limit(sandbox, host):
    """21 processes fill every AF_UNIX socket pair they can open and never read. The queued data
    is charged to the sample's cgroup: its peak covers every byte held at one moment (118 MB here,
    under a 256 MB limit)."""
    if cgroup_host()[0] is None:
        pytest.skip(f"needs per-sample cgroups, unavailable here: {cgroup_host()[1]}")
    r = sandbox.run(HOARD, argv=["21", "0.6", "unix"], limits=LIMITS)
    assert r.verdict in (Verdict.TIMEOUT, Verdict.MEMORY_LIMIT), (r.detail, r.stderr[-300:])
    queued, peak = _hoarded(r, "unix"), r.extra["memory_peak_bytes"]
    assert 0 < queued <= peak <= LIMITS.memory_mb << 20, f"{queued >> 20} MB queued, peak {peak >> 20} MB"
    assert_host_unaffected(host, [r])


def test_unix_socket_buffers_stop_at_the_memory_limit(sandbox, host):
    """Under a 48 MB limit the same 21 processes run to their clock while they queue nothing, and
    end at the memory limit when they fill their socket pairs: the queues, not the processes, reach
    the limit, and the peak stays within it."""
    if cgroup_host()[0] is None:
        pytest.skip(f"needs per-sample cgroups, unavailable here: {cgroup_host()[1]}")
    limits = Limits(**{**LIMITS.__dict__, "memory_mb": 48})
    idle, hoarding = (sandbox.run(HOARD, argv=["21", budget, "unix"], limits=limits) for budget in ("0", "0.6"))
    assert idle.verdict == Verdict.TIMEOUT and idle.stdout.count("HOLDING ") == 21, (idle.detail, idle.stderr[-300:])
    assert hoarding.verdict == Verdict.MEMORY_LIMIT, (hoarding.detail, hoarding.stderr[-300:])
    assert idle.extra["memory_peak_bytes"] < hoarding.extra["memory_peak_bytes"] <= limits.memory_mb << 20
    assert_host_unaffected(host, [idle, hoarding])


@pytest.mark.parametrize("kind", ["tcp", "udp"])
def test_inet_socket_buffers_are_charged(kind, sandbox, host):
    """With ``Limits.inet``, 21 processes fill loopback TCP connections or UDP sockets and never
    read. cgroup v1 charges both to the ``kmem.tcp`` counter, not to the memory limit: UDP stops at
    that counter's limit (a quarter of the memory limit); TCP's forced charges pass it, but what it
    holds plus the memory peak stays under the memory limit. cgroup v2 charges both to
    ``memory.max``."""
    from rlvr.rewards.sandbox.cgroup import TCP_SHARE

    found = cgroup_host()[0]
    if found is None:
        pytest.skip(f"needs per-sample cgroups, unavailable here: {cgroup_host()[1]}")
    r = sandbox.run(HOARD, argv=["21", "0.6", kind], limits=Limits(**{**LIMITS.__dict__, "inet": True}))
    assert r.verdict in (Verdict.TIMEOUT, Verdict.MEMORY_LIMIT), (r.detail, r.stderr[-300:])
    held, peak, limit = _hoarded(r, kind), r.extra["memory_peak_bytes"], LIMITS.memory_mb << 20
    assert held > 0 and held + peak <= limit, f"{held >> 20} MB held unread + peak {peak >> 20} MB"
    if found.version == 1 and kind == "udp":
        assert held <= limit // TCP_SHARE * 1.05, f"{held >> 20} MB of UDP held past the kmem.tcp limit"
    assert_host_unaffected(host, [r])


# ----------------------------------------------------------------------- a slot's network namespace

ABSTRACT = r'''
import json, os, socket, sys, time
name, mode = "\0" + sys.argv[1], sys.argv[2]
out = {"netns": os.readlink("/proc/self/ns/net")}
if mode == "listen":  # a daemon in its own session holds the name; the sample itself exits at once
    if os.fork() == 0:
        os.setsid()
        s = socket.socket(socket.AF_UNIX)
        s.bind(name); s.listen(4)
        print("LISTENING", flush=True)
        time.sleep(float(sys.argv[3]))
        os._exit(0)
    time.sleep(0.3)
else:  # reach the name every way an AF_UNIX socket can, for a while
    deadline = time.monotonic() + float(sys.argv[3])
    while time.monotonic() < deadline:
        for way in ("stream", "dgram", "pair_dgram", "pair_connect"):
            try:
                if way == "stream":
                    s = socket.socket(socket.AF_UNIX); s.connect(name)
                elif way == "dgram":
                    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM); s.sendto(b"hi", name)
                else:
                    s, _ = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
                    s.sendto(b"hi", name) if way == "pair_dgram" else s.connect(name)
                out[way] = "REACHED"
            except OSError as e:
                out.setdefault(way, type(e).__name__)
        time.sleep(0.05)
print("ABSTRACT" + json.dumps(out))
'''


def _abstract(r) -> dict:
    assert r.verdict is Verdict.OK, (r.detail, r.stderr[-300:])
    return json.loads(next(x for x in r.stdout.splitlines() if x.startswith("ABSTRACT"))[8:])


@pytest.fixture()
def one_slot(host):
    """A sandbox of one slot: every sample runs in the same slot, one after the other."""
    sb = Sandbox(workers=1, limits=LIMITS, isolation="bwrap", base_uid=BASE_UID)
    host["uids"].append(sb.uid_range)
    yield sb
    sb.close()


def test_host_abstract_sockets_out_of_reach(sandbox, host):
    """Abstract AF_UNIX names live in a network namespace, not in the file system the mounts
    hide: the host's (a stream listener and a datagram socket here) are out of a sample's reach
    by every route, its own socket or a socket pair's, connected or addressed per datagram."""
    name = f"rlvr-hostile-{TOKEN}"
    listener, inbox = socket.socket(socket.AF_UNIX), socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind("\0" + name + "-s")
    listener.listen(4)
    inbox.bind("\0" + name + "-d")
    for sock in (listener, inbox):
        sock.setblocking(False)
    try:
        results = [sandbox.run(ABSTRACT, argv=[name + suffix, "reach", "0.2"]) for suffix in ("-s", "-d")]
        for way, seen in ((way, _abstract(r).get(way)) for r in results for way in ("stream", "dgram")):
            assert seen in ("ConnectionRefusedError", "FileNotFoundError"), (way, seen)
        with pytest.raises(BlockingIOError):
            listener.accept()
        with pytest.raises(BlockingIOError):
            inbox.recv(16)
    finally:
        listener.close()
        inbox.close()
    assert_host_unaffected(host, results)


def test_abstract_socket_of_a_sample_is_gone_for_the_next(one_slot, host):
    """A sample's daemon that holds an abstract name is killed with its sample: the next sample
    of the same slot, in the same network namespace, finds nothing under that name."""
    name = f"rlvr-leftover-{TOKEN}"
    first = one_slot.run(ABSTRACT, argv=[name, "listen", "30"])
    second = one_slot.run(ABSTRACT, argv=[name, "reach", "0.3"])
    assert "LISTENING" in first.stdout, (first.detail, first.stderr[-300:])
    seen = _abstract(second)
    assert seen["netns"] == _abstract(first)["netns"]  # the slot's own namespace, both times
    assert all(seen[way] != "REACHED" for way in ("stream", "dgram", "pair_dgram", "pair_connect")), seen
    assert_host_unaffected(host, [first, second])


CYCLE = r'''
import array, os, socket, sys
held = []
for i in range(5):
    s = socket.socket(socket.AF_UNIX); s.bind("\0" + sys.argv[1] + str(i)); s.listen(1); held.append(s)
a, b = socket.socketpair()
fds = array.array("i", [a.fileno(), b.fileno()] + [s.fileno() for s in held])
a.sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])  # every socket in flight, in a cycle
b.sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
print("CYCLE", os.readlink("/proc/self/ns/net"), flush=True)
os._exit(0)
'''

LISTED = r'''
import socket, sys
names = [line.split()[-1] for line in open("/proc/net/unix").read().splitlines()[1:] if len(line.split()) >= 8]
try:
    s = socket.socket(socket.AF_UNIX); s.connect("\0" + sys.argv[1] + "0"); reached = "REACHED"
except OSError as e:
    reached = type(e).__name__
print("LISTED", names, reached)
'''


def test_sockets_kept_alive_in_flight_do_not_reach_the_next_sample(one_slot, host):
    """Sockets sent over one another in a cycle (``SCM_RIGHTS``) outlive every process of their
    sample until the kernel collects them, their abstract names still bound. The slot's next
    sample must not see or reach them: a namespace left holding a socket is replaced."""
    name = f"rlvr-cycle-{TOKEN}-"
    first = one_slot.run(CYCLE, argv=[name])
    second = one_slot.run(LISTED, argv=[name])
    assert first.verdict is Verdict.OK and "CYCLE" in first.stdout, (first.detail, first.stderr[-300:])
    assert second.verdict is Verdict.OK, (second.detail, second.stderr[-300:])
    assert not any(name in line for line in second.stdout.splitlines()), second.stdout
    assert "REACHED" not in second.stdout
    assert_host_unaffected(host, [first, second])


def test_concurrent_samples_cannot_reach_each_other(sandbox, host):
    """Two samples at the same time run in different slots, each in its own network namespace:
    one holds an abstract name for two seconds while the other tries to reach it."""
    name = f"rlvr-concurrent-{TOKEN}"
    holder, reacher = sandbox.run_many([dict(source=ABSTRACT, argv=[name, "listen", "2"]),
                                        dict(source=ABSTRACT, argv=[name, "reach", "1.2"])])
    assert "LISTENING" in holder.stdout, (holder.detail, holder.stderr[-300:])
    seen = _abstract(reacher)
    assert seen["netns"] != _abstract(holder)["netns"]
    assert all(seen[way] != "REACHED" for way in ("stream", "dgram", "pair_dgram", "pair_connect")), seen
    assert_host_unaffected(host, [holder, reacher])


def test_slots_network_namespaces(one_slot, host):
    """As root each slot keeps one empty namespace of its own (not the host's); a sample with
    ``inet`` gets a fresh one from bwrap every time, its loopback up."""
    slot_ns = f"net:[{os.fstat(one_slot._netns[0].fd).st_ino}]"
    host_ns = os.readlink("/proc/self/ns/net")
    runs = [one_slot.run(ABSTRACT, argv=["x", "reach", "0"]) for _ in range(2)]
    inet = [one_slot.run(ABSTRACT, argv=["x", "reach", "0"], limits=dataclasses.replace(LIMITS, inet=True))
            for _ in range(2)]
    assert [_abstract(r)["netns"] for r in runs] == [slot_ns, slot_ns] and slot_ns != host_ns
    fresh = {_abstract(r)["netns"] for r in inet}
    assert len(fresh) == 2 and not fresh & {slot_ns, host_ns}
    assert_host_unaffected(host, runs + inet)


# ------------------------------------------------------------------------------------- /dev

DEVICES_USE = r'''
import errno, json, os
out = {"listing": sorted(os.listdir("/dev"))}
with open("/dev/null", "w") as f:
    out["null"] = f.write("x")
out["zero"] = open("/dev/zero", "rb").read(4).hex()
out["urandom"] = len(open("/dev/urandom", "rb").read(16)) + len(open("/dev/random", "rb").read(16))
try:
    with open("/dev/full", "w") as f:
        f.write("x"); f.flush()
except OSError as e:
    out["full"] = errno.errorcode[e.errno]
out["fd"] = sorted(os.listdir("/dev/fd"))[:3]
with open("/dev/shm/x", "w") as f:
    out["shm"] = f.write("y")
for what, call in (("create", lambda: open("/dev/new", "w")), ("unlink", lambda: os.unlink("/dev/null")),
                   ("chmod", lambda: os.chmod("/dev/null", 0o600)),
                   ("rename", lambda: os.rename("/dev/zero", "/dev/z")),
                   ("mknod", lambda: os.mknod("/dev/mem2", 0o666 | 0o20000, os.makedev(1, 1))),
                   ("symlink", lambda: os.symlink("/proc/1/root", "/dev/root"))):
    try:
        call(); out[what] = "ALLOWED"
    except OSError as e:
        out[what] = errno.errorcode[e.errno]
print("DEVICES" + json.dumps(out))
'''


@pytest.mark.parametrize("dev", ["own", "bwrap"])
def test_devices_work_and_dev_cannot_be_changed(dev, sandbox, host, monkeypatch):
    """The devices a program may use (``null``, ``zero``, ``full``, ``random``, ``urandom``, the
    ``/dev/fd`` links, a writable ``/dev/shm``) work, from the sandbox's own device directory as
    from bwrap's ``--dev``; no entry of ``/dev`` can be added, removed or changed."""
    if dev == "own" and not sandbox._own_devices:
        pytest.skip("no device directory here (no CAP_MKNOD, or nodev mounts): bwrap's --dev serves")
    if dev == "bwrap":
        monkeypatch.setattr(sandbox, "_own_devices", False)
    r = sandbox.run(DEVICES_USE)
    assert r.verdict is Verdict.OK, (r.detail, r.stderr[-300:])
    seen = json.loads(next(x for x in r.stdout.splitlines() if x.startswith("DEVICES"))[7:])
    assert {"null", "zero", "full", "random", "urandom", "tty", "fd", "stdin", "stdout", "stderr", "shm"} \
        <= set(seen["listing"]), seen["listing"]
    assert (seen["null"], seen["zero"], seen["urandom"], seen["full"], seen["shm"]) == (1, "00000000", 32, "ENOSPC", 1)
    assert seen["fd"] == ["0", "1", "2"]
    assert all(seen[what] != "ALLOWED" for what in ("create", "unlink", "chmod", "rename", "mknod", "symlink")), seen
    assert_host_unaffected(host, [r])
