"""Sandbox throughput and per-program cost against a bare subprocess, optionally against another
checkout's sandbox, interleaved.

    python bench/sandbox.py [--n 200] [--workers 2] [--repeats 30] [--baseline OTHER_CHECKOUT/src]
                            [--hold-mb 0]
    python bench/sandbox.py --hostile     # every program of tests/rewards/test_hostile.py, alone
    python bench/sandbox.py --channel     # the page-cache timing channel left between samples
    python bench/sandbox.py --exact       # the exact channels: page cache (pagemap, fault kind), futexes
    python bench/sandbox.py --chain       # the execs of the chain, each before python, then bwrap and all
    python bench/sandbox.py --phases      # a sample cgroup's life and the uid sweep, step by step


Prints trivial programs per second through ``Sandbox.run_many`` with ``--workers`` slots, and
the median wall time and CPU time (the timing process's own, every thread, plus its waited-for
descendants': less sensitive to the machine's load than wall time) of one trivial program run
sequentially in the sandbox versus a bare
``subprocess.run([python, "-E", "-s", "-S", "-c", ...])``. With ``--baseline``, a second process
imports ``rlvr`` from that source tree and times the same program in its sandbox; the three are
run in turn, one of each per repeat (the order rotating), so machine load hits them alike.
``--hold-mb`` makes both sandboxes' processes hold that much touched memory first, as a trainer
does (starting a process costs more from a large parent unless it is started by ``vfork``).
``--hostile`` prints each hostile program's verdict, wall time and its cgroup's peak memory.
``--chain`` times ``print(1)`` by a bare subprocess behind each exec the sandbox can put in front
(as root: ``setpriv`` and ``chroot`` to the slot uid, the ``ulimit`` shell, bwrap with the
sandbox's namespaces and mounts, and the three together), interleaved, with the empty
environment the sandbox gives them: the three together are the floor under the sandbox's own
steps; two more rows give that chain with a network namespace made by bwrap for the run (where
the sandbox enters a slot's) and with bwrap's ``--dev`` (where the sandbox binds its device
directory).
``--phases`` times, from a worker thread, each step the sandbox takes around a bare ``print(1)``
born in a sample cgroup (after one run outside any group, as a new sandbox makes): making the
group, killing its members, reading its events and peak, reclaiming what it holds (its charge
read, then its limit lowered to 0 on v1, whatever it holds), removing it,
sweeping the slot uid (which runs only where the group cannot prove the sample gone).
``--channel`` measures what the seccomp filter leaves of the page-cache channel: a sample reads
the files of a shared folder under ``/usr`` whose bit is 1 (the harness has evicted them all
first), and a receiver, running at the same time or next, times a one-byte read of each
(< 20 us: cached); it prints the bits it decodes, three times each way.
``--exact`` measures the exact channels: a sample reads in the pages of a shared file under
``/usr`` whose bit is 1, and a receiver, next or at the same time, reads them from
``/proc/self/pagemap``'s present bits and from the kind of each page's fault; and two samples at
the same time pass bits by ``FUTEX_WAIT``/``FUTEX_WAKE`` on a word of ``/usr/bin/python3``. Three
times each, printing the bits decoded.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import time

from rlvr.rewards.sandbox import Limits, Sandbox, Verdict, default_python

PROGRAM = "print(1)"


def _cpu() -> float:
    """CPU seconds used so far by this process (every thread) and its waited-for descendants."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _timed(call):
    """(wall seconds, CPU seconds, result) of ``call()``."""
    t, c = time.perf_counter(), _cpu()
    result = call()
    return time.perf_counter() - t, _cpu() - c, result


def _ratio_ci(values: list[float], bare: list[float], draws: int = 2000) -> tuple[float, float]:
    """95% bootstrap interval of median(values) / median(bare), resampling the repeats (paired:
    the i-th of each ran in the same round; seed 0)."""
    rng, n = random.Random(0), len(values)
    ratios = []
    for _ in range(draws):
        idx = [rng.randrange(n) for _ in range(n)]
        ratios.append(statistics.median(values[i] for i in idx) / statistics.median(bare[i] for i in idx))
    ratios.sort()
    return ratios[int(0.025 * draws)], ratios[int(0.975 * draws) - 1]


