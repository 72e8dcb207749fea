"""Progress display: a tqdm bar on a terminal, plain periodic lines otherwise (CI, pipes)."""

from __future__ import annotations

import sys

from tqdm import tqdm

# What the bar shows: reward and accuracy over every completion generated (TRL's `reward`), and with a
# group filter (dynamic sampling) the reward of the groups kept for training beside them.
ALL_REWARD, ALL_ACCURACY = "reward/generated_mean", "reward/generated_accuracy"
AVERAGED = (ALL_REWARD, ALL_ACCURACY, "reward/mean", "reward/accuracy", "perf/rollout_tokens_per_s")


def _summary(metrics: dict) -> dict[str, str]:
    kept = metrics.get("reward/mean") if "batch/kept_group_rate" in metrics else None
    shown = {"reward": metrics.get(ALL_REWARD, metrics.get("reward/mean")), "kept": kept,
             "acc": metrics.get(ALL_ACCURACY, metrics.get("reward/accuracy")),
             "heldout": metrics.get("eval/heldout_accuracy"), "tok/s": metrics.get("perf/rollout_tokens_per_s")}
    return {k: (f"{v:.0f}" if k == "tok/s" else f"{v:.3f}") for k, v in shown.items() if v is not None}


class Progress:
    def __init__(self, *, total: int, initial: int = 0, echo=print, every: int = 25):
        self.echo, self.every, self.total = echo, every, total
        self.bar = tqdm(total=total, initial=initial, dynamic_ncols=True) if sys.stderr.isatty() else None
        self.last_heldout = None
        self.window: list[dict] = []  # the steps since the last printed line

    def update(self, step: int, metrics: dict) -> None:
        """The bar shows this step's own reward and accuracy (over every generated completion, the
        kept groups' reward beside); a plain line, their means over the steps since the previous
        line (a step's reward, over a few prompts, is noisy), and says so."""
        if "eval/heldout_accuracy" in metrics:
            self.last_heldout = metrics["eval/heldout_accuracy"]
        self.window = (self.window + [metrics])[-self.every:]
        if self.bar is not None:
            shown = dict(metrics)
        else:
            shown = {**metrics, **{k: sum(m.get(k, 0.0) for m in self.window) / len(self.window)
                                   for k in AVERAGED if k in metrics}}
        if self.last_heldout is not None:
            shown["eval/heldout_accuracy"] = self.last_heldout
        summary = _summary(shown)
        if self.bar is not None:
            self.bar.set_postfix(summary, refresh=False)
            self.bar.update(1)
        elif step % self.every == 0 or step == self.total or "eval/heldout_accuracy" in metrics:
            first = step - len(self.window) + 1
            means = ", ".join(k for k in summary if k != "heldout")
            span = f" ({means}: mean of steps {first}-{step})" if first < step else ""
            self.echo(f"step {step}/{self.total} " + " ".join(f"{k}={v}" for k, v in summary.items()) + span)
            self.window = []

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
