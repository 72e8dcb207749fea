"""Multi-turn tool-use agents: environments, tools, token-exact multi-turn rollouts, credit.

Torch-free at import (environments and tools are plain Python); the rollout and batching
modules (`rollout`, `batch`, `collect`) import torch and are imported where used.
"""

from __future__ import annotations

from rlvr.agents.env import Environment, FinishReason, GymAdapter, StepResult
from rlvr.agents.task import AgentSettings, AgentTask, ToolEnv
from rlvr.agents.tools import ToolCall, ToolRegistry, ToolResult, parse_action, schema

__all__ = ["AgentSettings", "AgentTask", "Environment", "FinishReason", "GymAdapter", "StepResult", "ToolCall",
           "ToolEnv", "ToolRegistry", "ToolResult", "parse_action", "schema"]