def _hold(mb: int) -> bytearray:
    """``mb`` MB of memory with every page touched (a trainer-sized parent)."""
    ballast = bytearray(mb << 20)
    for i in range(0, len(ballast), 4096):
        ballast[i] = 1
    return ballast


def _serve(hold_mb: int) -> None:
    """Baseline side: time one sandboxed run per line read; answer with the seconds taken."""
    ballast = _hold(hold_mb)  # noqa: F841 - held for the process's lifetime
    sb = Sandbox(workers=1)
    sb.run(PROGRAM)
    print(sb.isolation, flush=True)
    for _ in sys.stdin:
        wall, cpu, result = _timed(lambda: sb.run(PROGRAM))
        print(f"{wall} {cpu}" if result.verdict is Verdict.OK else "nan nan", flush=True)
    sb.close()


def _hostile() -> None:
    """Each program of the hostile suite alone, with the suite's limits: verdict, time, peak memory."""
    suite = _suite("test_hostile")
    listener = suite.Listener()
    host = {"port": listener.port}
    with Sandbox(workers=1, limits=suite.LIMITS, isolation="bwrap") as sb:
        print(f"{'program':34s} {'verdict':15s} {'allowed':5s} {'s':>5s} {'peak MB':>8s}")
        for name in sorted(suite.PROGRAMS):
            r = sb.run(suite._source(name, host))
            _, allowed, check = suite.PROGRAMS[name]
            ok = r.verdict in allowed and (check is None or check(r))
            peak = r.extra.get("memory_peak_bytes")
            print(f"{name:34s} {r.verdict.value:15s} {'yes' if ok else 'NO':5s} {r.elapsed:5.2f} "
                  f"{'-' if peak is None else f'{peak / 2**20:8.1f}':>8s}")
    print(f"limits: memory {suite.LIMITS.memory_mb} MB per sample, wall {suite.LIMITS.wall_s} s; "
          f"loopback listener hits: {listener.hits}")


CHANNEL = r'''
import json, os, sys, time
folder, mode, bits, wait = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
paths = [os.path.join(folder, f"{i}.bin") for i in range(len(bits))]
if mode == "send":
    for path, bit in zip(paths, bits):
        if bit == "1":
            with open(path, "rb") as f:
                f.read(1)
    time.sleep(wait)
else:
    time.sleep(wait)
    us = []
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        t = time.perf_counter_ns()
        os.pread(fd, 1, 0)
        us.append((time.perf_counter_ns() - t) / 1000)
        os.close(fd)
    print(json.dumps(us))
'''


def _channel(bits: str = "10110011100011111011001110001111") -> None:
    """The page-cache timing channel between two samples, concurrent and one after the other."""
    folder = f"/usr/local/share/rlvr-channel-{os.getpid()}"
    os.makedirs(folder)
    try:
        for i in range(len(bits)):
            with open(f"{folder}/{i}.bin", "wb") as f:
                f.write(os.urandom(16 << 12))
                f.flush()
                os.fsync(f.fileno())
        with Sandbox(workers=2, isolation="bwrap") as sb:
            for order, send_wait, recv_wait in (("concurrent", "1.0", "0.5"), ("next", "0", "0")):
                for _ in range(3):
                    for i in range(len(bits)):
                        fd = os.open(f"{folder}/{i}.bin", os.O_RDONLY)
                        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                        os.close(fd)
                    send = dict(source=CHANNEL, argv=[folder, "send", bits, send_wait])
                    recv = dict(source=CHANNEL, argv=[folder, "recv", bits, recv_wait])
                    runs = sb.run_many([send, recv]) if order == "concurrent" else [sb.run(**send), sb.run(**recv)]
                    us = json.loads(runs[1].stdout)
                    got = "".join("1" if t < 20 else "0" for t in us)
                    right = sum(a == b for a, b in zip(got, bits))
                    print(f"{order:10s} sent {bits} decoded {got}  {right}/{len(bits)} bits  "
                          f"read {min(us):.1f}-{max(us):.1f} us")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


