"""rlvr: reinforcement learning with verifiable rewards, from a laptop CPU up."""

__version__ = "0.1.0"
