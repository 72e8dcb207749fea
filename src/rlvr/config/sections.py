"""Which config fields are sections: read from the schema's annotations (the loader, the
reference generator and the registries walk the dataclasses with it)."""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any


def section_type(annotation: Any) -> type | None:
    """The dataclass a field holds (also through `X | None`), or None for a leaf field."""
    if dataclasses.is_dataclass(annotation):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(annotation) if dataclasses.is_dataclass(a)]
        return inner[0] if inner else None
    return None