FUTEX = r'''
import ctypes, errno, json, os, sys, time
role, bits, slot_s = sys.argv[1], sys.argv[2], float(sys.argv[3])
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
fd = os.open("/usr/bin/python3", os.O_RDONLY)
base = libc.mmap(None, 4096, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED: the file's first page, as every sample has it
words = [base + 4 * (i + 1) for i in range(len(bits))]
def futex(addr, op, val, timeout=None):
    ts = None
    if timeout is not None:
        ts = (ctypes.c_long * 2)(int(timeout), int((timeout % 1) * 1e9))
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(202), ctypes.c_void_p(addr), ctypes.c_int(op), ctypes.c_int(val), ts,
                     ctypes.c_void_p(0), ctypes.c_int(0))
    return r if r >= 0 else errno.errorcode[ctypes.get_errno()]
if role == "recv":  # waits on each word in turn: woken = 1, timed out = 0
    got = ""
    for addr in words:
        value = ctypes.c_int.from_address(addr).value
        got += "1" if futex(addr, 0, value, slot_s) == 0 else "0"
    print(json.dumps({"futex": got}))
else:  # wakes the word of each 1 until a waiter is there
    until = time.monotonic() + 3 * slot_s * len(bits)
    for addr, bit in zip(words, bits):
        while bit == "1" and time.monotonic() < until and futex(addr, 1, 1) != 1:
            time.sleep(0.001)
    print("sent")
'''


def _suite(name: str):
    """A module of ``tests/rewards`` (its programs and helpers), loaded from its file."""
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[1] / "tests" / "rewards" / f"{name}.py"
    sys.path.insert(0, str(path.parent))  # the suite's helper modules beside it
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _exact_channels(rounds: int = 3) -> None:
    """Exact channels between samples: the page cache read through ``/proc/self/pagemap`` and the
    kind of a fault (``tests/rewards/test_sandbox_host.py``'s probe), to the next sample and to
    one running at the same time; shared futexes on ``/usr/bin/python3`` (concurrent only)."""
    host = _suite("test_sandbox_host")
    bits, page = host.BITS, host.PAGE
    folder = f"/usr/local/share/rlvr-exact-{os.getpid()}"
    os.makedirs(folder)
    blob = f"{folder}/0.bin"
    try:
        with open(blob, "wb") as f:
            f.write(os.urandom((len(bits) + 1) * page))
            f.flush()
            os.fsync(f.fileno())
        with Sandbox(workers=2, isolation="bwrap", limits=Limits(wall_s=10)) as sb:
            print(f"sent {bits} ({len(bits)} bits) each time; decoded bits right of {len(bits)}")
            for order in ("next", "concurrent"):
                for _ in range(rounds):
                    fd = os.open(blob, os.O_RDONLY)
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
                    os.pread(fd, page, 0)  # the anchor page, cached by the harness
                    os.close(fd)
                    waits = ("0", "0") if order == "next" else ("2.0", "0.7")
                    send = dict(source=host.PAGE_CACHE_PROBE, argv=[blob, "send", bits, waits[0]])
                    recv = dict(source=host.PAGE_CACHE_PROBE, argv=[blob, "recv", bits, waits[1]])
                    runs = sb.run_many([send, recv]) if order == "concurrent" else [sb.run(**send), sb.run(**recv)]
                    got = json.loads(runs[1].stdout)
                    print(f"page cache {order:10s} " + "  ".join(
                        f"{k} {v} {sum(a == b for a, b in zip(v, bits))}" for k, v in got.items()))
            for _ in range(rounds):
                runs = sb.run_many([dict(source=FUTEX, argv=["send", bits, "0.05"]),
                                    dict(source=FUTEX, argv=["recv", bits, "0.05"])])
                got = json.loads(runs[1].stdout)["futex"]
                print(f"futex      concurrent futex {got} {sum(a == b for a, b in zip(got, bits))} "
                      f"in {runs[1].elapsed:.2f} s")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _run_and_reap(cmd: list[str]) -> None:
    """Run ``cmd``, then reap the orphans it left us, the subreaper (bwrap's pid 1), so that their
    CPU time is counted with the run's."""
    subprocess.run(cmd, capture_output=True, check=True, env={"PATH": "/usr/bin:/bin"})
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                return
        except ChildProcessError:
            return


