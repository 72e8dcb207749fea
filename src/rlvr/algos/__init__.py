"""The pure math of the RL loop: four registries of torch functions, chosen by name.

- `advantages.ADVANTAGES`: rewards -> token advantages (B, T)
- `objectives.OBJECTIVES`: per-token policy loss (B, T) from log-probs and advantages
- `aggregate.AGGREGATIONS`: per-token loss -> this micro-batch's share of the step's scalar loss
- `kl.KL_ESTIMATORS`: per-token KL estimate (B, T) against a reference policy

Beside them, plain functions: `value.value_loss` (critic), `shaping` (DAPO overlong penalty and
zero-variance groups), `entropy.token_entropy`, `correction.importance_correction` (rollout vs
trainer log-prob mismatch), `kl.adaptive_kl_coef`, `returns.gae_returns` (critic targets).

Everything here imports only torch and the standard library (a test checks it). Functions take
plain tensors and keyword hyperparameters; the trainer holds one flat namespace of
hyperparameters and hands each function only the names it declares (`call_with_hparams`), so a
name means the same thing everywhere it appears. `docs/papers.md` lists every method, its paper
and its deviations.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from functools import lru_cache
from typing import Any

__all__ = ["call_with_hparams", "keyword_params"]


@lru_cache(maxsize=None)
def _keyword_only(fn: Callable) -> frozenset[str]:
    params = inspect.signature(fn).parameters.values()
    return frozenset(p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY)


def keyword_params(fn: Callable) -> frozenset[str]:
    """Names of `fn`'s keyword-only parameters: the hyperparameters it accepts."""
    return _keyword_only(fn)


def call_with_hparams(fn: Callable, *args: Any, hparams: dict[str, Any], **kwargs: Any) -> Any:
    """Call `fn(*args, **kwargs, **selected)` where `selected` holds the entries of `hparams`
    whose keys are keyword-only parameters of `fn`; other keys are ignored.

    Explicit `kwargs` (data such as `old_logp=` or counts) win over `hparams` on a name clash, so
    the caller can override one value for one call without copying the namespace.
    """
    accepted = _keyword_only(fn)
    selected = {k: v for k, v in hparams.items() if k in accepted and k not in kwargs}
    return fn(*args, **kwargs, **selected)
