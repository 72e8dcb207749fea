"""The Hugging Face Hub's command-line tool as the installed huggingface-hub ships it, for the hints
of errors about models and datasets that are not in the cache; the form of a Hub id."""

from __future__ import annotations

import re

__all__ = ["HUB_ID", "LOGIN", "hf_command"]

HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+(@[\w./-]+)?")
"""A Hub repository id as rlvr takes one where a local path may stand: `org/name`, optionally `@revision`."""

LOGIN = {"hf": "auth login", "huggingface-cli": "login"}  # each CLI's login subcommand


def hf_command() -> str:
    """`hf` (huggingface-hub 0.34 and later), else the older `huggingface-cli`."""
    from huggingface_hub import __version__

    major, minor = (int(part) for part in re.findall(r"\d+", __version__)[:2])
    return "hf" if (major, minor) >= (0, 34) else "huggingface-cli"
