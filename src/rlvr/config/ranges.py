"""Value ranges of config fields, declared once on the field in the schema and checked at load.

>>> in_range(0.5, "(0, 1]"), in_range(0, "> 0"), in_range(3, ">= 1"), in_range(-2.5, "finite")
(True, False, True, True)
>>> in_range(float("inf"), "> 0"), in_range(10**30, ">= 0"), in_range(float("nan"), "finite")
(False, False, False)
>>> range_of(dataclasses.fields(dataclasses.make_dataclass("C", [("s", str, choice("a", ("a", "b")))]))[0])
"one of 'a', 'b'"
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

__all__ = ["ranged", "choice", "range_of", "in_range", "allowed"]

_INTERVAL = re.compile(r"([\[(])\s*(-?[\d.e+-]+)\s*,\s*(-?[\d.e+-]+)\s*([\])])")
_BOUND = re.compile(r"(>=|>|<=|<)\s*(-?[\d.e+-]+)")
_INT_LIMIT = 2**63  # torch's and numpy's int64: a larger int overflows in the first tensor or generator it meets


def ranged(default: Any, rule: str, note: str = "") -> Any:
    """A dataclass field whose value, when not null, must satisfy ``rule``: ``> 0``, ``>= 1``,
    ``[0, 1]``, ``(0, 1]``, or ``finite`` (any real number); ``note`` says what the edge values mean (shown with
    the error). Every rule also refuses inf, NaN and ints outside int64 (they overflow below the schema)."""
    if rule != "finite" and _INTERVAL.fullmatch(rule) is None and _BOUND.fullmatch(rule) is None:
        raise ValueError(f"range {rule!r}: expected '> x', '>= x', '< x', '<= x', 'finite' or an interval "
                         "like '(0, 1]'")
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
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= _INT_LIMIT:
        return False
    if isinstance(value, float) and not math.isfinite(value):
        return False
    if rule == "finite":
        return True
    interval = _INTERVAL.fullmatch(rule)
    if interval:
        left, low, high, right = interval.groups()
        low_ok = value >= float(low) if left == "[" else value > float(low)
        return low_ok and (value <= float(high) if right == "]" else value < float(high))
    op, bound = _BOUND.fullmatch(rule).groups()
    return {">=": value >= float(bound), ">": value > float(bound), "<=": value <= float(bound),
            "<": value < float(bound)}[op]
