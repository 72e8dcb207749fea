"""Sandbox throughput and per-program cost against a bare subprocess, optionally against another
checkout's sandbox, interleaved.

    python bench/sandbox.py [--n 200] [--workers 2] [--repeats 30] [--baseline OTHER_CHECKOUT/src]
                            [--hold-mb 0]
    python bench/sandbox.py --hostile     # every program of tests/rewards/test_hostile.py, alone


Prints trivial programs per second through ``Sandbox.run_many`` with ``--workers`` slots, and
the median wall time of one trivial program run sequentially in the sandbox versus a bare
``subprocess.run([python, "-E", "-s", "-S", "-c", ...])``. With ``--baseline``, a second process
imports ``rlvr`` from that source tree and times the same program in its sandbox; the three are
run in turn, one of each per repeat (the order rotating), so machine load hits them alike.
``--hold-mb`` makes both sandboxes' processes hold that much touched memory first, as a trainer
does (starting a process costs more from a large parent unless it is started by ``vfork``).
``--hostile`` prints each hostile program's verdict, wall time and its cgroup's peak memory.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

from rlvr.rewards.sandbox import Sandbox, Verdict, default_python

PROGRAM = "print(1)"


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
        t = time.perf_counter()
        result = sb.run(PROGRAM)
        print(time.perf_counter() - t if result.verdict is Verdict.OK else "nan", flush=True)
    sb.close()


def _hostile() -> None:
    """Each program of the hostile suite alone, with the suite's limits: verdict, time, peak memory."""
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[1] / "tests" / "rewards" / "test_hostile.py"
    spec = importlib.util.spec_from_file_location("hostile", path)
    suite = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(suite)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200, help="programs in the throughput run")
    parser.add_argument("--workers", type=int, default=2, help="sandbox slots")
    parser.add_argument("--repeats", type=int, default=30, help="sequential runs for the latency medians")
    parser.add_argument("--baseline", help="another checkout's src/ directory to time side by side")
    parser.add_argument("--hold-mb", type=int, default=0, help="memory both sandboxes' processes hold first")
    parser.add_argument("--hostile", action="store_true", help="run the hostile suite's programs, one by one")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        return _serve(args.hold_mb)
    if args.hostile:
        return _hostile()

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

    def bare() -> float:
        t = time.perf_counter()
        subprocess.run([python, "-E", "-s", "-S", "-c", PROGRAM], capture_output=True, check=True)
        return time.perf_counter() - t

    def ours() -> float:
        t = time.perf_counter()
        assert sb.run(PROGRAM).verdict is Verdict.OK
        return time.perf_counter() - t

    def theirs() -> float:
        other.stdin.write("run\n")
        other.stdin.flush()
        return float(other.stdout.readline())

    timers = {"bare subprocess": bare, "sandbox (this tree)": ours}
    if other is not None:
        timers["sandbox (baseline)"] = theirs
    times: dict[str, list[float]] = {name: [] for name in timers}
    names = list(timers)
    for i in range(args.repeats):
        for name in names[i % len(names):] + names[:i % len(names)]:
            times[name].append(timers[name]())
    sb.close()
    if other is not None:
        other.stdin.close()
        other.wait()
    bare_med = statistics.median(times["bare subprocess"])
    print(f"isolation            {sb.isolation}  cgroups {'yes' if sb.cgroups else 'no'}  "
          f"seccomp {'yes' if sb.seccomp else 'no'}")
    print(f"workers              {args.workers}  (sandbox processes hold {args.hold_mb} MB)")
    print(f"throughput           {args.n / elapsed:8.1f} programs/s  ({args.n} trivial programs, this tree)")
    for name, values in times.items():
        med = statistics.median(values)
        print(f"{name:21s}{med * 1000:8.1f} ms/program median  ({med / bare_med:4.2f}x bare, {args.repeats} runs)")


if __name__ == "__main__":
    main()
