"""The multi-turn rollout over any `RolloutEngine`: token in, token out.

Each episode is one flat sequence `[prompt | a_1 | o_1 | a_2 | ... ]`. The ids of an action are
exactly the ones the engine sampled (its EOS included) with the engine's behaviour log-probs
and loss mask 1; the ids of an observation are exactly the ones the renderer inserted, with
mask 0 and log-prob 0. The mask is built here, while the sequence grows, never recovered
afterwards by searching tags. All active episodes of a batch take each turn together (one
engine call per turn), then their environments step at once, each in a thread of its own, so
tool waits overlap; the results are applied in episode order (`step_envs`). The prompt of turn k
is the episode's whole kept sequence.

Limits and failures never crash a batch: an environment that raises ends its episode
(`env_error`, reward 0); a tool that raises or hangs is the environment's error observation
(see `tools.py`); `max_turns`, `max_total_tokens` (the observation that would overflow is not
appended, the verl rule; an action past it is cut) and the engine's per-turn limit end turns
with their finish reason. At the end every trajectory is re-rendered from its texts and
compared with the kept ids: a mismatch is flagged `drifted` (and, by default, trained on
nowhere: see `agents.batch`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from rlvr.agents.env import (
    Environment,
    EnvTimeout,
    FinishReason,
    StepResult,
    as_step_result,
    bounded_calls,
    guarded,
)
from rlvr.batch import left_pad
from rlvr.runtime.rows import waiting


@dataclass(frozen=True)
class Limits:
    max_turns: int = 4
    """Most actions per episode."""
    max_total_tokens: int = 128
    """Longest kept sequence (prompt + actions + observations)."""
    env_timeout_s: float | None = 60.0
    """Longest wait for one `reset` or `step` (None: no limit); past it the episode is an `env_error`."""


@dataclass
class Turn:
    start: int                 # first id of the action in the full sequence
    end: int                   # one past its last id
    obs_end: int               # one past the observation's last id (== end when none was appended)
    finish: str                # FinishReason of the turn
    reward: float = 0.0
    state_key: object = None   # the environment state the action was taken in


@dataclass
class Trajectory:
    ids: list[int]
    prompt_len: int
    logprobs: list[float] = field(default_factory=list)  # aligned with ids; 0 where mask is 0
    mask: list[int] = field(default_factory=list)        # loss mask: 1 exactly on sampled ids
    turn_index: list[int] = field(default_factory=list)  # -1 prompt; k on action k and observation k
    turns: list[Turn] = field(default_factory=list)
    messages: list[dict] = field(default_factory=list)   # the texts, for logging and the re-render
    reward: float = 0.0
    success: bool = False
    finish: str = ""
    done: bool = False
    drifted: bool = False
    state_key: object = None   # the state before the next action
    counts: dict = field(default_factory=dict)
    error: str = ""            # what ended an `env_error` episode (the exception, one line)

    def add(self, ids: list[int], logprobs: list[float] | None, *, trained: bool, turn: int) -> None:
        self.ids += ids
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(ids)
        self.mask += [int(trained)] * len(ids)
        self.turn_index += [turn] * len(ids)

    def count(self, key: str, n: int = 1) -> None:
        self.counts[key] = self.counts.get(key, 0) + n


def start_episode(env: Environment, seed: int, renderer, fallback_prompt: str,
                  timeout_s: float | None = None) -> Trajectory:
    """Reset `env`; an environment that raises, or has not returned after `timeout_s`, gives a
    finished `env_error` episode."""
    first = bounded_calls([guarded(lambda: str(env.reset(seed)))], timeout_s)[0]
    if isinstance(first, Exception):
        ids = renderer.start(fallback_prompt)
        t = Trajectory(ids=[], prompt_len=len(ids), finish=FinishReason.ENV_ERROR, done=True,
                       messages=[{"role": "user", "content": fallback_prompt}])
        t.add(ids, None, trained=False, turn=-1)
        _count_error(t, "reset", first)
        return t
    ids = renderer.start(first)
    t = Trajectory(ids=[], prompt_len=len(ids), messages=[{"role": "user", "content": first}])
    t.add(ids, None, trained=False, turn=-1)
    # The environment's own key of its start state when it has one, so a later step that leaves
    # the state unchanged (a malformed action) lands in the same anchor group.
    t.state_key = env.state_key() if hasattr(env, "state_key") else ("start", first)
    return t


def take_turn(t: Trajectory, env: Environment, renderer, action_ids: list[int], logprobs: list[float] | None,
              *, ended: bool, turn: int, limits: Limits) -> None:
    """Append one action, step the environment, append its observation (or finish)."""
    act = append_action(t, renderer, action_ids, logprobs, ended=ended, limits=limits, turn=turn)
    observe(t, renderer, act, step_envs([env], [act.text], limits.env_timeout_s)[0], turn=turn, limits=limits)


@dataclass(frozen=True)
class Action:
    """An action appended to its trajectory, before the environment has answered it."""

    text: str
    begin: int      # first id of the action in the full sequence
    finish: str     # the turn's FinishReason so far (STOP, LENGTH or TOKEN_BUDGET)


def append_action(t: Trajectory, renderer, action_ids: list[int], logprobs: list[float] | None, *, ended: bool,
                  turn: int, limits: Limits) -> Action:
    """Append one sampled action (cut at `max_total_tokens`) and its text message."""
    budget = limits.max_total_tokens - len(t.ids)
    finish = FinishReason.STOP if ended else FinishReason.LENGTH
    if len(action_ids) >= budget:
        action_ids, logprobs = action_ids[:max(budget, 0)], (logprobs or [0.0] * len(action_ids))[:max(budget, 0)]
        ended = ended and len(action_ids) == budget
        finish = FinishReason.TOKEN_BUDGET
    begin = len(t.ids)
    t.add(action_ids, logprobs, trained=True, turn=turn)
    text = renderer.action_text(action_ids)
    t.messages.append({"role": "assistant", "content": text, "ended": ended})
    return Action(text, begin, finish)


def _count_error(t: Trajectory, call: str, err: Exception) -> None:
    t.count("env_errors")
    if isinstance(err, EnvTimeout):
        t.count("env_timeouts")
    t.error = t.error or f"{call}: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:300]


def step_env(env: Environment, text: str) -> StepResult | Exception:
    """`env.step(text)` as a `StepResult`, or the exception it raised (its episode's `env_error`)."""
    return guarded(lambda: as_step_result(env.step(text)))()


def step_envs(envs: list[Environment], texts: list[str],
              timeout_s: float | None = None) -> list[StepResult | Exception]:
    """`step_env` of every (environment, action) pair, each in a thread of its own, in the given order.

    The environments' waits (a tool's round trip) overlap instead of adding up. The calling thread
    waits, so its core is given back for the whole turn (`runtime.rows.waiting`); the workers hold
    none. Each environment is stepped once, on its own state (the `Environment` contract), and the
    results are applied afterwards in episode order, so the trajectories are those of a serial loop.
    A turn with an environment that sets `concurrent_steps = False` steps them one at a time, in
    order. Each step has `timeout_s` seconds (`bounded_calls`); a late one is an `EnvTimeout`."""
    calls = [lambda env=env, text=text: step_env(env, text) for env, text in zip(envs, texts)]
    with waiting():
        if len(envs) <= 1 or not all(getattr(env, "concurrent_steps", True) for env in envs):
            return [bounded_calls([call], timeout_s)[0] for call in calls]
        return bounded_calls(calls, timeout_s)


def observe(t: Trajectory, renderer, act: Action, result: StepResult | Exception, *, turn: int,
            limits: Limits) -> None:
    """Apply the environment's answer to `act`: counts, reward, the turn record, the observation or the end."""
    begin, finish, state = act.begin, act.finish, t.state_key
    if isinstance(result, Exception):
        _count_error(t, "step", result)
        t.turns.append(Turn(begin, len(t.ids), len(t.ids), FinishReason.ENV_ERROR, 0.0, state))
        t.finish, t.done, t.reward, t.success = FinishReason.ENV_ERROR, True, 0.0, False
        return
    obs, reward, done, info = result
    for key in ("tool_calls", "tool_errors", "tool_timeouts", "malformed"):
        if info.get(key):
            t.count(key, int(info[key]))
    if info.get("tool_errors") or info.get("tool_timeouts"):
        finish = FinishReason.TOOL_ERROR if finish == FinishReason.STOP else finish
    if info.get("malformed") and finish == FinishReason.STOP:
        finish = FinishReason.MALFORMED
    t.reward += float(reward)
    t.state_key = info.get("state_key", (state, act.text))
    record = Turn(begin, len(t.ids), len(t.ids), finish, float(reward), state)
    t.turns.append(record)
    if done:
        record.finish = FinishReason.DONE if finish in (FinishReason.STOP, FinishReason.TOOL_ERROR) else finish
        t.finish, t.done = record.finish, True
        t.success = bool(info.get("success", t.reward > 0))
        return
    if finish == FinishReason.TOKEN_BUDGET or turn + 1 >= limits.max_turns:
        t.finish, t.done = (finish if finish == FinishReason.TOKEN_BUDGET else FinishReason.TURN_LIMIT), True
        return
    t.messages.append({"role": info.get("role", "tool"), "content": str(obs)})
    obs_ids, exact = renderer.observation(t.ids, t.messages)
    if not exact:
        t.drifted = True
    if len(t.ids) + len(obs_ids) > limits.max_total_tokens:
        t.messages.pop()
        t.finish, t.done = FinishReason.TOKEN_BUDGET, True
        return
    t.add(obs_ids, None, trained=False, turn=turn)
    record.obs_end = len(t.ids)


def check_drift(t: Trajectory, renderer) -> bool:
    """Whether the kept ids differ from the conversation re-rendered from its texts (the
    re-render may extend past the kept ids by trailing template glue)."""
    again = renderer.rerender(t.messages)
    t.drifted = t.drifted or again[:len(t.ids)] != t.ids or len(again) < len(t.ids)
    return t.drifted


def turn_seeds(seeds: torch.Tensor, turn: int) -> torch.Tensor:
    """Per-turn sampling seeds: distinct noise for every (row, turn), a pure function of both."""
    return seeds * 64 + turn


def run_episodes(engine, renderer, envs: list[Environment], episode_seeds: list[int], seeds: torch.Tensor, *,
                 temperature: float | torch.Tensor, limits: Limits, pad_id: int, eos_id: int,
                 prompts: list[str] | None = None) -> list[Trajectory]:
    """Roll out one episode per environment, all in lockstep by turn, through `engine` (any
    `RolloutEngine`). `seeds` (B,) sampling seeds; `episode_seeds` the environments' reset seeds."""
    prompts = prompts or [""] * len(envs)
    trajs = [start_episode(env, s, renderer, p, limits.env_timeout_s)
             for env, s, p in zip(envs, episode_seeds, prompts)]
    for turn in range(limits.max_turns):
        active = [i for i, t in enumerate(trajs) if not t.done]
        if not active:
            break
        ids, mask = left_pad([trajs[i].ids for i in active], pad_id)
        temp = temperature[active] if isinstance(temperature, torch.Tensor) else temperature
        out = engine(ids, mask, turn_seeds(seeds[active], turn), temperature=temp)
        lengths = out.completion_mask.sum(-1).long().tolist()
        acts = []
        for row, i in enumerate(active):
            n = lengths[row]
            new = out.completion_ids[row, :n].tolist()
            acts.append(append_action(trajs[i], renderer, new, out.logprobs[row, :n].tolist(),
                                      ended=bool(n) and new[-1] == eos_id, turn=turn, limits=limits))
        results = step_envs([envs[i] for i in active], [a.text for a in acts], limits.env_timeout_s)
        for i, act, result in zip(active, acts, results):
            observe(trajs[i], renderer, act, result, turn=turn, limits=limits)
    for t in trajs:
        if not t.done:  # only reachable with max_turns == 0
            t.finish, t.done = FinishReason.TURN_LIMIT, True
        check_drift(t, renderer)
    return trajs


def scripted_episode(env: Environment, renderer, seed: int, policy: Callable[[str], str], *,
                     limits: Limits) -> Trajectory:
    """One episode acted by a scripted `policy(observation) -> action text` (demonstrations for
    the supervised warm start): the same token layout and mask as a sampled episode."""
    t = start_episode(env, seed, renderer, "", limits.env_timeout_s)
    for turn in range(limits.max_turns):
        if t.done:
            break
        obs = t.messages[-1]["content"]
        take_turn(t, env, renderer, renderer.action_ids(policy(obs)), None, ended=True, turn=turn, limits=limits)
    check_drift(t, renderer)
    return t
