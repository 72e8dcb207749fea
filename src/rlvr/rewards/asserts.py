"""Assert-style tests graded outside the sandbox, whatever their form.

A test such as ``assert abs(area(2) - 12.57) < 0.01`` is split into **probes**, the
sub-expressions that need the candidate's code (``area(2)``), and a **check**, the rest of the
expression with each probe replaced by a placeholder (``abs(_v0 - 12.57) < 0.01``). Only the
probes enter the sandbox; their values come back as strict JSON (exact builtin types, so an
object whose ``__eq__`` is always true cannot come back) and the check is evaluated here, by a
small interpreter over a fixed set of node types and safe builtins, never by ``eval``.

Why this cannot be forged: whatever the program prints, the grader only ever learns *values*
for the probes, and every verdict is computed from those values outside. A program that forges
its output is therefore graded exactly like an honest program whose probes returned the forged
values; the expected values and the comparisons never enter its process.

Expressions the interpreter does not know (comprehensions, a call consuming a generator or a
lambda, method calls, names other than the safe builtins) become probes as a whole: their one
value travels out and the check tests it, so such a test is only as strong as that value (for
``assert all(f(i) > 0 for i in ...)``, a claimed ``True``). A probe that names nothing but
builtins and ``math`` (``sorted([3, 1, 2])``, ``[i * i for i in range(5)]``: the expected side of
``assert f(x) == ...``) is a **reference** probe (`Spec.reference`): it never enters the
candidate's sandbox, since its value is the expected one; the grader evaluates it in a sandbox
run of its own, without the candidate's code.

Values that come back are bounded before any check runs on them: a set or dict whose items share
one hash more than `MAX_SAME_HASH` times (37,000 multiples of 2^61 − 1, all hashing to 0, take 30 s
to put in a set) fails the test, as does a `set`/`frozenset`/`dict` call over such a sequence.

A test of several statements is a script (`_script`): its statements run inside, each assert's probes
are evaluated where it stands. Check functions and loops over literals are first inlined and unrolled
(`rlvr.rewards.flatten`), ``if``/``with`` holding asserts become branch steps (the condition comes back
as a value and picks the branch's check), and a comparison bound to a name (``ok = f(1) == 2``) is
hoisted into probes and a check. A test with an assert left in any other compound statement (``while``,
``try``, a loop over computed values) runs inside the sandbox as a statement and is the one form a
program that introspects the interpreter could forge (``Spec.forgeable``). Probes are all evaluated,
so a probe that raises fails its test even where Python's ``and``/``or`` would have skipped it.
"""

from __future__ import annotations

import ast
import builtins
import copy
import functools
import math
import operator
from dataclasses import dataclass

from rlvr.rewards.flatten import flatten, has_assert, reads
from rlvr.rewards.pyast import parse

__all__ = ["Spec", "split_test", "evaluate_check", "deserialize", "CheckError", "BoundError"]

MAX_ITEMS = 1 << 20  # longest str/list/tuple an operator may build here (the grader's memory stays small)
MAX_INT_BITS = 1 << 16  # largest int an operator may build here
MAX_SAME_HASH = 64  # items of one set or dict that may share a hash (each insert compares against all of them)

SAFE_CALLS = {
    "abs": abs, "len": len, "sorted": sorted, "set": set, "frozenset": frozenset, "list": list, "tuple": tuple,
    "dict": dict, "sum": sum, "min": min, "max": max, "round": round, "int": int, "float": float, "str": str,
    "bool": bool, "all": all, "any": any, "reversed": lambda x: list(reversed(x)), "isinstance": isinstance,
}
SAFE_NAMES = {"int": int, "float": float, "str": str, "bool": bool, "list": list, "tuple": tuple, "dict": dict,
              "set": set, "frozenset": frozenset}
SAFE_MATH = {"isclose": math.isclose, "sqrt": math.sqrt, "floor": math.floor, "ceil": math.ceil,
             "fabs": math.fabs, "isnan": math.isnan, "isinf": math.isinf, "pi": math.pi, "inf": math.inf}

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_COMPARE = {ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge,
            ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b,
            ast.Is: operator.is_, ast.IsNot: operator.is_not}
_UNARY = {ast.Not: operator.not_, ast.USub: operator.neg, ast.UAdd: operator.pos}


class CheckError(Exception):
    """The check cannot be evaluated on these values (a wrong type, an oversized result): the test fails."""