def _chain(repeats: int) -> None:
    """Wall and CPU medians of ``print(1)`` behind each exec of the sandbox's chain, interleaved,
    up to the whole chain without the sandbox's own steps (no cgroup, seccomp filter, status
    pipe or start gate): the floor of what a sample costs; then that chain with bwrap making the
    network namespace and ``/dev`` itself, for each of the two."""
    from rlvr.rewards.sandbox import devices, launch
    from rlvr.rewards.sandbox.procs import become_subreaper

    become_subreaper()
    py = [default_python(), "-E", "-s", "-S", "-c", PROGRAM]
    # No status pipe, start gate, filter or program files; the host's network namespace shared, as
    # the sandbox shares a slot's; the sandbox's device directory where it has one.
    dev_dir = devices.device_dir()
    bwrap = functools.partial(launch.bwrap_prefix, py[0], {}, Limits(), None, None, None)
    rlimits = launch.gate(Limits(), wait=False)
    front = launch.uid_prefix(60000) + rlimits
    chains = {"python": py, "setpriv + python": launch.setpriv_prefix(60000) + py,
              "chroot + python": launch.uid_prefix(60000) + py, "ulimit shell + python": rlimits + py,
              "bwrap + python": bwrap(new_net=False, dev_dir=dev_dir) + py,
              "chroot + shell + bwrap + python": front + bwrap(new_net=False, dev_dir=dev_dir) + py,
              "  same, bwrap's own network ns": front + bwrap(new_net=True, dev_dir=dev_dir) + py,
              "  same, bwrap's --dev": front + bwrap(new_net=False, dev_dir=None) + py}
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in chains}
    names = list(chains)
    for i in range(repeats):
        for name in names[i % len(names):] + names[:i % len(names)]:
            times[name].append(_timed(functools.partial(_run_and_reap, chains[name]))[:2])
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}; {repeats} rounds; medians")
    base = [statistics.median(p[k] for p in times["python"]) for k in (0, 1)]
    for name, pairs in times.items():
        wall, cpu = (statistics.median(p[k] for p in pairs) for k in (0, 1))
        print(f"{name:32s} wall {wall * 1000:6.2f} ms ({wall / base[0]:.2f}x)   CPU {cpu * 1000:6.2f} ms "
              f"({cpu / base[1]:.2f}x)")


