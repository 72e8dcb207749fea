"""Plain data types that cross the loop's seams (no torch here)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Example:
    """One prompt with what its verifier needs to score a completion."""

    prompt: str
    answer: str
    meta: dict[str, Any] = field(default_factory=dict)
