"""The Countdown expression language: an exact parser (never ``eval``), evaluation in
``Fraction``s, and printing with minimal parentheses.

Grammar: ``expr := term (('+' | '-') term)*``, ``term := factor (('*' | '/') factor)*``,
``factor := NUMBER | '(' expr ')'``; no spaces, no unary minus, no leading zeros, and ``/`` only
when division is allowed.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Union

__all__ = ["Expr", "ParseError", "evaluate", "leaves", "parse", "to_string"]

# An expression tree: an int leaf, or (op, left, right) with op one of "+-*/".
Expr = Union[int, tuple]

_PREC = {"+": 1, "-": 1, "*": 2, "/": 2}


class ParseError(ValueError):
    """The text is not a well-formed expression in the Countdown grammar."""



def evaluate(expr: Expr) -> Fraction:
    """Exact value of an expression tree; raises ZeroDivisionError on division by zero."""
    if isinstance(expr, int):
        return Fraction(expr)
    op, left, right = expr
    a, b = evaluate(left), evaluate(right)
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    return a / b  # Fraction raises ZeroDivisionError for b == 0


def leaves(expr: Expr) -> list[int]:
    """The integer literals of an expression, left to right."""
    if isinstance(expr, int):
        return [expr]
    return leaves(expr[1]) + leaves(expr[2])


def to_string(expr: Expr) -> str:
    """Print with the fewest parentheses that keep the value.

    Operators are left-associative with ``* /`` above ``+ -``. A left operand needs parentheses
    only when its operator binds looser; a right operand also when it has the same precedence
    under ``-`` or ``/`` (``a-(b-c)``, ``a/(b*c)``). ``a+(b-c)`` prints as ``a+b-c`` and
    ``a*(b/c)`` as ``a*b/c``: a different tree, the same exact value.

    >>> trees = [("-", 9, ("-", 5, 2)), ("*", ("+", 3, 5), 2), ("+", 3, ("*", 5, 2))]
    >>> [to_string(e) for e in trees]
    ['9-(5-2)', '(3+5)*2', '3+5*2']
    """
    if isinstance(expr, int):
        return str(expr)
    op, left, right = expr
    ls, rs = to_string(left), to_string(right)
    if not isinstance(left, int) and _PREC[left[0]] < _PREC[op]:
        ls = f"({ls})"
    if not isinstance(right, int):
        rp = _PREC[right[0]]
        if rp < _PREC[op] or (rp == _PREC[op] and op in "-/"):
            rs = f"({rs})"
    return f"{ls}{op}{rs}"


def parse(text: str, *, allow_division: bool = True) -> Expr:
    """Parse an expression by recursive descent (never ``eval``).

    Grammar, with no whitespace anywhere::

        expr   := term (("+" | "-") term)*
        term   := factor (("*" | "/") factor)*      # "/" only when allow_division
        factor := number | "(" expr ")"
        number := "0" | [1-9][0-9]*                 # no leading zeros, no unary minus

    Raises ParseError on anything else. Callers bound the length; nesting depth is at most
    half the length, so recursion stays shallow.

    >>> parse("(3+5)*2")
    ('*', ('+', 3, 5), 2)
    """
    parser = _Parser(text, "+-*/" if allow_division else "+-*")
    expr = parser.expr()
    if parser.pos != len(text):
        raise ParseError(f"unexpected {text[parser.pos]!r} at {parser.pos}")
    return expr


class _Parser:
    def __init__(self, text: str, ops: str):
        self.text, self.ops, self.pos = text, ops, 0

    def _peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def expr(self) -> Expr:
        node = self.term()
        while (op := self._peek()) and op in "+-":
            self.pos += 1
            node = (op, node, self.term())
        return node

    def term(self) -> Expr:
        node = self.factor()
        while (op := self._peek()) and op in "*/":
            if op not in self.ops:
                raise ParseError(f"operator {op!r} not allowed")
            self.pos += 1
            node = (op, node, self.factor())
        return node

    def factor(self) -> Expr:
        ch = self._peek()
        if ch == "(":
            self.pos += 1
            node = self.expr()
            if self._peek() != ")":
                raise ParseError(f"expected ')' at {self.pos}")
            self.pos += 1
            return node
        start = self.pos
        while (ch := self._peek()) and ch in "0123456789":  # ASCII only: str.isdigit takes "²"
            self.pos += 1
        digits = self.text[start : self.pos]
        if not digits:
            raise ParseError(f"expected a number or '(' at {start}")
        if len(digits) > 1 and digits[0] == "0":
            raise ParseError(f"leading zero in {digits!r}")
        return int(digits)


