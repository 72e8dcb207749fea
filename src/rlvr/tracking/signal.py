"""A run that can learn nothing says so: `NoSignal` watches each step's metrics and warns once per
reason after `patience` steps in a row of it.

- ties: no group's rewards vary (`batch/kept_group_rate` 0 with dynamic sampling,
  `batch/zero_variance_group_frac` 1 without): every advantage is 0;
- zero gradient: `actor/grad_norm` 0, whatever the reason;
- all truncated: `response/truncation_rate` 1, no completion ends before `rollout.max_new_tokens`.

>>> watch = NoSignal(patience=2)
>>> watch.check({"batch/kept_group_rate": 0.0, "actor/grad_norm": 0.5})
[]
>>> [line.split(":")[0] for line in watch.check({"batch/kept_group_rate": 0.0, "actor/grad_norm": 0.5})]
['no group with varying rewards for 2 steps']
>>> watch.check({"batch/kept_group_rate": 0.0})  # once per reason
[]
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["NO_SIGNAL_STEPS", "NoSignal"]

NO_SIGNAL_STEPS = 10  # steps in a row before a warning (fewer in a shorter run: all of them)


def _ties(m: dict) -> bool:
    if "batch/kept_group_rate" in m:
        return m["batch/kept_group_rate"] == 0.0
    return m.get("batch/zero_variance_group_frac") == 1.0


REASONS: dict[str, tuple[Callable[[dict], bool], str]] = {
    "ties": (_ties, "no group with varying rewards for {n} steps: every completion of a prompt scores the same, "
                    "so every advantage is 0 and nothing trains; check that the reward separates completions "
                    "(reward/std), or raise rollout.temperature, rollout.group_size or the model's start accuracy "
                    "(a warm start: rlvr sft)"),
    "zero_grad": (lambda m: m.get("actor/grad_norm") == 0.0,
                  "the gradient has been 0 for {n} steps (actor/grad_norm): the weights do not move"),
    "truncated": (lambda m: m.get("response/truncation_rate") == 1.0,
                  "every completion ran to rollout.max_new_tokens for {n} steps (response/truncation_rate 1): "
                  "none ends on its own; raise rollout.max_new_tokens or check the prompt format"),
}


class NoSignal:
    def __init__(self, patience: int = NO_SIGNAL_STEPS, ignore: frozenset[str] = frozenset()):
        """`ignore`: reasons that do not stop this run learning (ties, for an objective that reads no
        advantages)."""
        self.patience = max(1, patience)
        self.runs = dict.fromkeys(REASONS, 0)  # steps in a row each reason has held
        self.warned: set[str] = set(ignore)

    def check(self, metrics: dict) -> list[str]:
        """The warnings this step's metrics complete (each reason once per run)."""
        out = []
        for name, (holds, text) in REASONS.items():
            self.runs[name] = self.runs[name] + 1 if holds(metrics) else 0
            if self.runs[name] >= self.patience and name not in self.warned:
                self.warned.add(name)
                out.append(text.format(n=self.runs[name]))
        return out
