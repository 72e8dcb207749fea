"""Reading run directories back and comparing them across seeds (openrlbenchmark-style, offline).

A *group* is a set of runs whose resolved configs are equal except for `IGNORED_KEYS` (the seed
and where/how the run was stored). Per run we take each metric's final value and its normalised
area under the curve; per group, mean ± Student-t 95% CI over the runs (= over seeds).
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from rlvr.errors import ConfigError
from rlvr.tracking.run_files import read_config, read_manifest, read_records, warn
from rlvr.tracking.stats import clipped_interval, mean_ci, metric_bounds, normalized_auc

# Config keys that do not change what a run computes, so runs differing only here are seeds of
# one recipe. `trainer.trackers` only chooses where metrics are mirrored.
IGNORED_KEYS = ("seed", "trainer.out_dir", "trainer.name", "trainer.trackers")
DEFAULT_METRICS = ("eval/heldout_accuracy", "reward/mean")


@dataclass
class Run:
    path: Path
    config: dict
    manifest: dict
    metrics: list[dict] = field(repr=False)

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def seed(self):
        return self.config.get("seed", self.manifest.get("seed"))

    @property
    def last_step(self) -> int:
        return max((m.get("step", 0) for m in self.metrics), default=0)

    def series(self, metric: str) -> tuple[list[int], list[float]]:
        """(steps, values) of the lines that carry `metric` (eval metrics appear every N steps)."""
        points = [(m["step"], float(m[metric])) for m in self.metrics
                  if metric in m and m[metric] is not None and "step" in m]
        return [s for s, _ in points], [v for _, v in points]


def load_run(path: str | Path) -> Run:
    """A run folder as the comparison tools read it: damage to run.json or a metrics line is a
    warning naming the file and line (the rest of the run still counts), a bad config.yaml an error."""
    path = Path(path)
    return Run(path=path, config=read_config(path), manifest=read_manifest(path, tolerant=True),
               metrics=read_records(path / "metrics.jsonl", numeric=True))


def find_runs(paths: list[str | Path]) -> list[Run]:
    """Runs named directly, or found (recursively) under the given folders; sorted by path. A run
    found under a folder whose config.yaml is damaged is skipped with a warning (the others are
    still listed); one named directly is an error."""
    found: dict[Path, bool] = {}  # run -> named directly
    for given in paths:
        given = Path(given)
        if not given.exists():
            raise ConfigError(f"'{given}' does not exist; pass run directories or a folder of runs")
        if (given / "config.yaml").is_file():
            found[given] = True
            continue
        for config in sorted(given.rglob("config.yaml")):
            if "checkpoints" not in config.parent.parts:  # checkpoints hold HF files, never a config.yaml of ours
                found.setdefault(config.parent, False)
    if not found:
        raise ConfigError(f"no run directories (with config.yaml) under {', '.join(map(str, paths))}")
    runs = []
    for path, named in found.items():
        try:
            runs.append(load_run(path))
        except ConfigError as err:
            if named:
                raise
            warn(f"{err}; that run is skipped")
    if not runs:
        raise ConfigError(f"no readable run under {', '.join(map(str, paths))} (see the warnings above)")
    return runs


def flatten(tree: dict, prefix: str = "") -> dict:
    """{'a': {'b': 1}} -> {'a.b': 1}."""
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def recipe_key(run: Run) -> str:
    """The config with seed and storage keys removed, as a canonical string."""
    flat = {k: v for k, v in flatten(run.config).items() if k not in IGNORED_KEYS}
    return json.dumps(flat, sort_keys=True, default=str)


@dataclass
class Group:
    label: str
    runs: list[Run]

    @property
    def seeds(self) -> list:
        return [r.seed for r in self.runs]


def group_runs(runs: list[Run]) -> list[Group]:
    """Group runs by recipe; each group is labelled by the config keys in which groups differ,
    leaving out keys that only follow a choice (a clip width GSPO brings when left null) and
    naming a key by its last part where that is unambiguous (`objective=gspo, lr=0.0003`)."""
    by_key: dict[str, list[Run]] = {}
    for run in runs:
        by_key.setdefault(recipe_key(run), []).append(run)
    flats = {key: json.loads(key) for key in by_key}
    all_keys = {k for f in flats.values() for k in f}
    differing = sorted(k for k in all_keys if len({json.dumps(f.get(k)) for f in flats.values()}) > 1)
    shown = [k for k in differing if not all(_implied(members[0].config, k) for members in by_key.values())]
    leaves = [k.rsplit(".", 1)[-1] for k in shown]
    names = {k: leaf if leaves.count(leaf) == 1 else k for k, leaf in zip(shown, leaves)}
    groups = []
    for key, members in by_key.items():
        label = ", ".join(f"{names[k]}={flats[key].get(k)}" for k in shown)
        groups.append(Group(label=label or _common_name(members), runs=sorted(members, key=lambda r: str(r.seed))))
    if len({g.label for g in groups}) < len(groups):  # never merge groups by shortening: full keys then
        for group, key in zip(groups, by_key):
            group.label = ", ".join(f"{k}={flats[key].get(k)}" for k in differing) or group.label
    return groups


def _implied(config: dict, key: str) -> bool:
    """Whether `key` of a run's config holds what resolving the config gives it when left null
    (the default a chosen entry brings), so a label need not repeat it."""
    from rlvr.config import load_config, to_dict

    tree = json.loads(json.dumps(config, default=str))
    *parents, leaf = key.split(".")
    node = tree
    for part in parents:
        node = node.get(part) if isinstance(node, dict) else None
    if not isinstance(node, dict) or leaf not in node:
        return False
    node[leaf] = None
    try:
        resolved = flatten(to_dict(load_config(tree)))
    except ConfigError:
        return False
    return resolved.get(key) == flatten(config).get(key)


def _common_name(runs: list[Run]) -> str:
    """A name for a lone group: the run names with a trailing `_s<seed>` / `-N` removed."""
    import re

    names = {re.sub(r"(_s\d+)?(-\d+)?$", "", r.name) for r in runs}
    return names.pop() if len(names) == 1 else "all runs"


@dataclass
class Cell:
    """One metric statistic of one group: per-run values and their mean ± CI."""

    values: list[float]
    mean: float
    half_width: float
    bounds: tuple[float, float] | None = None  # (0, 1) for an accuracy: the interval is clipped to it

    @property
    def interval(self) -> tuple[float, float]:
        return clipped_interval(self.mean, self.half_width, self.bounds)

    def text(self, digits: int = 3) -> str:
        if math.isnan(self.mean):
            return "n/a"
        if math.isnan(self.half_width):
            return f"{self.mean:.{digits}f}"
        low, high = self.interval
        if (low, high) != (self.mean - self.half_width, self.mean + self.half_width):  # clipped: not symmetric
            return f"{self.mean:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"
        return f"{self.mean:.{digits}f} ± {self.half_width:.{digits}f}"


def run_stat(run: Run, metric: str, stat: str) -> float:
    steps, values = run.series(metric)
    if not values:
        return math.nan
    return values[-1] if stat == "final" else normalized_auc(steps, values)


def summarize(groups: list[Group], metrics: list[str], confidence: float = 0.95) -> dict[tuple[str, str, str], Cell]:
    """{(group label, metric, 'final'|'auc'): Cell}; runs lacking the metric are left out of its cell."""
    table = {}
    for group in groups:
        for metric in metrics:
            for stat in ("final", "auc"):
                values = [v for v in (run_stat(r, metric, stat) for r in group.runs) if not math.isnan(v)]
                table[(group.label, metric, stat)] = Cell(values, *mean_ci(values, confidence), metric_bounds(metric))
    return table


def markdown_table(groups: list[Group], metrics: list[str], table: dict) -> str:
    header = ["recipe", "seeds", "steps"] + [f"{m} ({s})" for m in metrics for s in ("final", "auc")]
    rows = []
    for g in groups:
        steps = sorted({r.last_step for r in g.runs})
        rows.append([g.label, str(len(g.runs)), "/".join(map(str, steps))]
                    + [table[(g.label, m, s)].text() for m in metrics for s in ("final", "auc")])
    escape = lambda cell: cell.replace("|", "\\|")  # noqa: E731
    lines = ["| " + " | ".join(map(escape, header)) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(map(escape, row)) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def csv_table(groups: list[Group], metrics: list[str], table: dict, confidence: float = 0.95) -> str:
    """Long format: one row per (group, metric, statistic), with the per-seed values."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["recipe", "metric", "statistic", "n", "mean", f"ci{round(confidence * 100)}_low",
                     f"ci{round(confidence * 100)}_high", "values", "seeds", "runs"])
    for g in groups:
        for m in metrics:
            for s in ("final", "auc"):
                cell = table[(g.label, m, s)]
                writer.writerow([g.label, m, s, len(cell.values), _num(cell.mean),
                                 *(_num(end) for end in cell.interval),
                                 " ".join(_num(v) for v in cell.values), " ".join(map(str, g.seeds)),
                                 " ".join(str(r.path) for r in g.runs)])
    return out.getvalue()


def _num(value: float) -> str:
    return "" if math.isnan(value) else repr(float(value))


def aligned_curves(group: Group, metric: str) -> tuple[list[int], list[list[float]]]:
    """Steps present in every run of the group that logged `metric`, and each run's values there."""
    series = [r.series(metric) for r in group.runs]
    series = [(s, v) for s, v in series if s]
    if not series:
        return [], []
    common = sorted(set(series[0][0]).intersection(*(set(s) for s, _ in series[1:])))
    per_run = [[dict(zip(s, v))[step] for step in common] for s, v in series]
    return common, per_run
