"""`rlvr runs list|compare|plot`, `rlvr report RUN [RUN ...]`, `rlvr export RUN DIR`.

`cli.py` calls `register(sub)` once; each handler takes the parsed args and returns an exit code,
raising `ConfigError` for user mistakes (printed as one line, exit 2).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rlvr.errors import ConfigError
from rlvr.safe_io import atomic_write_text, check_output_file, kind_of
from rlvr.tracking.run_dir import check_output_path


def _metrics(args) -> list[str]:
    from rlvr.tracking.runs import DEFAULT_METRICS

    return list(dict.fromkeys(args.metric)) if args.metric else list(DEFAULT_METRICS)


def _check_metrics(runs, metrics: list[str]) -> None:
    logged = {k for r in runs for m in r.metrics for k in m}
    missing = [m for m in metrics if m not in logged]
    if missing:
        shown = ", ".join(sorted(k for k in logged if k != "step")[:12])
        raise ConfigError(f"--metric {missing[0]!r} is not logged by these runs; logged keys include: {shown}")


def cmd_runs_list(args) -> int:
    from rlvr.tracking.runs import find_runs

    runs = find_runs(args.paths)
    header = ["run", "status", "step", "seed", "heldout", "reward", "started", "git"]
    rows = []
    for run in runs:
        total = (run.config.get("trainer") or {}).get("steps")
        _, held = run.series("eval/heldout_accuracy")
        _, reward = run.series("reward/mean")
        sha = run.manifest.get("git_sha") or ""
        rows.append([str(run.path), str(run.manifest.get("status", "?")), f"{run.last_step}/{total}", str(run.seed),
                     f"{held[-1]:.3f}" if held else "-", f"{reward[-1]:.3f}" if reward else "-",
                     str(run.manifest.get("started", "-")),
                     sha[:8] + ("+dirty" if run.manifest.get("git_dirty") else "") if sha else "-"])
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
    for row in [header] + rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    return 0


def _groups(args):
    from rlvr.tracking.runs import find_runs, group_runs

    runs = find_runs(args.runs)
    metrics = _metrics(args)
    _check_metrics(runs, metrics)
    return runs, group_runs(runs), metrics


def cmd_runs_compare(args) -> int:
    from rlvr.tracking.plots import plot_groups
    from rlvr.tracking.runs import csv_table, markdown_table, summarize

    runs, groups, metrics = _groups(args)
    table = summarize(groups, metrics)
    markdown = markdown_table(groups, metrics, table)
    print(markdown, end="")
    if any(len(g.runs) < 2 for g in groups):
        print("note: groups with one run have no confidence interval; add seeds (seed=N) to get one")
    out = Path(args.out)
    check_output_path(out, "--out", reads=[r.path for r in runs])
    if kind_of(out) not in (None, "a directory"):
        raise ConfigError(f"--out: '{out}' is {kind_of(out)}; pass a folder (new or existing) for the comparison")
    files = [out / name for name in ("compare.md", "compare.csv", "curves.png")]
    for file in files:
        check_output_file(file, "--out")
    new = [file for file in files if not file.exists()]
    out.mkdir(parents=True, exist_ok=True)
    try:  # each file whole (temp + rename); a failure takes back the ones this command added
        atomic_write_text(files[0], markdown)
        atomic_write_text(files[1], csv_table(groups, metrics, table))
        plot = plot_groups(groups, metrics, files[2], window=args.smooth)
    except BaseException:
        for file in new:
            file.unlink(missing_ok=True)
        raise
    print(f"wrote {out / 'compare.md'}, {out / 'compare.csv'}, {plot}  ({len(runs)} runs, {len(groups)} groups)")
    return 0


def cmd_runs_plot(args) -> int:
    from rlvr.tracking.plots import plot_groups

    runs, groups, metrics = _groups(args)
    check_output_path(args.out, "--out", reads=[r.path for r in runs])
    if Path(args.out).is_dir():
        raise ConfigError(f"--out: '{args.out}' is a directory; pass a PNG path, e.g. {Path(args.out) / 'curves.png'}")
    check_output_file(args.out, "--out")
    path = plot_groups(groups, metrics, args.out, window=args.smooth)
    print(f"wrote {path}  ({len(runs)} runs, {len(groups)} groups)")
    return 0


def cmd_report(args) -> int:
    from rlvr.tracking.report import write_report
    from rlvr.tracking.report_runs import write_runs_report

    runs = list(dict.fromkeys(args.run))
    own = [Path(runs[0]) / "report.html"] if len(runs) == 1 else []
    if args.out:
        check_output_path(args.out, "--out", reads=runs, allowed=own)
    out = Path(args.out) if args.out else own[0] if own else Path(runs[0]).parent / "report.html"
    if not args.force and out not in own:
        _keep_users_file(out, "--out" if args.out else "report")
    if len(runs) == 1:
        path = write_report(runs[0], args.out, max_sample_steps=args.sample_steps)
    else:  # the default path, beside the first run, is in no run directory
        path = write_runs_report(runs, args.out)
    print(f"wrote {path}")
    return 0


def _keep_users_file(out: Path, option: str) -> None:
    """Refuse to write over a file at `out` that is not a page rlvr wrote (it carries `GENERATOR`)."""
    from rlvr.tracking.report import GENERATOR

    if kind_of(out) is not None:  # a link, folder, pipe or device: the writer refuses it with its own line
        return
    try:
        with out.open("rb") as f:
            head = f.read(4096)
    except (FileNotFoundError, NotADirectoryError):
        return  # nothing there to lose
    except OSError as e:
        raise ConfigError(f"{option}: cannot read '{out}' ({e.strerror}); choose another path with --out") from None
    if GENERATOR.encode() not in head:
        raise ConfigError(f"{option}: '{out}' exists and is not a report rlvr wrote; pass --out NEW.html, or "
                          f"--force to replace it")


def cmd_export(args) -> int:
    from rlvr.tracking.export import export_run

    result = export_run(args.run, args.dir, step=args.step, force=args.force, adapter=args.adapter, dtype=args.dtype)
    merge = result.merge
    kept = (f"; merged in float32, cast to {merge['dtype']}: {merge['changed'] - merge['lost']} of the "
            f"{merge['changed']} weights the adapter changes kept, update error {merge['update_error']:.3f}"
            if merge else "")
    print(f"exported {result.checkpoint} -> {result.path}{' (the adapter alone)' if args.adapter else ''} "
          f"(reload check: {'ok' if result.verified else 'skipped'}{kept})")
    return 0


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be >= 1")
    return value


def register(sub: argparse._SubParsersAction) -> None:
    """Add `runs`, `report` and `export` to the `rlvr` command line."""
    runs = sub.add_parser("runs", help="list, compare and plot run directories")
    runs_sub = runs.add_subparsers(dest="runs_command", required=True)

    ls = runs_sub.add_parser("list", help="one line per run: status, progress, latest accuracy")
    ls.add_argument("paths", nargs="*", default=["runs"], help="run directories or folders of runs (default: runs)")
    ls.set_defaults(fn=cmd_runs_list)

    metric_help = "metric key to compare (repeatable; default: eval/heldout_accuracy and reward/mean)"
    compare = runs_sub.add_parser("compare", help="group runs by recipe; mean ± 95%% CI over seeds; table + plot")
    compare.add_argument("runs", nargs="+", help="run directories or folders of runs")
    compare.add_argument("--metric", action="append", help=metric_help)
    compare.add_argument("--out", default="compare", help="folder for compare.md, compare.csv, curves.png")
    compare.add_argument("--smooth", type=_positive, default=1, help="moving-average window for the plot")
    compare.set_defaults(fn=cmd_runs_compare)

    plot = runs_sub.add_parser("plot", help="learning curves with 95%% CI bands over seeds (PNG)")
    plot.add_argument("runs", nargs="+", help="run directories or folders of runs")
    plot.add_argument("--metric", action="append", help=metric_help)
    plot.add_argument("--out", default="curves.png", help="PNG path")
    plot.add_argument("--smooth", type=_positive, default=1, help="moving-average window")
    plot.set_defaults(fn=cmd_runs_plot)

    report = sub.add_parser("report", help="one self-contained HTML page: curves, config, manifest, rollouts; "
                                           "several runs: side by side, curves overlaid")
    report.add_argument("run", nargs="+", help="run directory (several: one page comparing them)")
    report.add_argument("--out", help="HTML path (default: RUN/report.html; several runs: report.html beside the "
                                      "first)")
    report.add_argument("--force", action="store_true",
                        help="replace a file at the output path that rlvr did not write")
    report.add_argument("--sample-steps", type=_positive, default=40, help="most steps whose rollouts are shown")
    report.set_defaults(fn=cmd_report)

    export = sub.add_parser("export", help="write a plain Hugging Face model directory from a run's checkpoint")
    export.add_argument("run", help="run directory")
    export.add_argument("dir", help="output directory (must not exist, or be empty, unless --force)")
    export.add_argument("--step", type=int, help="checkpoint step (default: the newest)")
    export.add_argument("--force", action="store_true", help="replace DIR if it is an export rlvr made")
    export.add_argument("--adapter", action="store_true",
                        help="a LoRA run: write the adapter alone (PEFT format) instead of the merged model")
    export.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                        help="the merged model's dtype (auto: the run's); the merge itself runs in float32")
    export.set_defaults(fn=cmd_export)

