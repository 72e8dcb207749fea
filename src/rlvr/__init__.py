"""rlvr: reinforcement learning with verifiable rewards, from a laptop CPU up.

`from rlvr import Trainer` (and `rlvr.train(...)`) is the Python API (`rlvr.api`); it is imported
on first use, so `import rlvr` stays cheap (no torch) and changes nothing in the process.
"""

__version__ = "0.1.0"

__all__ = ["Trainer", "train"]


def __getattr__(name: str):
    if name in __all__:
        from rlvr import api

        return getattr(api, name)
    raise AttributeError(f"module 'rlvr' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
