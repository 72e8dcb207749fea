"""The process's resident-set peak by phase of a step (`perf/peak_rss_mb/<phase>` in metrics.jsonl).

Linux keeps one high-water mark per process (`VmHWM`); writing "5" to `/proc/self/clear_refs`
lowers it to the current RSS, so reading it at a phase's end and resetting it gives the peak of
that phase alone. Resetting it also lowers what `getrusage` reports as `ru_maxrss`, so the
lifetime peak is kept here (`lifetime`) rather than read from there. Without that file (not
Linux, or no permission) every phase reports the lifetime peak from `getrusage`. The mark is
the process's: under asynchronous rollouts a learner phase's peak includes what the rollout
thread held meanwhile.
"""

from __future__ import annotations

import resource

_STATUS, _CLEAR = "/proc/self/status", "/proc/self/clear_refs"


def _lifetime_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _hwm_mb() -> float | None:
    try:
        with open(_STATUS) as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError):
        pass
    return None


class RssPeaks:
    """`begin()` starts a phase; `end()` returns its peak RSS in MB and starts the next one."""

    def __init__(self):
        self.lifetime = _lifetime_mb()
        self._resets = True

    def _reset(self) -> None:
        if self._resets:
            try:
                with open(_CLEAR, "w") as f:
                    f.write("5")
            except OSError:
                self._resets = False

    def begin(self) -> None:
        self.lifetime = max(self.lifetime, _hwm_mb() or _lifetime_mb())
        self._reset()

    def end(self) -> float:
        hwm = _hwm_mb() if self._resets else None
        peak = hwm if hwm is not None else _lifetime_mb()
        self.lifetime = max(self.lifetime, peak)
        self._reset()
        return peak


PEAKS = RssPeaks()  # one mark per process, so one reader of it
