"""`parse`: `ast.parse` that threads may call at the same time.

CPython before 3.13 keeps the recursion depth of its AST-to-object conversion in module-wide
state, not per thread. When the garbage collector runs Python code (a finaliser) in the middle of
one thread's conversion, the GIL can pass to another thread parsing at that moment, and one of
them fails with `SystemError: AST constructor recursion depth mismatch` (CPython gh-106905). A
tool that parses its arguments (the calculator) runs in one thread per episode, and verifiers in
a scoring pool; that error turned a valid call into an error observation, depending on timing.
Every parse under one process-wide lock: a parse of a tool call or a test line takes
microseconds, so the lock costs nothing measurable.
"""

from __future__ import annotations

import ast
import threading

_LOCK = threading.RLock()  # re-entrant: a finaliser run by the collector mid-parse may parse too


def parse(source: str, mode: str = "exec") -> ast.AST:
    """`ast.parse(source, mode=mode)`, one at a time in this process (see the module docstring)."""
    with _LOCK:
        return ast.parse(source, mode=mode)
