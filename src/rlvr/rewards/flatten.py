"""Asserts in compound statements brought to where the grader can split them.

`rlvr.rewards.asserts` splits an assert into probes (run inside the sandbox) and a check (run
outside) only where the assert stands on its own; inside a function or a loop the whole statement
would run inside, its expected values with it. Three rewrites, each exact for honest programs,
bring the common forms out:

- **A check function** (HumanEval's ``def check(candidate): assert candidate(1) == 2 ...``
  followed by ``check(fn)`` at the top level): each call statement becomes the function's body, the parameter bound
  to the argument first and every name the function binds renamed (``_rlvr_`` + name), so the
  inlined body touches the candidate's globals no more than the call did (a module it imports is
  bound under its own name, so ``math.fabs`` stays a function the check evaluates outside). The ``def`` itself is not
  run (its code object holds the expected values). Only when every use of the name is such a call
  at the top level and the function has one plain parameter, no decorator, no ``return``/``yield``/
  ``global``/``nonlocal`` at its own level and no function or class inside.
- **A loop over literals** (``for x, y in [(1, 2), (3, 4)]: assert f(x) == y``, or ``range`` over
  integer literals): one copy of the body per element, the loop's names replaced by that element
  (and those that enter anyway, ``x`` here, bound to it first as the loop would: ``x = 1``),
  when the body has no ``break``/``continue``, no function or class, does not read a loop name it
  rebinds, and nothing after the loop reads a name left unbound before binding it again; at most
  `MAX_UNROLLED` statements in all.
- ``if`` and ``with`` holding asserts stay compound: the grader sends them as branch steps (the
  condition and the context expression run inside; see `rlvr.rewards.asserts`).

Anything else holding an assert (a ``while``, ``try``, a loop over computed values) is left as it
is, and the test runs inside as a statement (`Spec.forgeable`).
"""

from __future__ import annotations

import ast
import copy
from collections import Counter
from collections.abc import Callable

__all__ = ["flatten", "has_assert", "reads", "MAX_UNROLLED", "PREFIX"]

MAX_UNROLLED = 4096  # statements a test may grow to once its loops are unrolled
PREFIX = "_rlvr_"  # an inlined check function's own names
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


class _TooLarge(Exception):
    pass


def reads(nodes) -> set[str]:
    """The names these (walked) nodes read: loaded, deleted, or the target of ``name += ...``."""
    out = set()
    for n in nodes:
        if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Store):
            out.add(n.id)
        elif isinstance(n, ast.AugAssign) and isinstance(n.target, ast.Name):
            out.add(n.target.id)
    return out


def has_assert(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Assert) for n in ast.walk(node))


def _own_level(node: ast.AST):
    """The nodes of a function's body, not descending into nested functions, lambdas or classes."""
    todo = list(ast.iter_child_nodes(node))
    while todo:
        child = todo.pop()
        yield child
        if not isinstance(child, _SCOPES):
            todo.extend(ast.iter_child_nodes(child))


def flatten(body: list[ast.stmt], enters: Callable[[str, list[ast.stmt]], bool]) -> list[ast.stmt] | None:
    """`body` with its check functions inlined and its literal loops unrolled; None when an assert is
    left inside a compound statement other than ``if``/``with`` (the test cannot be split).
    `enters(name, body)`: whether a loop's name enters the sandbox anyway when the loop's body runs (a
    statement or a probe reads it): such a name is bound to its element before each copy, as the loop
    would bind it (the candidate's code may read it as a global); the others (expected values) are not."""
    checks = _check_functions(body)
    kept = [n for n in body if not (isinstance(n, ast.FunctionDef) and n.name in checks)]
    try:
        return _no_unbound_reads(_flatten(kept, checks, [0], enters))
    except (_TooLarge, RecursionError):
        return None


