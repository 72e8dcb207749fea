"""Key-value lookup over a hidden table, multi-hop: the value of the asked key is another key,
and so on for `hops` steps; only the last value is the answer. The table is never in the prompt,
so every hop needs a tool call, and the chain needs memory of the last result.

    first observation  k3 hops 2\n
    action             <lookup>k3</lookup>     observation  <r>k7</r>
    action             <lookup>k7</lookup>     observation  <r>42</r>
    action             <answer>42</answer>     reward 1 if exact
"""

from __future__ import annotations

import random

from rlvr.agents.task import AgentTask, ToolEnv


class LookupEnv(ToolEnv):
    def __init__(self, *, keys: int = 10, hops: int = 2, **kwargs):
        self.keys, self.hops, self.table = keys, hops, {}
        super().__init__(**kwargs)

    def _tools(self):
        return (self.lookup,)  # a bound method: the environment stays picklable

    def lookup(self, key: str) -> str:
        """The value stored under `key` in the hidden table."""
        return self.table.get(key.strip(), "not found")

    def _generate(self, rng: random.Random):
        names = [f"k{i}" for i in range(self.keys)]
        chain = rng.sample(names, self.hops)
        value = str(rng.randrange(10, 100))
        self.table = {name: f"k{rng.randrange(self.keys)}" for name in names}
        for a, b in zip(chain, chain[1:]):
            self.table[a] = b
        self.table[chain[-1]] = value
        key = f"{chain[0]}>{'>'.join(chain[1:])}={value}"
        return f"{chain[0]} hops {self.hops}\n", value, key

    def scripted(self, use_tool: bool, rng: random.Random):
        """Follow the chain with the tool; the other demonstrations guess a value."""
        start = next(iter(self.key.split(">")))

        def policy(observation: str) -> str:
            if not use_tool:
                return f"<answer>{rng.randrange(10, 100)}</answer>"
            if len(self.results) < self.hops:
                return f"<lookup>{self.results[-1] if self.results else start.split('=')[0]}</lookup>"
            return f"<answer>{self.results[-1]}</answer>"
        return policy


class Lookup(AgentTask):
    """Task `agent_lookup`: multi-hop key-value lookup through a tool."""

    env_class = LookupEnv

    def __init__(self, *, keys: int = 10, hops: int = 2, heldout_size: int = 200, max_turns: int = 4,
                 max_total_tokens: int = 128, env_timeout_s: float = 60.0,
                 tool_timeout_s: float = 2.0, tools: bool = True,
                 train_drifted: bool = False, demo_tool_rate: float = 0.8):
        if not 1 <= hops <= keys:
            raise ValueError(f"hops must be in 1..keys, got hops={hops}, keys={keys}")
        super().__init__(heldout_size=heldout_size, max_turns=max_turns if tools else 1,
                         env_timeout_s=env_timeout_s,
                         max_total_tokens=max_total_tokens, tool_timeout_s=tool_timeout_s, tools=tools,
                         train_drifted=train_drifted, demo_tool_rate=demo_tool_rate, keys=keys, hops=hops)
