"""Package-level rules: torch-only imports, module headers, documented hyperparameters."""

import ast
import pathlib
import sys

import pytest

import rlvr.algos as algos

ALGOS_DIR = pathlib.Path(algos.__file__).parent
ALLOWED_THIRD_PARTY = {"torch"}


def _modules():
    return sorted(ALGOS_DIR.glob("*.py"))


@pytest.mark.parametrize("path", _modules(), ids=lambda p: p.name)
def test_algos_imports_only_torch_and_stdlib(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level > 0:
                continue
            names = [node.module or ""]
        else:
            continue
        for name in names:
            top = name.split(".")[0]
            ok = top in sys.stdlib_module_names or top in ALLOWED_THIRD_PARTY or name.startswith("rlvr.algos")
            assert ok, f"{path.name} imports {name}"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: p.name)
def test_module_docstring(path):
    doc = ast.get_docstring(ast.parse(path.read_text()))
    assert doc, f"{path.name} has no module docstring"
    if not path.name.startswith("_"):
        assert "Deliberate deviations" in doc or "Hyperparameters" in doc or path.name == "__init__.py"


def test_every_hyperparameter_is_documented_in_its_module():
    """Each keyword-only hyperparameter of a registered function is listed in its module docstring."""
    import inspect

    from rlvr.algos import advantages, aggregate, hybrid, kl, objectives
    from rlvr.algos._registry import OBJECTIVE_NEEDS

    data_kwargs = {"num_tokens", "num_seqs", "old_logp", *OBJECTIVE_NEEDS}  # data, not hyperparameters
    for reg in (advantages.ADVANTAGES, objectives.OBJECTIVES, aggregate.AGGREGATIONS, kl.KL_ESTIMATORS,
                hybrid.EXPERT_OBJECTIVES):
        for fn in reg.values():
            doc = sys.modules[fn.__module__].__doc__  # entries merged from another module document there
            for p in inspect.signature(fn).parameters.values():
                if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name not in data_kwargs:
                    assert f"`{p.name}`" in doc, f"{fn.__module__}: `{p.name}` not documented"
