"""The one error type users see: a one-line message naming the field and the fix."""


class ConfigError(Exception):
    """Bad user input (config, recipe, paths). The CLI prints it on one line and exits 2."""


class RewardError(ConfigError):
    """A reward function failed on every sample of a step (a bug in it, not a model failure)."""
