"""Monte-Carlo calibration of a sampler's predicted pass rates.

The posterior samplers (MoPPS, VADE) and DOTS act on a predicted success rate per prompt. Their
own `sampler/calibration_spearman` ranks a step's predictions against that step's G verdicts,
an estimate so noisy at G = 16 that a perfect predictor scores well below ρ = 1. Here every
`every` steps a probe of up to `prompts` of the step's prompts is rolled out `rollouts` more
times with the same policy and seeds of their own; those completions train nothing and are
never shown to the sampler (held out from both), so the solved fraction is an independent
Monte-Carlo estimate of each prompt's pass rate, against which the sampler's prediction for it
(its state after the step's verdicts, what its next proposal acts on) is scored.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rlvr.sampling.selection import spearman


@dataclass(frozen=True)
class Calibration:
    """How often and how large the Monte-Carlo probe is."""

    every: int     # steps between probes (a probe at every step s with s % every == 0)
    prompts: int   # most distinct prompts of the step probed
    rollouts: int  # Monte-Carlo completions per probed prompt


def mc_pass_rates(correct: list[float], scorable: list[bool], rollouts: int) -> list[float]:
    """(n,) solved fraction of each prompt's `rollouts` consecutive completions, over the scorable
    ones (NaN where none is scorable). `correct`, `scorable`: (n · rollouts,) flattened."""
    out = []
    for i in range(0, len(correct), rollouts):
        ok = [c for c, s in zip(correct[i:i + rollouts], scorable[i:i + rollouts]) if s]
        out.append(sum(ok) / len(ok) if ok else math.nan)
    return out


def calibration_metrics(predicted: list[float], estimated: list[float], *,
                        rollouts: int) -> tuple[float, dict[str, float]]:
    """How well `predicted` (n,) pass rates match Monte-Carlo `estimated` ones (n,), prompts with
    no estimate (NaN) left out. Returns (Spearman ρ, NaN when either side is constant, and
    metrics): ρ, the mean absolute error, the bias (mean of predicted − estimated), and the
    error floor a perfect predictor would still show from the estimate's own noise,
    mean √(p̂(1 − p̂)/rollouts) (the mean standard error of the estimates)."""
    pairs = [(p, e) for p, e in zip(predicted, estimated) if not math.isnan(e)]
    if not pairs:
        return math.nan, {"sampler/calibration_prompts": 0.0}
    pred, est = [p for p, _ in pairs], [e for _, e in pairs]
    rho = spearman(pred, est) if len(pairs) > 1 else None
    rho = math.nan if rho is None else rho
    n = len(pairs)
    metrics = {"sampler/calibration_prompts": float(n),
               "sampler/calibration_mae": sum(abs(p - e) for p, e in pairs) / n,
               "sampler/calibration_bias": sum(p - e for p, e in pairs) / n,
               "sampler/calibration_mc_stderr": sum(math.sqrt(e * (1 - e) / rollouts) for e in est) / n}
    if not math.isnan(rho):
        metrics["sampler/calibration_mc_spearman"] = rho
    return rho, metrics
