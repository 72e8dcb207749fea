"""Name lookup shared by the four registries (one error message format everywhere)."""

from __future__ import annotations

from collections.abc import Callable, Mapping


def lookup(registry: Mapping[str, Callable], kind: str, name: str) -> Callable:
    """Return `registry[name]`, or raise ValueError naming the valid choices."""
    try:
        return registry[name]
    except KeyError:
        valid = ", ".join(sorted(registry))
        raise ValueError(f"unknown {kind} {name!r}; valid: {valid}") from None
