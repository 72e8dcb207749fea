"""Calculator: a product of two numbers too long for the tiny model to multiply in its head.

    first observation  347*58\n
    action             <calc>347*58</calc>        observation  <r>20126</r>
    action             <answer>20126</answer>     reward 1 if exact

The tool evaluates + - * and parentheses over integers (an AST walk, never `eval`). With the
tool disabled (the single-turn ablation) the model must answer at once.
"""

from __future__ import annotations

import ast
import operator
import random
import time

from rlvr.agents.env import StepResult
from rlvr.agents.task import AgentTask, ToolEnv
from rlvr.rewards.pyast import parse

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}
MAX_DIGITS = 40


def calc(expression: str) -> str:
    """Evaluate an integer arithmetic expression with + - * and parentheses."""
    def walk(node):
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            value = _OPS[type(node.op)](walk(node.left), walk(node.right))
            if abs(value) >= 10 ** MAX_DIGITS:
                raise ValueError("result too large")
            return value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -walk(node.operand)
        raise ValueError("only integers, + - * and parentheses")
    return str(walk(parse(expression.strip(), mode="eval")))


class CalculatorEnv(ToolEnv):
    def __init__(self, *, digits: tuple[int, int] = (3, 2), latency_s: float = 0.0, **kwargs):
        self.digits = digits
        self.latency_s = latency_s  # each tool call answered this long after it (a remote service's round trip)
        super().__init__(**kwargs)

    def _tools(self):
        return (calc,)

    def step(self, action_text: str) -> StepResult:
        result = super().step(action_text)
        calls = result.info.get("tool_calls", 0)
        if self.latency_s > 0 and calls:
            time.sleep(self.latency_s * calls)  # a wait, no computation here
        return result

    def _generate(self, rng: random.Random):
        a, b = (rng.randrange(10 ** (d - 1), 10 ** d) for d in self.digits)
        expression = f"{a}*{b}"
        return f"{expression}\n", a * b, expression

    def scripted(self, use_tool: bool, rng: random.Random):
        """The demonstrator: with the tool, call it then copy its result; without, answer at once."""
        def policy(observation: str) -> str:
            if use_tool and not self.results:
                return f"<calc>{self.key}</calc>"
            return f"<answer>{self.answer}</answer>"
        return policy


class Calculator(AgentTask):
    """Task `agent_calculator`: `digits_a`-digit times `digits_b`-digit products with a calc tool."""

    env_class = CalculatorEnv

    def __init__(self, *, digits_a: int = 3, digits_b: int = 2, heldout_size: int = 200, max_turns: int = 3,
                 max_total_tokens: int = 96, env_timeout_s: float = 60.0,
                 tool_timeout_s: float = 2.0, tools: bool = True,
                 train_drifted: bool = False, demo_tool_rate: float = 0.5, tool_latency_s: float = 0.0):
        if min(digits_a, digits_b) < 1:
            raise ValueError(f"digits_a and digits_b must be >= 1, got {digits_a}, {digits_b}")
        if not tool_latency_s >= 0:
            raise ValueError(f"tool_latency_s must be >= 0, got {tool_latency_s}")
        super().__init__(heldout_size=heldout_size, max_turns=max_turns, max_total_tokens=max_total_tokens,
                         env_timeout_s=env_timeout_s,
                         tool_timeout_s=tool_timeout_s, tools=tools, train_drifted=train_drifted,
                         demo_tool_rate=demo_tool_rate, digits=(digits_a, digits_b), latency_s=tool_latency_s)
