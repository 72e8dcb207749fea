"""Running a test's call on a thread other than the main one (the thread group leader), as the
sandbox's workers run samples."""

from __future__ import annotations

import threading


def in_thread(fn):
    """``fn()``'s result or exception, run on a thread that is not the thread group leader."""
    box = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as err:  # noqa: BLE001 - handed back to the test
            box["error"] = err

    t = threading.Thread(target=target)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box["value"]
