"""Which prompts a step rolls out and how many completions each gets (`base.Sampler`), and which
generated groups train (`base.GroupFilter`): uniform draws, per-prompt posteriors (`selection`:
MoPPS, VADE), source curricula (`sources`: DUMP), budget reallocation (`budgets`: GVM-RAFT,
CoBA-RL) and difficulty predicted from similar measured prompts (`predictive`: DOTS).
`SAMPLERS` is what `sampler.name` picks from. Beside them: TraceRL's pass-rate band (`base.PassRateBand`),
the Monte-Carlo calibration metric (`calibration`) and SPEC-RL's verification rule (`speculative`)."""

from rlvr.sampling.base import Uniform
from rlvr.sampling.budgets import GVM, CoBA
from rlvr.sampling.predictive import DOTS
from rlvr.sampling.selection import VADE, MoPPS
from rlvr.sampling.sources import DUMP

SAMPLERS = {"uniform": Uniform, "mopps": MoPPS, "vade": VADE, "dump": DUMP, "gvm": GVM, "coba": CoBA, "dots": DOTS}
"""`sampler.name` -> the sampler class; each takes the task, the run's prompt RNG and its own knobs."""
