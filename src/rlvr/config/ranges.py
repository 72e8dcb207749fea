"""Value ranges of config fields, declared once on the field in the schema and checked at load.

>>> in_range(0.5, "(0, 1]"), in_range(0, "> 0"), in_range(3, ">= 1")
(True, False, True)
>>> range_of(dataclasses.fields(dataclasses.make_dataclass("C", [("s", str, choice("a", ("a", "b")))]))[0])
"one of 'a', 'b'"
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

__all__ = ["ranged", "choice", "range_of", "in_range", "allowed"]

_INTERVAL = re.compile(r"([\[(])\s*(-?[\d.e+-]+)\s*,\s*(-?[\d.e+-]+)\s*([\])])")
_BOUND = re.compile(r"(>=|>|<=|<)\s*(-?[\d.e+-]+)")


def ranged(default: Any, rule: str, note: str = "") -> Any:
    """A dataclass field whose value, when not null, must satisfy ``rule``: ``> 0``, ``>= 1``,
    ``[0, 1]``, ``(0, 1]``; ``note`` says what the edge values mean (shown with the error)."""
    if _INTERVAL.fullmatch(rule) is None and _BOUND.fullmatch(rule) is None:
        raise ValueError(f"range {rule!r}: expected '> x', '>= x', '< x', '<= x' or an interval like '(0, 1]'")
    return dataclasses.field(default=default, metadata={"range": rule, "note": note})


def choice(default: str, options: tuple[str, ...], note: str = "") -> Any:
    """A dataclass field whose value must be one of ``options`` (a fixed set; a set that grows with
    the code is a registry instead)."""
    if default not in options:
        raise ValueError(f"default {default!r} is not one of {options}")
    return dataclasses.field(default=default, metadata={"choices": tuple(options), "note": note})


def range_of(f: dataclasses.Field) -> str | None:
    """The field's rule with its note, e.g. ``>= 0 (0 = off)`` or ``one of 'eager', 'cpp'``, or None."""
    if "choices" in f.metadata:
        rule = "one of " + ", ".join(repr(c) for c in f.metadata["choices"])
    else:
        rule = f.metadata.get("range")
    return None if rule is None else f"{rule} ({f.metadata['note']})" if f.metadata.get("note") else rule


def allowed(f: dataclasses.Field, value: Any) -> bool:
    """Whether ``value`` (not null) satisfies the field's declared range or choices."""
    if "choices" in f.metadata:
        return value in f.metadata["choices"]
    return "range" not in f.metadata or in_range(value, f.metadata["range"])


def in_range(value: float, rule: str) -> bool:
    interval = _INTERVAL.fullmatch(rule)
    if interval:
        left, low, high, right = interval.groups()
        low_ok = value >= float(low) if left == "[" else value > float(low)
        return low_ok and (value <= float(high) if right == "]" else value < float(high))
    op, bound = _BOUND.fullmatch(rule).groups()
    return {">=": value >= float(bound), ">": value > float(bound), "<=": value <= float(bound),
            "<": value < float(bound)}[op]