class BoundError(CheckError):
    """The values are over a bound on the checks' cost (too large, too many shared hashes): the test
    fails, and the grade counts it (a program built to stall the grader, not a wrong answer)."""


@dataclass(frozen=True)
class Spec:
    """One test, split: `probes` go into the sandbox, `check` (an expression over `_v0`, `_v1`, ...)
    stays here. A `forgeable` spec is a whole statement run inside (`source`)."""

    source: str
    probes: tuple[str, ...] = ()
    check: ast.expr | None = None
    forgeable: bool = False
    reference: tuple[bool, ...] = ()  # per probe: names only builtins and math, so evaluated without the candidate
    # A script (statements around asserts): ("exec", source) run inside, or ("probes", first, end): the
    # probes[first:end] of one assert, evaluated inside at that point. Empty: a single assert.
    steps: tuple[tuple, ...] = ()


@functools.lru_cache(maxsize=1024)  # a row's tests are split once, not once per completion (a 100-case loop: 0.3 s)
def split_test(test: str) -> Spec:
    """``assert EXPR[, msg]`` -> probes and a check; anything else -> a statement run inside.
    The Spec is shared between callers: its `check` is read, never changed.

    >>> spec = split_test("assert abs(area(2) - 12.57) < 0.01")
    >>> spec.probes, ast.unparse(spec.check)
    (('area(2)',), 'abs(_v0 - 12.57) < 0.01')
    >>> ast.unparse(split_test("want = [2]; x = f(1); assert x == want").check)
    '_v0 == [2]'
    >>> split_test("for x in (1, 2): assert f(x) == 2").probes
    ('f(1)', 'f(2)')
    >>> split_test("for x in g(): assert f(x) == 2").forgeable
    True
    """
    try:
        tree = parse(test.strip())
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return Spec(source=test, forgeable=True)
    if len(tree.body) == 1 and isinstance(tree.body[0], ast.Assert):
        probes: list[str] = []
        check = _open(tree.body[0].test, probes)
        return Spec(source=test, probes=tuple(probes), check=check, reference=tuple(map(is_reference, probes)))
    return _script(test, tree.body)


def _script(test: str, body: list[ast.stmt]) -> Spec:
    """Statements around asserts: the statements run inside in order, each assert's probes are evaluated
    inside where it stands, and the checks (joined by ``and``) stay here. Check functions and loops over
    literals are first brought to the top level (`rlvr.rewards.flatten`); ``if`` and ``with`` holding
    asserts become branch steps. A name bound at the top level to a reference value (``want = [1, 2]``)
    or to a comparison (``ok = f(1) == 2``) that no statement reads is not run inside: the reference
    value, or the comparison's check over its probes (evaluated where the statement stands), is put
    into the asserts that read it. An assert left in any other compound statement cannot be split: the
    test runs inside as a statement (`Spec.forgeable`)."""
    flat = flatten(body, _enters)
    if flat is None or not any(has_assert(node) for node in flat):
        return Spec(source=test, forgeable=True)
    compiler = _Compiler(flat)
    steps, checks = compiler.steps(flat, top=True)
    probes = compiler.probes
    return Spec(source=test, probes=tuple(probes), check=_all(checks), steps=tuple(steps),
                reference=tuple(i not in compiler.flags and is_reference(p) for i, p in enumerate(probes)))


def _enters(name: str, body: list[ast.stmt]) -> bool:
    """Whether a loop's `name` enters the sandbox when `body` runs with the name replaced by its element:
    a statement there reads it, or a probe holds it (``f(x)``; not ``== y``, which is checked here)."""
    sentinel = ast.Constant(value=f"\x00{name}")
    for node in body:
        if name in reads(_outside_asserts(node)):
            return True
        for test in (n.test for n in ast.walk(node) if isinstance(n, ast.Assert)):
            probes: list[str] = []
            _open(_Known({name: sentinel}).visit(copy.deepcopy(test)), probes)
            if any(repr(sentinel.value) in p for p in probes):
                return True
    return False


def _all(checks: list[ast.expr]) -> ast.expr:
    if not checks:
        return ast.Constant(value=True)
    return checks[0] if len(checks) == 1 else ast.BoolOp(op=ast.And(), values=checks)


def _bound(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}


def _outside_asserts(node: ast.AST):
    """The nodes of `node` that run inside as they are: everything but asserts."""
    if isinstance(node, ast.Assert):
        return
    yield node
    for child in ast.iter_child_nodes(node):
        yield from _outside_asserts(child)


