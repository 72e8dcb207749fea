"""Recipes shipped in the package (`rlvr/recipes/*.yaml`, the repository's `recipes/`), chosen by name.

`rlvr train grpo_countdown` reads the packaged `grpo_countdown.yaml`; a path that exists is read as
it is, and `recipes/NAME.yaml` outside a checkout falls back to the packaged recipe of that name.
`rlvr recipes` lists them with the first line of each one's header comment.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

__all__ = ["packaged_recipe", "packaged_recipes"]


def packaged_recipes() -> dict[str, Path]:
    """Name -> path of every recipe the package ships, sorted by name."""
    folder = Path(str(resources.files("rlvr") / "recipes"))
    return {p.stem: p for p in sorted(folder.glob("*.yaml"))} if folder.is_dir() else {}


def packaged_recipe(spec: str | Path) -> Path | None:
    """The packaged recipe `spec` names: `NAME`, `NAME.yaml` or `recipes/NAME.yaml`; None otherwise."""
    path = Path(spec)
    if path.parent not in (Path("."), Path("recipes")) or path.suffix not in ("", ".yaml"):
        return None
    return packaged_recipes().get(path.stem if path.suffix else path.name)


def summary(path: Path) -> str:
    """The first line of a recipe's header comment."""
    for line in path.read_text().splitlines():
        if line.startswith("#"):
            return line.lstrip("# ").strip()
        if line.strip():
            break
    return ""
