"""The one error type users see: a one-line message naming the field and the fix."""


class ConfigError(Exception):
    """Bad user input (config, recipe, paths). The CLI prints it on one line and exits 2."""
