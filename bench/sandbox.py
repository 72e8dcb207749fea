"""Sandbox throughput and per-program overhead.

    python bench/sandbox.py [--n 200] [--workers 2]

Prints trivial programs per second through ``Sandbox.run_many`` with ``--workers`` slots, and
the median wall time of one trivial program run sequentially in the sandbox versus a bare
``subprocess.run([python, "-c", ...])``; the difference is the per-program overhead.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time

from rlvr.rewards.sandbox import Sandbox, Verdict, default_python


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200, help="programs in the throughput run")
    parser.add_argument("--workers", type=int, default=2, help="sandbox slots")
    parser.add_argument("--repeats", type=int, default=30, help="sequential runs for the latency medians")
    args = parser.parse_args()

    sb = Sandbox(workers=args.workers)
    python = default_python()
    sb.run_many([dict(source="print(1)")] * args.workers)  # warm up
    start = time.perf_counter()
    results = sb.run_many([dict(source="print(1)")] * args.n)
    elapsed = time.perf_counter() - start
    assert all(r.verdict is Verdict.OK for r in results), {r.verdict for r in results}

    sandboxed, bare = [], []
    for _ in range(args.repeats):
        t = time.perf_counter()
        sb.run("print(1)")
        sandboxed.append(time.perf_counter() - t)
        t = time.perf_counter()
        subprocess.run([python, "-E", "-s", "-S", "-c", "print(1)"], capture_output=True, check=True)
        bare.append(time.perf_counter() - t)
    sb.close()
    s_med, b_med = statistics.median(sandboxed), statistics.median(bare)
    print(f"isolation            {sb.isolation}")
    print(f"workers              {args.workers}")
    print(f"throughput           {args.n / elapsed:8.1f} programs/s  ({args.n} trivial programs)")
    print(f"sandboxed, median    {s_med * 1000:8.1f} ms/program")
    print(f"bare subprocess      {b_med * 1000:8.1f} ms/program")
    print(f"overhead             {(s_med - b_med) * 1000:8.1f} ms/program")


if __name__ == "__main__":
    main()