def _check_functions(body: list[ast.stmt]) -> dict[str, ast.FunctionDef]:
    """Top-level functions holding asserts that can be inlined: one plain parameter, every use a call
    statement ``name(arg)``, nothing that leaves the body early or reaches outside its scope."""
    found = {}
    for node in body:
        args = node.args if isinstance(node, ast.FunctionDef) else None
        if args is None or node.decorator_list or not has_assert(node) or len(args.args) != 1 or args.posonlyargs \
                or args.vararg or args.kwonlyargs or args.kwarg or args.defaults:
            continue
        if any(isinstance(n, (ast.Return, ast.Yield, ast.YieldFrom, ast.Await, ast.Global, ast.Nonlocal,
                              ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) for n in _own_level(node)):
            continue
        found[node.name] = node
    if not found:
        return {}
    calls = Counter(n.value.func.id for n in body if _call_of(n, found))  # at the top level only
    uses = Counter(n.id for n in ast.walk(ast.Module(body=body, type_ignores=[]))
                   if isinstance(n, ast.Name) and n.id in found)
    bound_twice = Counter(n.name for n in body if isinstance(n, ast.FunctionDef))
    return {name: fn for name, fn in found.items() if uses[name] == calls[name] and bound_twice[name] == 1}


def _call_of(stmt: ast.AST, checks) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and isinstance(
        stmt.value.func, ast.Name) and stmt.value.func.id in checks and len(stmt.value.args) == 1 \
        and not stmt.value.keywords and not isinstance(stmt.value.args[0], ast.Starred)


def _flatten(body, checks, size: list[int], enters) -> list[ast.stmt] | None:
    out: list[ast.stmt] = []
    for node in body:
        if _call_of(node, checks):
            inlined = _inline(checks[node.value.func.id], node.value.args[0])
            part = _flatten(inlined, checks, size, enters)
        elif isinstance(node, ast.For) and has_assert(node):
            copies, unbound = _unrolled(node, enters)
            part = None if copies is None else _flatten(copies, checks, size, enters)
            part = None if part is None else [*part, _unbound(unbound)]
        elif isinstance(node, ast.If) and has_assert(node):
            then, orelse = _flatten(node.body, checks, size, enters), _flatten(node.orelse, checks, size, enters)
            part = None if then is None or orelse is None else [ast.If(test=node.test, body=then or [ast.Pass()],
                                                                       orelse=orelse)]
        elif isinstance(node, ast.With) and has_assert(node):
            inner = _flatten(node.body, checks, size, enters) if len(node.items) == 1 and (
                node.items[0].optional_vars is None or isinstance(node.items[0].optional_vars, ast.Name)) else None
            part = None if inner is None else [ast.With(items=node.items, body=inner or [ast.Pass()])]
        elif has_assert(node) and not isinstance(node, ast.Assert):
            return None
        else:
            part = [node]
        if part is None:
            return None
        size[0] += len(part)
        if size[0] > MAX_UNROLLED:
            raise _TooLarge
        out += part
    return out


class _Rename(ast.NodeTransformer):
    """Every binding of a name in `names` (and every read of it) renamed to PREFIX + name."""

    def __init__(self, names: set[str]):
        self.names = names

    def _new(self, name):
        return PREFIX + name if name in self.names else name

    def visit_Name(self, node):  # noqa: N802 - ast.NodeTransformer's naming
        node.id = self._new(node.id)
        return node

    def visit_arg(self, node):
        node.arg = self._new(node.arg)
        return node

    def visit_FunctionDef(self, node):  # noqa: N802
        node.name = self._new(node.name)
        return self.generic_visit(node)

    def visit_ExceptHandler(self, node):  # noqa: N802
        node.name = node.name and self._new(node.name)
        return self.generic_visit(node)



def _inline(fn: ast.FunctionDef, argument: ast.expr) -> list[ast.stmt]:
    """The body of ``fn(argument)`` as statements: the parameter bound first, the function's names renamed."""
    body = copy.deepcopy(fn.body)
    param = fn.args.args[0].arg
    names = {param}
    for node in ast.walk(ast.Module(body=body, type_ignores=[])):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
            names.update(a.arg for a in ast.walk(node.args) if isinstance(a, ast.arg))
        elif isinstance(node, ast.Lambda):
            names.update(a.arg for a in ast.walk(node.args) if isinstance(a, ast.arg))
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
    renamer = _Rename(names)
    bind = ast.Assign(targets=[ast.Name(id=PREFIX + param, ctx=ast.Store())], value=copy.deepcopy(argument))
    return [ast.fix_missing_locations(bind), *(renamer.visit(s) for s in body)]


def _unbound(names: set[str]) -> ast.stmt:
    """A marker after an unrolled loop: these names of it are not bound (the loop would have left the last
    element)."""
    marker = ast.Pass()
    marker.rlvr_unbound = names
    return marker


def _no_unbound_reads(flat: list[ast.stmt] | None) -> list[ast.stmt] | None:
    """`flat` without the markers, or None when a statement reads a name an unrolled loop left unbound
    before binding it again."""
    if flat is None:
        return None
    def walk(stmts: list[ast.stmt], unbound: set[str]) -> list[ast.stmt] | None:
        kept = []
        for node in stmts:
            if hasattr(node, "rlvr_unbound"):
                unbound |= node.rlvr_unbound
                continue
            head = [node.test] if isinstance(node, ast.If) else node.items if isinstance(node, ast.With) else [node]
            nodes = [n for part in head for n in ast.walk(part)]
            if unbound & reads(nodes):
                return None
            unbound -= {n.id for n in nodes if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
            if isinstance(node, (ast.If, ast.With)):  # a branch binds nothing for after it, for sure
                branches = [node.body, node.orelse] if isinstance(node, ast.If) else [node.body]
                inner = [set(unbound) for _ in branches]
                walked = [walk(b, u) for b, u in zip(branches, inner)]
                if None in walked:
                    return None
                node.body = walked[0]
                if isinstance(node, ast.If):
                    node.orelse = walked[1]
                unbound |= set().union(*inner)
            kept.append(node)
        return kept

    return walk(flat, set())


def _literal_items(node: ast.expr) -> list[ast.expr] | None:
    """The elements of a literal list/tuple of literals, or of ``range`` over integer literals."""
    if isinstance(node, (ast.List, ast.Tuple)):
        try:
            for element in node.elts:
                ast.literal_eval(element)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return None
        return list(node.elts)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "range" \
            and not node.keywords and 1 <= len(node.args) <= 3:
        try:
            bounds = [ast.literal_eval(a) for a in node.args]
        except (ValueError, TypeError, SyntaxError):
            return None
        if all(type(b) is int for b in bounds) and (0 not in bounds[2:]) and len(range(*bounds)) <= MAX_UNROLLED:
            return [ast.Constant(value=i) for i in range(*bounds)]
    return None


def _bindings(target: ast.expr, element: ast.expr) -> dict[str, ast.expr] | None:
    """Loop target name -> the element's part it takes, when the shapes match."""
    if isinstance(target, ast.Name):
        return {target.id: element}
    if isinstance(target, (ast.Tuple, ast.List)) and isinstance(element, (ast.Tuple, ast.List)) \
            and len(target.elts) == len(element.elts):
        out = {}
        for t, e in zip(target.elts, element.elts):
            part = _bindings(t, e)
            if part is None:
                return None
            out.update(part)
        return out
    return None


class _Substitute(ast.NodeTransformer):
    def __init__(self, values: dict[str, ast.expr]):
        self.values = values

    def visit_Name(self, node):  # noqa: N802 - ast.NodeTransformer's naming
        if isinstance(node.ctx, ast.Load) and node.id in self.values:
            return copy.deepcopy(self.values[node.id])
        return node


def _binding(name: str, value: ast.expr) -> ast.stmt:
    """``name = value``, run inside as the loop would have bound it (marked: never taken for an expected value)."""
    node = ast.Assign(targets=[ast.Name(id=name, ctx=ast.Store())], value=copy.deepcopy(value))
    node.rlvr_binding = True
    return node


def _unrolled(loop: ast.For, enters) -> tuple[list[ast.stmt] | None, set[str]]:
    """The loop as one copy of its body per element (None where that would not be exact), each copy
    after the bindings of the names that enter anyway; and the names left unbound."""
    items = _literal_items(loop.iter)
    if items is None or loop.orelse:
        return None, set()
    bindings = [_bindings(loop.target, item) for item in items]
    if any(b is None for b in bindings):
        return None, set()
    names = {n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)}
    inner = list(ast.walk(ast.Module(body=loop.body, type_ignores=[])))
    if any(isinstance(n, (ast.Break, ast.Continue, *_SCOPES)) for n in inner):
        return None, set()
    rebound = {n.id for n in inner if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
    if names & rebound & reads(inner):
        return None, set()  # a read after the body rebinds the name would take the element instead
    if len(items) * (len(loop.body) + len(names)) > MAX_UNROLLED:
        raise _TooLarge
    bound = sorted(name for name in names if enters(name, loop.body))
    copies = []
    for b in bindings:
        copies += [_binding(name, b[name]) for name in bound]
        copies += [_Substitute(b).visit(copy.deepcopy(stmt)) for stmt in loop.body]
    return [ast.fix_missing_locations(c) for c in copies], names - set(bound)
