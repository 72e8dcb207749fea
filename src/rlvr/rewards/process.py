"""Process rewards: split a completion into steps, and turn per-step scores into rewards.

- `split_steps(text, separator=, tag=)`: the steps of a completion, split at a separator (blank
  lines by default) or ended by a step tag (Math-Shepherd's ``ки``); empty steps dropped.
- `step_rewards(scores, how)`: dense per-step rewards (K,) for the turn-level advantages.
  ``raw``: the scores; ``clipped``: min(s_k − η, 0) (Clipping: no step earns more than 0, so a
  policy cannot gain by writing more steps); ``delta``: s_k − s_{k+1}, the last s_K (Delta: the
  return from step k telescopes to s_k, whatever the number of steps after it).
- `process_reward(scores, how)`: one reward per completion: ``min`` (the weakest step),
  ``last``, ``mean``, or the sum of the ``clipped`` / ``delta`` step rewards (the return from the
  first step). No step (an empty completion) is not scorable: ``None``.

References: Gao et al. 2024, "On Designing Effective RL Reward at Training Time for LLM
Reasoning" (arXiv:2410.15115), for the Clipping and Delta refinements against reward hacking;
Cheng et al. 2025, "Stop Summation" (PURE, arXiv:2504.15275), for min-form credit (``min``).

>>> split_steps("a=1\\n\\nb=2\\n\\n")
['a=1', 'b=2']
>>> process_reward([0.9, 0.2, 0.7], "min"), process_reward([0.9, 0.2, 0.7], "delta")
(0.2, 0.9)
"""

from __future__ import annotations

__all__ = ["AGGREGATIONS", "DENSE", "process_reward", "split_steps", "step_rewards"]

DENSE = ("raw", "clipped", "delta")
AGGREGATIONS = ("min", "last", "mean", "clipped", "delta")


def split_steps(text: str, *, separator: str = "\n\n", tag: str | None = None) -> list[str]:
    """The non-empty steps of `text`: ended by `tag` when given (text after the last tag is a
    step of its own), else split at `separator`; each step stripped of surrounding whitespace."""
    parts = text.split(tag) if tag else text.split(separator)
    return [p.strip() for p in parts if p.strip()]


def step_rewards(scores: list[float], how: str = "raw", *, threshold: float = 0.0) -> list[float]:
    """Dense rewards (K,) from K step scores; see the module doc (`threshold` is the clip's η)."""
    if how not in DENSE:
        raise ValueError(f"unknown step reward {how!r}; choose one of {', '.join(DENSE)}")
    s = [float(v) for v in scores]
    if how == "clipped":
        return [min(v - threshold, 0.0) for v in s]
    if how == "delta":
        return [a - b for a, b in zip(s, s[1:])] + s[-1:]
    return s


def process_reward(scores: list[float], how: str = "min", *, threshold: float = 0.0) -> float | None:
    """One reward from K step scores (None when K = 0); see the module doc."""
    if how not in AGGREGATIONS:
        raise ValueError(f"unknown process aggregation {how!r}; choose one of {', '.join(AGGREGATIONS)}")
    if not scores:
        return None
    s = [float(v) for v in scores]
    if how == "min":
        return min(s)
    if how == "last":
        return s[-1]
    if how == "mean":
        return sum(s) / len(s)
    return round(sum(step_rewards(s, how, threshold=threshold)), 12)