def _phases(repeats: int) -> None:
    """Median wall ms of each cgroup step around a bare ``print(1)`` born in the group."""
    import threading

    from rlvr.rewards.sandbox import cgroup_host
    from rlvr.rewards.sandbox.procs import sweep_uid

    host, why = cgroup_host()
    if host is None:
        raise SystemExit(f"no per-sample cgroups here: {why}")
    times: dict[str, list[float]] = {}

    def step(name, call):
        t = time.perf_counter()
        result = call()
        times.setdefault(name, []).append(time.perf_counter() - t)
        return result

    def rounds():  # a worker thread, as in the sandbox: the main thread is never moved
        # Once outside any group, as a new sandbox's first run: what the program reads stays charged here.
        subprocess.run([default_python(), "-E", "-s", "-S", "-c", PROGRAM], stdout=subprocess.DEVNULL, check=True)
        for _ in range(repeats):
            group = step("create", lambda: host.create(512 << 20, 32, 1.0))
            with group.spawning():
                proc = subprocess.Popen([default_python(), "-E", "-s", "-S", "-c", PROGRAM], stdout=subprocess.DEVNULL)
            proc.wait()
            step("kill (members read)", group.kill)
            step("events", group.events)
            step("peak", group.peak_bytes)
            step("reclaim", group.reclaim)
            step("rmdir", lambda g=group: [os.rmdir(d) for d in g.dirs])  # remove() without its reclaim
            step("sweep_uid", lambda: sweep_uid(60000))

    worker = threading.Thread(target=rounds)
    worker.start()
    worker.join()
    print(f"cgroup v{host.version}; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}; {repeats} rounds")
    for name, values in times.items():
        print(f"{name:22s}{statistics.median(values) * 1000:7.2f} ms median")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200, help="programs in the throughput run")
    parser.add_argument("--workers", type=int, default=2, help="sandbox slots")
    parser.add_argument("--repeats", type=int, default=30, help="sequential runs for the latency medians")
    parser.add_argument("--baseline", help="another checkout's src/ directory to time side by side")
    parser.add_argument("--hold-mb", type=int, default=0, help="memory both sandboxes' processes hold first")
    parser.add_argument("--hostile", action="store_true", help="run the hostile suite's programs, one by one")
    parser.add_argument("--channel", action="store_true", help="measure the page-cache timing channel")
    parser.add_argument("--exact", action="store_true", help="measure the exact channels between samples")
    parser.add_argument("--phases", action="store_true", help="time a sample cgroup's steps one by one")
    parser.add_argument("--chain", action="store_true", help="time the execs of the sandbox's chain one by one")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        return _serve(args.hold_mb)
    if args.hostile:
        return _hostile()
    if args.channel:
        return _channel()
    if args.exact:
        return _exact_channels()
    if args.chain:
        return _chain(args.repeats)
    if args.phases:
        return _phases(args.repeats)

    ballast = _hold(args.hold_mb)  # noqa: F841 - held for the process's lifetime
    sb = Sandbox(workers=args.workers)
    python = default_python()
    sb.run_many([dict(source=PROGRAM)] * args.workers)  # warm up
    start = time.perf_counter()
    results = sb.run_many([dict(source=PROGRAM)] * args.n)
    elapsed = time.perf_counter() - start
    assert all(r.verdict is Verdict.OK for r in results), {r.verdict for r in results}

    other = None
    if args.baseline:
        env = {**os.environ, "PYTHONPATH": os.path.abspath(args.baseline)}
        other = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--serve", "--hold-mb", str(args.hold_mb)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        print(f"baseline isolation   {other.stdout.readline().strip()}  ({args.baseline})")

    def bare() -> tuple[float, float]:
        return _timed(lambda: subprocess.run([python, "-E", "-s", "-S", "-c", PROGRAM], capture_output=True,
                                             check=True))[:2]

    def ours() -> tuple[float, float]:
        wall, cpu, result = _timed(lambda: sb.run(PROGRAM))
        assert result.verdict is Verdict.OK, result
        return wall, cpu

    def theirs() -> tuple[float, float]:
        other.stdin.write("run\n")
        other.stdin.flush()
        wall, cpu = other.stdout.readline().split()
        return float(wall), float(cpu)

    timers = {"bare subprocess": bare, "sandbox (this tree)": ours}
    if other is not None:
        timers["sandbox (baseline)"] = theirs
    times: dict[str, list[float]] = {name: [] for name in timers}
    cpus: dict[str, list[float]] = {name: [] for name in timers}
    names = list(timers)
    load = os.getloadavg()
    for i in range(args.repeats):
        for name in names[i % len(names):] + names[:i % len(names)]:
            wall, cpu = timers[name]()
            times[name].append(wall)
            cpus[name].append(cpu)
    sb.close()
    if other is not None:
        other.stdin.close()
        other.wait()
    bare = times["bare subprocess"]
    print(f"isolation            {sb.isolation}  cgroups {'yes' if sb.cgroups else 'no'}  "
          f"seccomp {'yes' if sb.seccomp else 'no'}")
    print(f"workers              {args.workers}  (sandbox processes hold {args.hold_mb} MB)")
    print(f"throughput           {args.n / elapsed:8.1f} programs/s  ({args.n} trivial programs, this tree)")
    print(f"load average         {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} before the timed runs, "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} after")
    print(f"{'median per program':21s}{'wall ms':>8s} {'x bare (95% CI)':>20s} {'CPU ms':>8s} {'x bare (95% CI)':>20s}"
          f"   ({args.repeats} runs; CPU: own + children)")
    for name in names:
        line = f"{name:21s}"
        for series, base in ((times[name], bare), (cpus[name], cpus["bare subprocess"])):
            lo, hi = _ratio_ci(series, base)
            ratio = statistics.median(series) / statistics.median(base)
            line += f"{statistics.median(series) * 1000:8.1f} {ratio:7.2f}x ({lo:.2f}-{hi:.2f})  "
        print(line)
    if other is not None:
        ours, theirs = "sandbox (this tree)", "sandbox (baseline)"
        line = f"{'this tree / baseline':21s}"
        for series in (times, cpus):
            lo, hi = _ratio_ci(series[ours], series[theirs])
            line += f"{'':8s} {statistics.median(series[ours]) / statistics.median(series[theirs]):7.2f}x " \
                    f"({lo:.2f}-{hi:.2f})  "
        print(line)


if __name__ == "__main__":
    main()
