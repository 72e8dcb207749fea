"""Agent tasks: a `Task` whose examples are environment episodes, and `ToolEnv`, the base of
environments where the model calls tools and then answers. No torch here.

An `AgentTask` draws episodes by seed: `Example(prompt=first observation, answer, meta={"episode":
seed, "key": problem key})`. The held-out split is a hash bucket of the problem key: training
draws never fall in it, `heldout()` draws only from it (the Countdown rule). The loop builds a
fresh environment per episode with `make_env()` and resets it with the episode seed.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

from rlvr.agents.env import StepResult, bounded_calls, guarded
from rlvr.agents.tools import ToolRegistry, parse_action
from rlvr.errors import ConfigError
from rlvr.rewards.format import extract_tag
from rlvr.types import Example

HELDOUT_BUCKETS = 10
MAX_DRAWS_PER_EXAMPLE = 200  # one bucket in ten is held out: 200 draws all in it happen with odds 10^-200


def is_heldout_key(key: str) -> bool:
    digest = hashlib.sha256(f"agent:{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % HELDOUT_BUCKETS == 0


def is_agent_task(task) -> bool:
    """Whether `task`'s examples are episodes of an environment (`AgentTask`'s `make_env` and
    `settings`): asked once, by whoever builds a run or an evaluation, never by the loop."""
    return hasattr(task, "make_env") and hasattr(task, "settings")


@dataclass(frozen=True)
class AgentSettings:
    """The loop's limits for a task (set from the task's config section)."""

    max_turns: int = 4
    max_total_tokens: int = 128
    tool_timeout_s: float = 2.0
    tools: bool = True          # False: the single-turn ablation (no tool, answer at once)
    train_drifted: bool = False  # keep drifted trajectories in the loss
    env_timeout_s: float = 60.0  # longest wait for one reset or step


class AgentTask:
    """Base of the agent tasks; subclasses set `env_class` and may override `env_kwargs`."""

    env_class: type = None  # type: ignore[assignment]
    _heldout_salt = 7_777

    def __init__(self, *, heldout_size: int = 200, max_turns: int = 4, max_total_tokens: int = 128,
                 tool_timeout_s: float = 2.0, tools: bool = True, train_drifted: bool = False,
                 demo_tool_rate: float = 1.0, env_timeout_s: float = 60.0, **env_kwargs):
        if heldout_size < 0:
            raise ValueError(f"heldout_size must be >= 0, got {heldout_size}")
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        if not 0.0 <= demo_tool_rate <= 1.0:
            raise ValueError(f"demo_tool_rate must be in [0, 1], got {demo_tool_rate}")
        if not env_timeout_s > 0:
            raise ValueError(f"env_timeout_s must be > 0, got {env_timeout_s}")
        self.settings = AgentSettings(max_turns if tools else 1, max_total_tokens, tool_timeout_s, tools,
                                      train_drifted, env_timeout_s)
        self.heldout_size, self.demo_tool_rate, self.env_kwargs = heldout_size, demo_tool_rate, env_kwargs
        self._heldout: list[Example] | None = None

    def make_env(self):
        return self.env_class(tools=self.settings.tools, tool_timeout_s=self.settings.tool_timeout_s,
                              **self.env_kwargs)

    def rollout_episodes(self, engine, tokenizer, examples: list[Example], seeds, *, temperature):
        """One episode per example: this task's environments stepped through `engine` turn by turn. A task
        that runs its own episodes (an agent function behind the endpoint, `agents.agent_fn`) overrides it."""
        from rlvr.agents.collect import stepped_episodes

        return stepped_episodes(self, engine, tokenizer, examples, seeds, temperature)

    def _example(self, episode: int) -> Example:
        """The episode's first observation as its prompt. An environment whose reset raises or
        hangs still gives an example (empty prompt, its own key): the rollout resets it again and
        records that episode as an `env_error`, as the agent docs promise."""
        env = self.make_env()
        first = bounded_calls([guarded(lambda: str(env.reset(episode)))], self.settings.env_timeout_s)[0]
        if isinstance(first, Exception):
            return Example(prompt="", answer="", meta={"episode": episode, "key": f"env_error:{episode}"})
        return Example(prompt=first, answer=str(env.answer), meta={"episode": episode, "key": env.key})

    def sample(self, n: int, rng: random.Random | None = None) -> list[Example]:
        """`n` training episodes: problems whose key is outside the held-out bucket (any key when
        `heldout_size` is 0). A bounded number of draws: an environment whose every problem falls
        in the bucket (one fixed problem, say) is an error, not an endless loop."""
        rng = rng or random.Random()
        out, draws, key = [], 0, ""
        while len(out) < n:
            if draws >= MAX_DRAWS_PER_EXAMPLE * n:
                raise ConfigError(f"task: {draws} episodes drawn and every problem (key {key!r}) is in the held-out "
                                  f"bucket, so none is left to train on; make the environment's problems vary (its "
                                  f"`key`), or set heldout_size=0 (no held-out accuracy) to train on every problem")
            ex = self._example(rng.getrandbits(48))
            draws, key = draws + 1, ex.meta["key"]
            if not self.heldout_size or not is_heldout_key(key):
                out.append(ex)
        return out

    def heldout(self) -> list[Example]:
        if self._heldout is None:
            rng, seen, out = random.Random(self._heldout_salt), set(), []
            for _ in range(200 * max(self.heldout_size, 1)):
                if len(out) >= self.heldout_size:
                    break
                ex = self._example(rng.getrandbits(48))
                if is_heldout_key(ex.meta["key"]) and ex.meta["key"] not in seen:
                    seen.add(ex.meta["key"])
                    out.append(ex)
            self._heldout = out
        return self._heldout

    def demo_policy(self, env, rng: random.Random):
        """A scripted `policy(observation) -> action` for `env` after its reset (demonstrations)."""
        use_tool = self.settings.tools and rng.random() < self.demo_tool_rate
        return env.scripted(use_tool, rng)

    # The Task protocol's text verifier: agent rewards come from the environment, so the text
    # path scores the final answer of a transcript against the example's answer.
    def reward(self, prompt: str, completion: str, **example) -> float:
        return float(self.is_correct(completion, Example(prompt, example.get("answer", ""))))

    def is_correct(self, completion: str, example: Example) -> bool:
        answer = extract_tag(completion, "answer")  # rfind, linear: the completion is model text
        return answer is not None and answer == example.answer


class ToolEnv:
    """An episode where the model may call tools, then answers with `<answer>...</answer>`.

    Subclasses implement `_generate(rng) -> (first observation, answer, key)`, `_tools()`
    (the functions) and `scripted(use_tool, rng)`. Rewards: 1 for a correct answer, else 0;
    a malformed action, an unknown tool or a failing tool give an error observation and the
    episode goes on. With `tools=False` a tool call is refused (the single-turn ablation)."""

    def __init__(self, *, tools: bool = True, tool_timeout_s: float = 2.0):
        self.use_tools = tools
        self.registry = ToolRegistry.of(*self._tools(), timeout_s=tool_timeout_s)
        self.answer, self.key, self.results = None, "", []

    def _tools(self) -> tuple:
        return ()

    def _generate(self, rng: random.Random) -> tuple[str, object, str]:
        raise NotImplementedError

    def reset(self, seed: int) -> str:
        first, self.answer, self.key = self._generate(random.Random(seed))
        self.results = []
        return first

    def state_key(self):
        """The state the next action is taken in: the problem and the tool results so far."""
        return (self.key, tuple(self.results))

    def check(self, answer: str) -> bool:
        return answer == str(self.answer)

    def step(self, action_text: str) -> StepResult:
        parsed = parse_action(action_text, self.registry)
        state = self.state_key()
        if parsed.answer is not None:
            ok = self.check(parsed.answer)
            return StepResult("", float(ok), True, {"success": ok, "state_key": state})
        if parsed.malformed:
            return StepResult("error: no tool call or answer", 0.0, False,
                              {"malformed": 1, "state_key": state, "role": "user"})
        if not self.use_tools:
            return StepResult("error: no tools", 0.0, False, {"tool_errors": 1, "state_key": state})
        texts, errors, timeouts = [], 0, 0
        for call in parsed.calls:
            result = self.registry.call(call)
            errors += not result.ok
            timeouts += result.error == "timeout"
            texts.append(result.text)
        self.results.extend(texts)
        return StepResult("; ".join(texts), 0.0, False,
                          {"tool_calls": len(parsed.calls), "tool_errors": errors, "tool_timeouts": timeouts,
                           "state_key": self.state_key(), "role": "tool"})