def _hoistable(node: ast.stmt) -> bool:
    """``name = <comparison>`` with an expected side (``ok = f(1) == 2``): its probes go inside, the
    comparison stays here. One between two of the candidate's values (``ok = s == Stack()``) holds no
    expected value and runs inside, where values that do not travel as JSON compare as in Python."""
    if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value, (ast.Compare, ast.BoolOp, ast.UnaryOp))):
        return False
    return any(is_reference(ast.unparse(side)) for n in ast.walk(node.value) if isinstance(n, ast.Compare)
               for side in (n.left, *n.comparators))


class _Compiler:
    """A flattened script as steps: ("exec", source), ("probes", first, end), ("if", flag, then, else)
    (the condition is probe `flag`, evaluated inside as a bool; the other branch's probes come back as
    None) and ("with", context, name or None, body); and the checks of its asserts."""

    def __init__(self, flat: list[ast.stmt]):
        self.nested = {name for node in flat if isinstance(node, (ast.If, ast.With)) for name in _bound(node)}
        # Names read inside: by every statement that runs there, which a hoisted comparison does not (it may
        # read an expected value itself); one whose own name is read inside is not hoisted, so it reads too.
        hoisted = {id(node): node.targets[0].id for node in flat if _hoistable(node)}
        while True:
            self.read_inside = reads(n for node in flat if id(node) not in hoisted for n in _outside_asserts(node))
            kept = {k: name for k, name in hoisted.items() if name not in self.read_inside | self.nested}
            if kept == hoisted:
                break
            hoisted = kept
        self.hoisted = set(hoisted)
        self.known: dict[str, ast.expr] = {}  # names standing for a reference value or a hoisted check
        self.probes: list[str] = []
        self.flags: set[int] = set()

    def steps(self, stmts: list[ast.stmt], top: bool) -> tuple[list[tuple], list[ast.expr]]:
        steps, checks = [], []
        for node in stmts:
            if isinstance(node, ast.Assert):
                first = len(self.probes)
                checks.append(_open(_Known(self.known).visit(node.test), self.probes))
                steps.append(("probes", first, len(self.probes)))
            elif isinstance(node, ast.If):
                flag = len(self.probes)
                self.probes.append(ast.unparse(node.test))
                self.flags.add(flag)
                outer = dict(self.known)
                then_steps, then_checks = self.steps(node.body, top=False)
                self.known = dict(outer)
                else_steps, else_checks = self.steps(node.orelse, top=False)
                self.known = {k: v for k, v in outer.items() if k not in _bound(node)}
                steps.append(("if", flag, tuple(then_steps), tuple(else_steps)))
                checks.append(ast.IfExp(test=_placeholder(flag), body=_all(then_checks), orelse=_all(else_checks)))
            elif isinstance(node, ast.With):
                item = node.items[0]
                self._unbind(item)
                inner_steps, inner_checks = self.steps(node.body, top=False)
                self._unbind(node)
                name = item.optional_vars.id if item.optional_vars is not None else None
                steps.append(("with", ast.unparse(item.context_expr), name, tuple(inner_steps)))
                checks += inner_checks
            else:
                self._unbind(node)
                steps += self._statement(node, top)
        return steps, checks

    def _unbind(self, node: ast.AST) -> None:
        for name in _bound(node):
            self.known.pop(name, None)

    def _statement(self, node: ast.stmt, top: bool) -> list[tuple]:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None
        if not top or not isinstance(target, ast.Name) or target.id in self.read_inside | self.nested \
                or getattr(node, "rlvr_binding", False):  # a loop's name, bound as the loop would
            return [("exec", ast.unparse(node))]
        if is_reference(ast.unparse(node.value)):
            self.known[target.id] = node.value  # an expected value: stays out of the sandbox
            return []
        if id(node) not in self.hoisted:
            return [("exec", ast.unparse(node))]
        value = _Known(self.known).visit(node.value)
        first = len(self.probes)  # its probes are evaluated here; the comparison is put into the asserts
        self.known[target.id] = _open(value, self.probes)
        return [("probes", first, len(self.probes))]


def _placeholder(index: int) -> ast.Name:
    node = ast.Name(id=f"_v{index}", ctx=ast.Load())
    node.rlvr_placeholder = True  # a value already opened: a leaf wherever it is put
    return node


