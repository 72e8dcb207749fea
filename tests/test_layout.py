"""The package's shape: one meaning per folder, imports that point one way, small files.

Folders depend on each other in one direction (base types <- algos <- config, models <- runtime <-
engines <- backends <- trainer <- builder <- sft, api/cli); the rules below are the ones a reader
relies on: the math imports only torch, rewards and tasks never import torch or the trainer,
and optional extras are imported lazily in the one module that needs them.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "rlvr"
MAX_LINES = 500
OPTIONAL_EXTRAS = ("wandb", "tensorboard", "mlflow", "datasets", "pyarrow", "peft", "vllm", "ray", "trl",
                   "textarena")


def _modules() -> dict[str, Path]:
    """Dotted module name -> file, for every Python file of the package."""
    out = {}
    for path in SRC.rglob("*.py"):
        parts = path.relative_to(SRC.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(imported module, at module level?) for every import statement of `path`."""
    tree = ast.parse(path.read_text())
    top_level = {id(node) for node in tree.body}
    guarded = {id(n) for node in tree.body if isinstance(node, ast.If) for n in ast.walk(node)}  # TYPE_CHECKING
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        at_top = id(node) in top_level and id(node) not in guarded
        found.extend((name, at_top) for name in names)
    return found


def _unit(module: str) -> str:
    """The folder (or top-level module) a module belongs to: rlvr.trainer.sync -> trainer."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "rlvr"


def _unit_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = defaultdict(set)
    for module, path in modules.items():
        for name, _ in _imports(path):
            if name.startswith("rlvr.") and name in modules and _unit(name) != _unit(module):
                graph[_unit(module)].add(_unit(name))
    return graph


def _assert_acyclic(graph: dict[str, set[str]]) -> None:
    """Depth-first search; an edge back to a node on the current trail is a cycle, named in full."""
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> None:
        if state.get(node) == 1:
            raise AssertionError(f"import cycle: {' -> '.join(trail[trail.index(node):] + [node])}")
        if state.get(node) == 2:
            return
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            visit(nxt, trail + [node])
        state[node] = 2

    for node in sorted(graph):
        visit(node, [])


def test_no_import_cycle_between_folders():
    _assert_acyclic(_unit_graph())


@pytest.mark.parametrize("folder, forbidden", [
    ("models", {"engines", "trainer", "tracking", "cli", "api"}),
    ("kernels", {"models", "engines", "trainer", "tracking", "cli", "api"}),
    ("engines", {"trainer", "tracking", "cli", "api"}),
    ("tracking", {"trainer", "engines", "cli", "api"}),
    ("rewards", {"trainer", "models", "engines", "algos", "kernels"}),
    ("tasks", {"trainer", "models", "engines", "algos", "kernels"}),
    ("algos", {"trainer", "models", "engines", "rewards", "tasks", "tracking", "kernels"}),
    ("agents", {"trainer", "tasks", "tracking", "cli", "api"}),
    # the loop reads the plan and the components: it never reaches back into what builds them
    ("trainer", {"builder", "backends", "sft", "cli", "api"}),
    ("runtime", {"trainer", "builder", "backends", "engines", "models", "cli", "api"}),
    ("config", {"trainer", "builder", "backends", "engines", "runtime", "models", "cli", "api"}),
    ("backends", {"trainer", "builder", "cli", "api"}),
    ("sampling", {"trainer", "builder", "engines", "models", "cli", "api"}),
])
def test_folder_does_not_import(folder, forbidden):
    assert not (_unit_graph().get(folder, set()) & forbidden), f"{folder} imports {_unit_graph()[folder] & forbidden}"


def test_algos_import_only_torch_and_the_standard_library():
    for module, path in _modules().items():
        if _unit(module) != "algos":
            continue
        for name, _ in _imports(path):
            top = name.split(".")[0]
            assert top in sys.stdlib_module_names or top == "torch" or name.startswith("rlvr.algos"), (module, name)


def test_rewards_and_tasks_never_load_torch_or_the_trainer():
    """Checked on the real import, transitively: a verifier worker stays light."""
    code = ("import sys, rlvr.rewards, rlvr.tasks, rlvr.protocols, rlvr.types; "
            "print(sorted(m for m in ('torch', 'transformers', 'rlvr.trainer', 'rlvr.models') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_agent_environments_and_tools_never_load_torch():
    code = ("import sys, rlvr.agents, rlvr.agents.render, rlvr.agents.envs.calculator, "
            "rlvr.agents.envs.guess, rlvr.agents.envs.lookup; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_importing_rlvr_is_cheap():
    code = "import sys, rlvr; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_optional_extras_are_imported_lazily_in_one_module_each():
    users: dict[str, set[str]] = defaultdict(set)
    for module, path in _modules().items():
        for name, at_top in _imports(path):
            top = name.split(".")[0]
            extra = top if top in OPTIONAL_EXTRAS else (
                "tensorboard" if name.startswith("torch.utils.tensorboard") else None)
            if extra:
                assert not at_top, f"{module} imports the optional extra {name} at module level"
                users[extra].add(module)
    assert all(len(mods) == 1 for mods in users.values()), dict(users)


def test_no_source_file_is_over_the_size_limit():
    long = {str(p.relative_to(SRC)): n for p in SRC.rglob("*.py") if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"files over {MAX_LINES} lines: {long}"


def test_tests_never_import_through_a_tests_package():
    """`pytest` (not `python -m pytest`) does not put the repository root on sys.path, so
    `from tests.x import y` fails at collection on a clean machine; shared test helpers live in
    `_name.py` files beside the tests and are imported by that bare name."""
    tests = Path(__file__).resolve().parent
    bad = sorted(str(p.relative_to(tests)) for p in tests.rglob("*.py")
                 if any(name == "tests" or name.startswith("tests.") for name, _ in _imports(p)))
    assert not bad, f"import shared helpers as `from _helper import ...`, not through `tests.`: {bad}"


def _module_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports, at module level or inside a function alike (a lazy
    import still makes a cycle; only optional extras are imported lazily, and they are not ours)."""
    modules = _modules()
    graph: dict[str, set[str]] = defaultdict(set)
    for module, path in modules.items():
        for name, _ in _imports(path):
            if name in modules and name != module:
                graph[module].add(name)
    return graph


