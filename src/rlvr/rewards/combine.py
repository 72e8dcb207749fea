"""Combine several rewards: weighted sum, and per-reward group normalisation before summing.

Shapes: every reward is a list of B = P·G floats, grouped as P consecutive blocks of G
completions of the same prompt. ``nan`` marks a not-scorable sample (a reward that returned
``None`` or raised).

- ``weighted_sum(components, weights)``: Σ_k w_k·r_k per sample. A sample whose component
  with non-zero weight is ``nan`` is ``nan`` (not scorable) unless ``nan_as`` is given.
- ``group_normalize(values, group_size)``: (r − mean_g) / (std_g + eps) within each group,
  ignoring ``nan`` (Bessel-corrected std, as rlvr's GRPO advantage; a group with fewer than two
  scorable values has std 0 and gets 0); ``nan`` stays ``nan``.
- ``decoupled_normalize(components, weights, group_size)``: GDPO / LightningRL's
  "decoupled normalisation": normalise each reward within its group first, then sum with the
  weights, then (``batch_norm``) standardise the sum over the whole batch (Bessel std again).
  Summing raw rewards
  first lets a high-variance reward drown the others and collapses distinct reward
  combinations onto the same advantage; normalising each first keeps them apart. The result
  is an **advantage**, not a reward: feed it to the update as is.

>>> weighted_sum({"acc": [1.0, 0.0], "fmt": [1.0, 1.0]}, {"acc": 1.0, "fmt": 0.5})
[1.5, 0.5]
"""

from __future__ import annotations

import math

__all__ = ["weighted_sum", "group_normalize", "decoupled_normalize"]


def _check(components: dict[str, list[float]], weights: dict[str, float]) -> int:
    unknown = set(weights) - set(components)
    if unknown:
        raise ValueError(f"weights for unknown rewards {sorted(unknown)}; rewards: {sorted(components)}")
    sizes = {len(v) for v in components.values()}
    if len(sizes) > 1:
        raise ValueError(f"rewards have different lengths {sorted(sizes)}")
    return sizes.pop() if sizes else 0


def weighted_sum(components: dict[str, list[float]], weights: dict[str, float] | None = None,
                 *, nan_as: float | None = None) -> list[float]:
    """Σ_k w_k·r_k per sample (missing weights are 1.0)."""
    weights = weights or {}
    n = _check(components, weights)
    out = []
    for i in range(n):
        total = 0.0
        for name, values in components.items():
            w = weights.get(name, 1.0)
            if w == 0:
                continue
            v = values[i]
            if v is None or math.isnan(v):
                if nan_as is None:
                    total = math.nan
                    break
                v = nan_as
            total += w * v
        out.append(total)
    return out


def _bessel_std(values: list[float], mean: float) -> float:
    """Sample std with Bessel's correction (n - 1), 0 for fewer than two values."""
    if len(values) < 2:
        return 0.0
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def group_normalize(values: list[float], group_size: int, *, eps: float = 1e-6, std: bool = True) -> list[float]:
    """(r − group mean) / (group std + eps), nan-aware; ``std=False`` only centres.

    >>> group_normalize([1.0, 0.0, 1.0, 0.0], 2)
    [0.707105781188, -0.707105781188, 0.707105781188, -0.707105781188]
    >>> group_normalize([1.0, float("nan"), 3.0, 3.0], 2)[:2]
    [0.0, nan]
    """
    if group_size < 1 or len(values) % group_size:
        raise ValueError(f"{len(values)} values do not split into groups of {group_size}")
    out = []
    for g in range(0, len(values), group_size):
        block = values[g:g + group_size]
        ok = [v for v in block if v is not None and not math.isnan(v)]
        mean = sum(ok) / len(ok) if ok else 0.0
        sd = _bessel_std(ok, mean)
        for v in block:
            if v is None or math.isnan(v):
                out.append(math.nan)
            else:
                out.append((round((v - mean) / (sd + eps), 12) if sd + eps > 0 else 0.0) if std else v - mean)
    return out


def decoupled_normalize(components: dict[str, list[float]], weights: dict[str, float] | None, group_size: int,
                        *, eps: float = 1e-6, batch_norm: bool = True) -> list[float]:
    """Σ_k w_k · group_normalize(r_k), then optionally standardised over the batch (nan-aware)."""
    weights = weights or {}
    _check(components, weights)
    normed = {k: group_normalize(v, group_size, eps=eps) for k, v in components.items()}
    total = weighted_sum(normed, weights)
    if not batch_norm:
        return total
    ok = [v for v in total if not math.isnan(v)]
    if not ok:
        return total
    mean = sum(ok) / len(ok)
    sd = _bessel_std(ok, mean)
    return [v if math.isnan(v) else (round((v - mean) / (sd + eps), 12) if sd + eps > 0 else 0.0) for v in total]