class _Known(ast.NodeTransformer):
    """An assert's expression with each name bound to a reference value replaced by that value."""

    def __init__(self, known: dict[str, ast.expr]):
        self.known = known

    def visit_Name(self, node: ast.Name) -> ast.expr:  # noqa: N802 - ast.NodeTransformer's naming
        if isinstance(node.ctx, ast.Load) and node.id in self.known:
            return copy.deepcopy(self.known[node.id])
        return node


# Builtins through which a probe could still reach the candidate's namespace: such a probe is the candidate's.
_REACHING = {"eval", "exec", "compile", "globals", "locals", "vars", "getattr", "__import__", "open", "input",
             "breakpoint", "help", "exit", "quit", "setattr", "delattr", "hasattr", "dir", "id"}
REFERENCE_NAMES = frozenset(n for n in dir(builtins) if not n.startswith("_") and n not in _REACHING) | {"math"}


def is_reference(probe: str) -> bool:
    """Whether a probe names nothing the candidate defines: only builtins, ``math`` and its own bound names.

    >>> is_reference("sorted([3, 1, 2])"), is_reference("[i * i for i in range(4)]"), is_reference("f(2)")
    (True, True, False)
    """
    try:
        tree = parse(probe, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    loads, bound = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (loads if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_"):
            return False  # dunder walks (().__class__.__base__ ...) may reach anything
    return loads - bound <= REFERENCE_NAMES


def _is_safe_leaf(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.Name):
        return node.id in SAFE_NAMES
    return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "math" \
        and node.attr in SAFE_MATH


def _open(node: ast.expr, probes: list[str]) -> ast.expr:
    """`node` with every sub-expression the interpreter cannot evaluate replaced by a placeholder."""
    if _is_safe_leaf(node) or getattr(node, "rlvr_placeholder", False):
        return node
    structural = (ast.Compare, ast.BoolOp, ast.UnaryOp, ast.BinOp, ast.IfExp, ast.Tuple, ast.List, ast.Set,
                  ast.Dict, ast.Subscript, ast.Slice)
    # A generator or a lambda has no value that travels as JSON: the call consuming it is the probe.
    arguments = [*node.args, *(k.value for k in node.keywords)] if isinstance(node, ast.Call) else []
    is_safe_call = isinstance(node, ast.Call) and (
        (isinstance(node.func, ast.Name) and node.func.id in SAFE_CALLS) or _is_safe_leaf(node.func)) and not any(
        isinstance(a, (ast.Starred, ast.GeneratorExp, ast.Lambda)) for a in arguments)
    if isinstance(node, structural) or is_safe_call:
        for field, value in ast.iter_fields(node):
            if field in ("op", "ops", "ctx", "func"):
                continue
            if isinstance(value, list):
                setattr(node, field, [_open(v, probes) if isinstance(v, ast.expr) else _open_keyword(v, probes)
                                      for v in value])
            elif isinstance(value, ast.expr):
                setattr(node, field, _open(value, probes))
        return node
    probes.append(ast.unparse(node))
    return _placeholder(len(probes) - 1)


def _open_keyword(value, probes):
    if isinstance(value, ast.keyword):
        value.value = _open(value.value, probes)
    return value


def few_collisions(items) -> list:
    """`items` as a list, after checking that no more than `MAX_SAME_HASH` of them share a hash (their
    hashes are counted in a dict keyed by the hash values themselves, which do not collide)."""
    items = list(items)
    counts: dict[int, int] = {}
    for item in items:
        try:
            h = hash(item)
        except TypeError:
            raise CheckError("unhashable item") from None
        counts[h] = counts.get(h, 0) + 1
        if counts[h] > MAX_SAME_HASH:
            raise BoundError(f"more than {MAX_SAME_HASH} items share one hash")
    return items


def deserialize(value):
    """Inverse of the harness's strict JSON form (tagged tuples, sets, dicts and special floats)."""
    if isinstance(value, list):
        return [deserialize(v) for v in value]
    if isinstance(value, dict):
        if set(value) == {"__tuple__"}:
            return tuple(deserialize(v) for v in value["__tuple__"])
        if set(value) == {"__set__"}:
            return set(few_collisions(deserialize(v) for v in value["__set__"]))
        if set(value) == {"__dict__"}:
            pairs = [(deserialize(k), deserialize(v)) for k, v in value["__dict__"]]
            few_collisions(k for k, _ in pairs)
            return dict(pairs)
        if set(value) == {"__float__"} and value["__float__"] in ("nan", "inf", "-inf"):
            return float(value["__float__"])
        raise CheckError("malformed value")
    return value


def _equal(a, b) -> bool:
    """`==` except that a bool equals only a bool (`True == 1` is a wrong answer, not a pass)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    return a == b


def _bounded(value):
    if isinstance(value, (str, list, tuple)) and len(value) > MAX_ITEMS:
        raise BoundError("result too large")
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise BoundError("integer too large")
    return value


def _binary(op: ast.operator, a, b):
    if isinstance(op, ast.Pow) and isinstance(b, int) and abs(b) > 4096 and not isinstance(a, float):
        raise BoundError("exponent too large")
    if isinstance(op, ast.Mult):
        for seq, n in ((a, b), (b, a)):
            if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and len(seq) * max(n, 0) > MAX_ITEMS:
                raise BoundError("result too large")
    return _bounded(_BINARY[type(op)](a, b))


def evaluate_check(node: ast.expr, values: dict[str, object]):
    """The value of a check expression given the probes' values (`_v0` ...). Raises CheckError on
    anything outside the interpreter's node types or on a value of the wrong type."""
    try:
        return _eval(node, values)
    except CheckError:
        raise
    except (TypeError, ValueError, ZeroDivisionError, OverflowError, KeyError, IndexError, RecursionError,
            AttributeError) as err:
        raise CheckError(f"{type(err).__name__}: {err}") from None


def _eval(node: ast.expr, env: dict):  # noqa: C901 - one branch per node type reads best
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        if node.id in env:
            return env[node.id]
        return SAFE_NAMES[node.id]
    if isinstance(node, ast.Attribute):
        return SAFE_MATH[node.attr]
    if isinstance(node, ast.BoolOp):
        result = None
        for value in node.values:
            result = _eval(value, env)
            if isinstance(node.op, ast.And) != bool(result):
                return result
        return result
    if isinstance(node, ast.UnaryOp):
        return _UNARY[type(node.op)](_eval(node.operand, env)) if not isinstance(node.op, ast.Invert) \
            else ~_eval(node.operand, env)
    if isinstance(node, ast.BinOp):
        if type(node.op) not in _BINARY:
            raise CheckError(f"operator {type(node.op).__name__} is not evaluated here")
        return _binary(node.op, _eval(node.left, env), _eval(node.right, env))
    if isinstance(node, ast.Compare):
        left = _eval(node.left, env)
        for op, right_node in zip(node.ops, node.comparators):
            right = _eval(right_node, env)
            if isinstance(op, (ast.Eq, ast.NotEq)):
                ok = _equal(left, right) == isinstance(op, ast.Eq)
            else:
                ok = _COMPARE[type(op)](left, right)
            if not ok:
                return False
            left = right
        return True
    if isinstance(node, ast.IfExp):
        return _eval(node.body, env) if _eval(node.test, env) else _eval(node.orelse, env)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        items = [_eval(e, env) for e in node.elts]
        return {ast.Tuple: tuple, ast.List: list, ast.Set: set}[type(node)](items)
    if isinstance(node, ast.Dict):
        return {_eval(k, env): _eval(v, env) for k, v in zip(node.keys, node.values)}
    if isinstance(node, ast.Subscript):
        return _eval(node.value, env)[_eval(node.slice, env)]
    if isinstance(node, ast.Slice):
        return slice(*(None if part is None else _eval(part, env) for part in (node.lower, node.upper, node.step)))
    if isinstance(node, ast.Call):
        fn = SAFE_CALLS[node.func.id] if isinstance(node.func, ast.Name) else _eval(node.func, env)
        args = [_eval(a, env) for a in node.args]
        kwargs = {k.arg: _eval(k.value, env) for k in node.keywords if k.arg is not None}
        if any(isinstance(a, (str, list, tuple, set, dict)) and len(a) > MAX_ITEMS for a in args):
            raise BoundError("argument too large")
        if fn in (set, frozenset, dict) and args and isinstance(args[0], (list, tuple)):
            args[0] = few_collisions(args[0]) if fn is not dict else args[0]
            if fn is dict:
                few_collisions(k[0] if isinstance(k, (list, tuple)) and k else k for k in args[0])
        return _bounded(fn(*args, **kwargs))
    raise CheckError(f"{type(node).__name__} is not evaluated here")