def test_no_import_cycle_between_files():
    _assert_acyclic(_module_graph())


def _top_level_names(path: Path) -> set[str]:
    """What a module defines at its top level (functions, classes, assignments, `__all__`; and for a
    package's `__init__`, what it imports: a name imported elsewhere is not that module's to point at)."""
    tree = ast.parse(path.read_text())
    found = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                found |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
                if isinstance(target, ast.Name) and target.id == "__all__":
                    found |= {e.value for e in ast.walk(node.value) if isinstance(e, ast.Constant)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)) and path.name == "__init__.py":
            found |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
    return found


def _names_something(dotted: str, modules: dict[str, Path]) -> bool:
    """`rlvr.a.b.c` names a module, or a top-level name of the longest module it starts with."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        module = ".".join(parts[:i])
        if module in modules:
            if i == len(parts):
                return True
            below = {m.rsplit(".", 1)[-1] for m in modules if m.rsplit(".", 1)[0] == module}
            return parts[i] in _top_level_names(modules[module]) | below
    return False


def _prose(path: Path) -> list[str]:
    """The text a reader follows pointers from: a markdown file whole, a module's docstrings and comments."""
    text = path.read_text()
    if path.suffix != ".py":
        return [text]
    tree = ast.parse(text)
    # docstrings of modules, classes, functions and attributes: the bare strings
    docs = [n.value.value for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)
             and isinstance(n.value.value, str)]
    return docs + [line.split("#", 1)[1] for line in text.splitlines() if "#" in line]


def test_every_module_named_in_docstrings_and_docs_exists():
    """`rlvr.x.y` names and `src/rlvr/...` paths in docstrings, comments and the markdown docs, and
    `x/y.py` paths in the code map of docs/usage.md, name modules (and top-level names) that exist:
    a file moved or renamed leaves no pointer behind. A backticked `folder.module.name` without the
    `rlvr.` is checked too unless it starts with a config field (`trainer.max_staleness`)."""
    from rlvr.config import all_keys  # torch-free

    repo = SRC.parent.parent
    modules = _modules()
    sections = {key.split(".")[0] + "." + key.split(".")[1] for key in all_keys() if key.count(".") >= 1}
    folders = sorted({m.split(".")[1] for m in modules if m.count(".") >= 2} - {"config"})
    relative = re.compile("`((?:" + "|".join(folders) + r")(?:\.[A-Za-z_]\w*){2,})")
    stale = []
    for path in [*SRC.rglob("*.py"), *(repo / "docs").rglob("*.md"), repo / "README.md"]:
        where = str(path.relative_to(repo))
        for text in _prose(path):
            for match in re.finditer(r"(?<![\w./-])rlvr(?:\.[A-Za-z_]\w*)+", text):
                stale += [] if _names_something(match.group(0), modules) else [(where, match.group(0))]
            for match in re.finditer(r"src/rlvr/[\w./-]*\w", text):
                stale += [] if (repo / match.group(0)).exists() else [(where, match.group(0))]
            for match in relative.finditer(text):
                name = match.group(1)
                if ".".join(name.split(".")[:2]) not in sections and not _names_something(f"rlvr.{name}", modules):
                    stale.append((where, name))
    usage = (repo / "docs" / "usage.md").read_text()
    code_map = usage[usage.index("## Reading the code"):]
    code_map = code_map[:code_map.find("\n## ", 3)] if "\n## " in code_map[3:] else code_map
    for match in re.finditer(r"`([\w/]+(?:\.py|/))`", code_map):
        path = match.group(1)
        if path.startswith("src/"):  # checked above
            continue
        found = (SRC / path).exists() if "/" in path.rstrip("/") else any(SRC.rglob(path.rstrip("/")))
        if not path.startswith(("examples/", "tests/", "bench/")) and not found:
            stale.append(("docs/usage.md (code map)", path))
    assert not stale, f"pointers to modules that do not exist: {stale}"
