"""The environment seam of multi-turn agents: `reset(seed) -> observation`, `step(action_text) ->
(observation, reward, done, info)`. No torch here: environments are plain, seeded, picklable
Python objects, so they can later run in worker processes.

An environment owns one episode at a time (a fresh instance per episode, the OpenRLHF and TRL
style); the rollout loop never shares one between episodes. The active episodes' `step` calls
of a turn run at the same time, each in a thread of its own (`agents.rollout.step_envs`), so a
step must read and write only its own instance's state (its own seeded RNG, never the global
`random`); state shared between instances (a cache, a connection pool) must be thread-safe and
must not change what any step returns, or the trajectories would depend on thread timing. An
environment that cannot promise that sets `concurrent_steps = False` (as `GymAdapter` does for
the third-party code it wraps): a turn with one steps its environments one at a time, in
episode order. A `reset` or `step` that raises (`sys.exit()` included), or that has not returned after
`env_timeout_s` seconds (default 60), ends only its own episode (`env_error`; a late one also
counts in `agent/env_timeouts`). The observation is plain text: the
rollout's renderer turns it into tokens (a tag wrapper for the character models, the chat
template's tool message for chat models), so an environment never knows the model family.

`info` keys the loop reads (all optional):
- `state_key`: a hashable summary of the environment state *before* the next action; identical
  keys across a group are GiGPO's anchor states.
- `success`: whether the episode solved the task (accuracy metrics; defaults to reward > 0).
- `tool_calls`, `tool_errors`, `tool_timeouts`, `malformed`: counts for this step.
- `role`: `tool` (a tool's output) or `user` (environment feedback) for the chat renderer.
- `privileged`: information for critics only (the hidden number, the table); never rendered.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol, runtime_checkable


class EnvTimeout(Exception):
    """An environment's `reset` or `step` did not return within its deadline (`env_timeout_s`)."""


def bounded_calls(calls: list[Callable[[], Any]], timeout_s: float | None) -> list[Any]:
    """Run each call in a daemon thread of its own, all at once; its return value, or `EnvTimeout`
    for one still running `timeout_s` seconds after the start (None: no limit). A call past its
    deadline is abandoned, not stopped (Python cannot stop a thread): it may go on in the
    background, holding its environment, which the loop never touches again."""
    results: list[Any] = [EnvTimeout(f"did not return within {timeout_s:g} s (env_timeout_s)")
                          if timeout_s else None] * len(calls)

    def run(i: int) -> None:
        results[i] = calls[i]()

    threads = [threading.Thread(target=run, args=(i,), daemon=True, name=f"rlvr-env-{i}") for i in range(len(calls))]
    deadline = time.monotonic() + (timeout_s or 0)
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(deadline - time.monotonic(), 0) if timeout_s else None)
    return list(results)  # a copy: an abandoned call that ends later must not change what was returned


def guarded(fn: Callable[[], Any]) -> Callable[[], Any]:
    """`fn` returning the exception it raised instead of raising it; `sys.exit()` inside an
    environment is one of them (it would otherwise end the run without a word)."""
    def call():
        try:
            return fn()
        except (Exception, SystemExit) as err:  # noqa: BLE001 - a broken environment ends its episode
            return err if isinstance(err, Exception) else RuntimeError(f"called sys.exit({err.code!r})")
    return call


class StepResult(NamedTuple):
    """What `step` returns; unpacks as the gymnasium-style 4-tuple."""

    observation: str
    reward: float
    done: bool
    info: dict


@runtime_checkable
class Environment(Protocol):
    """One episode of a text environment. `reset` returns the first observation (the task
    statement); `step` consumes the text of one model action, touching only this instance's state:
    the steps of a turn's episodes run in parallel threads (see the module docstring)."""

    def reset(self, seed: int) -> str: ...

    def step(self, action_text: str) -> StepResult | tuple[str, float, bool, dict]: ...


class FinishReason:
    """Why a turn (and, for the last turn, the episode) ended."""

    STOP = "stop"              # the model ended its action (EOS) and the environment went on or finished
    DONE = "done"              # the environment said done (an answer was given)
    LENGTH = "length"          # the action hit the per-turn token limit (rollout.max_new_tokens)
    TOOL_ERROR = "tool_error"  # a tool raised, timed out or was called wrongly (the episode goes on)
    MALFORMED = "malformed"    # the action held neither a valid tool call nor an answer
    TURN_LIMIT = "turn_limit"  # max_turns actions were taken without finishing
    TOKEN_BUDGET = "token_budget"  # the trajectory reached max_total_tokens
    ENV_ERROR = "env_error"    # the environment itself raised; the episode ends with reward 0

    ALL = (STOP, DONE, LENGTH, TOOL_ERROR, MALFORMED, TURN_LIMIT, TOKEN_BUDGET, ENV_ERROR)


def as_step_result(out: Any) -> StepResult:
    """Accept a StepResult, a gymnasium 4-tuple or a gymnasium>=0.26 5-tuple
    (obs, reward, terminated, truncated, info)."""
    if isinstance(out, StepResult):
        return out
    if len(out) == 5:
        obs, reward, terminated, truncated, info = out
        return StepResult(str(obs), float(reward), bool(terminated or truncated), dict(info or {}))
    obs, reward, done, info = out
    return StepResult(str(obs), float(reward), bool(done), dict(info or {}))


class GymAdapter:
    """Wraps a gymnasium-style text environment (duck-typed: gymnasium is not a dependency).

    The wrapped object's `reset(seed=...)` may return `obs` or `(obs, info)`; its `step(action)`
    the 4- or 5-tuple form. Observations and actions must be text (or have a useful `str`).
    Its steps run one after another unless `concurrent_steps=True` says the wrapped code keeps to
    the concurrency contract above (no global RNG, no unguarded shared state)."""

    def __init__(self, env: Any, *, concurrent_steps: bool = False):
        self.env, self.concurrent_steps = env, concurrent_steps

    def reset(self, seed: int) -> str:
        out = self.env.reset(seed=seed)
        return str(out[0] if isinstance(out, tuple) else out)

    def step(self, action_text: str) -> StepResult:
        return as_step_result(self.env.step(action_text))
