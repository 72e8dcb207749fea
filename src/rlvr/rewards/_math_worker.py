"""Child process for ``rlvr.rewards.math``: one JSON request per line, one JSON answer per line.

Runs math-verify's LaTeX parser and sympy comparison; the parent enforces the time limit by
killing this process, so math-verify's own (``signal.alarm``) timeouts are switched off.
A request ``{"op": "sleep", "s": x}`` exists only so tests can exercise the parent's timeout.
"""

from __future__ import annotations

import json
import logging
import sys
import time


def _equal_factory():
    try:
        from math_verify import LatexExtractionConfig, parse, verify
    except ImportError:  # math-verify missing: exact text only (the parent already tried numbers)
        return lambda pred, gold: False
    logging.disable(logging.CRITICAL)  # math-verify logs every parse failure
    config = [LatexExtractionConfig(boxed_match_priority=0)]

    def equal(pred: str, gold: str) -> bool:
        g = parse(f"${gold}$", extraction_config=config, parsing_timeout=None)
        p = parse(f"${pred}$", extraction_config=config, parsing_timeout=None)
        if not g or not p:
            return False
        return bool(verify(g, p, timeout_seconds=None))

    return equal


def main() -> None:
    equal = _equal_factory()
    print("ready", flush=True)
    for line in sys.stdin:
        try:
            request = json.loads(line)
            if request.get("op") == "sleep":
                time.sleep(float(request["s"]))
                result = False
            else:
                result = equal(str(request["pred"]), str(request["gold"]))
        except Exception:  # noqa: BLE001 - any parse or sympy failure means "not shown equal"
            result = False
        print(json.dumps({"equal": result}), flush=True)


if __name__ == "__main__":
    main()
