"""Countdown with a Python tool: the model may run expressions before it answers.

    first observation  3 5 2>13:                       (the Countdown prompt)
    action             <python>print(3*5-2)</python>   observation  <r>13</r>
    action             <answer>3*5-2</answer>          reward: the Countdown verifier's 1.0 only

The program runs in `rlvr.rewards.sandbox.Sandbox` (process isolation, rlimits, wall clock),
never in this process. The sandbox is created on first use and not pickled with the
environment, so the environment stays picklable.
"""

from __future__ import annotations

import random

from rlvr.agents.task import AgentTask, ToolEnv
from rlvr.tasks.countdown import Countdown

_SANDBOX = {}


def _sandbox(wall_s: float):
    from rlvr.rewards.sandbox import Limits, Sandbox

    if wall_s not in _SANDBOX:
        _SANDBOX[wall_s] = Sandbox(workers=1, limits=Limits(wall_s=wall_s, memory_mb=256))
    return _SANDBOX[wall_s]


class CountdownPythonEnv(ToolEnv):
    def __init__(self, *, num_count: int = 3, max_number: int = 9, wall_s: float = 2.0, **kwargs):
        self.wall_s = wall_s
        self.countdown = Countdown(num_count=num_count, max_number=max_number, heldout_size=0, ordered=True)
        super().__init__(**kwargs)

    def _tools(self):
        return (self.python,)  # a bound method: the environment stays picklable

    def python(self, code: str) -> str:
        """Run a Python program in a sandbox and return what it prints."""
        run = _sandbox(self.wall_s).run(code)
        if run.verdict.value != "OK":
            last = (run.stderr or "").strip().splitlines()[-1:] or [""]
            return f"{run.verdict.value} {last[0]}"[:80]
        return (run.stdout or "").strip()[:80]

    def _generate(self, rng: random.Random):
        ex = self.countdown._draw(rng)
        self.example = ex
        return ex.prompt, ex.answer, ex.prompt

    def check(self, answer: str) -> bool:
        return self.countdown.is_correct(answer, self.example)

    def scripted(self, use_tool: bool, rng: random.Random):
        """Test the solution with the tool first, then answer it."""
        solution = self.countdown.solution(self.example)

        def policy(observation: str) -> str:
            if use_tool and not self.results:
                return f"<python>print({solution})</python>"
            return f"<answer>{solution}</answer>"
        return policy


class CountdownPython(AgentTask):
    """Task `agent_countdown_python`: Countdown with a sandboxed Python tool."""

    env_class = CountdownPythonEnv

    def __init__(self, *, num_count: int = 3, max_number: int = 9, heldout_size: int = 200, max_turns: int = 3,
                 max_total_tokens: int = 96, env_timeout_s: float = 60.0,
                 tool_timeout_s: float = 5.0, tools: bool = True,
                 train_drifted: bool = False, demo_tool_rate: float = 0.5):
        super().__init__(heldout_size=heldout_size, max_turns=max_turns, max_total_tokens=max_total_tokens,
                         env_timeout_s=env_timeout_s,
                         tool_timeout_s=tool_timeout_s, tools=tools, train_drifted=train_drifted,
                         demo_tool_rate=demo_tool_rate, num_count=num_count, max_number=max_number)
