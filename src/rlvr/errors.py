"""The one error type users see: a one-line message naming the field and the fix."""


class ConfigError(Exception):
    """Bad user input (config, recipe, paths). The CLI prints it on one line and exits 2."""


class RewardError(ConfigError):
    """A reward function failed on every sample of a step (a bug in it, not a model failure)."""


class DiskFull(ConfigError):
    """No space left on a disk the run writes to. What was being written is rolled back (no
    partial checkpoint or log line stays), run.json says `failed` with this line, and
    `rlvr train --resume RUN_DIR` continues once space is freed."""


class RunLocked(ConfigError):
    """Another process holds the run directory's lock (it trains or resumes that run now); the
    message names it. The lock is the kernel's, so a killed process never leaves one behind."""


class LearnerLost(ConfigError):
    """A data-parallel learner died (the message names it) or stopped answering within
    `trainer.collective_timeout_s`. `--resume RUN_DIR` continues from the last checkpoint."""


class RunInterrupted(KeyboardInterrupt):
    """SIGTERM or SIGINT ended a run; run.json says `interrupted` with the signal. A
    KeyboardInterrupt, so code that handles Ctrl-C handles it; `exit_status` is 128 + the signal
    number (143 for SIGTERM, 130 for SIGINT), what a shell reports for a process killed by it."""

    def __init__(self, signal_name: str, exit_status: int, step: int | None = None):
        where = f" after step {step}" if step else ""
        super().__init__(f"{signal_name}: run interrupted{where}")
        self.signal_name, self.exit_status, self.step = signal_name, exit_status, step
