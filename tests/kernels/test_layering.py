"""Import rules: `kernels/` (the CPU fast path) takes a model as an argument and imports no
`rlvr.engines`, `rlvr.trainer` or `rlvr.models`; `models/` imports no `rlvr.engines`."""

import ast
from pathlib import Path

import pytest

import rlvr

PACKAGE = Path(rlvr.__file__).parent


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


@pytest.mark.parametrize("package,forbidden", [
    ("kernels", ("rlvr.engines", "rlvr.trainer", "rlvr.models")),
    ("models", ("rlvr.engines",)),
])
def test_package_imports(package, forbidden):
    for path in sorted((PACKAGE / package).rglob("*.py")):
        bad = [name for name in _imports(path) if name.startswith(forbidden)]
        assert not bad, f"{path.relative_to(PACKAGE)} imports {bad}"
