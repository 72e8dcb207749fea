"""Load user reward functions by path and call them over a batch, capturing per-sample failures.

A reward function has one of five forms, told apart by its signature when it is loaded
(``reward_form``; a signature that fits none is refused there, before any model loads):

- per-sample: ``fn(prompt, completion, **example) -> float | dict | None``
- batched: ``fn(prompts, completions, **columns) -> list[...]`` with ``fn.batched = True``
  (or decorated with ``@batched``); ``columns`` maps each example field to a list; an exception
  in a sample's place of the list is that sample's error
- TRL's: ``fn(completions, **kwargs) -> list[float | None]``, any function with a parameter named
  ``completions`` and no ``batched`` mark. Everything comes as keywords, as TRL's ``GRPOTrainer``
  passes it: ``completions``, ``prompts``, ``completion_ids`` (token ids through EOS; the loop
  gives them), each dataset column as a list, and ``trainer_state`` (``global_step``,
  ``max_steps``). Rows whose prompt is a list of chat messages give ``prompts`` as those messages
  and each completion as ``[{"role": "assistant", "content": text}]``. A function without
  ``**kwargs`` gets only the keywords it names.
- async per-sample: ``async def fn(prompt, completion, **example)`` (all samples run concurrently)
- async batched: ``async def`` with ``fn.batched = True`` (or TRL's form, ``async def``)

Return values: a number is the reward; ``None`` means not scorable (excluded from the advantage,
counted; a TRL-form function's ``None`` beside other functions is TRL's "not applicable": the others'
sum stands); a batched or TRL-form call may return a 1-D tensor or numpy array (as TRL reads it); a
dict must hold ``"reward"`` (a number or None) and its other numeric keys become metrics (mean over the
samples that returned them; a key named like one of rlvr's own per-function metrics, ``mean``,
``errors``, ``unscorable``, ``nonfinite``, ``timeouts``, is an error). A sample whose call raises, or
returns something else, is excluded like ``None`` and counted as an error; a batched call that raises or
returns the wrong length fails every sample. When every sample of a step errors, ``RewardError``
stops the run with one line naming the function and the first error.

A reward function cannot stop or fool the run: a non-finite number (inf, -inf, NaN) is an error
(``<name>/nonfinite``), never a reward; ``SystemExit`` or any other ``BaseException`` raised by
the function is an error of that sample (only ``KeyboardInterrupt`` propagates, so Ctrl-C still
stops the run). With ``workers`` > 0, sync functions run in worker processes
(``rlvr.rewards.workers``), each sample under its own ``timeout_s`` deadline and the workers under
a memory budget (``memory_mb``): a sample past its deadline (``<name>/timeouts``), over the memory
budget (``<name>/memory``) or whose worker died (``<name>/crashes``) gets reward 0, its worker is
killed and replaced, and the other samples are scored as if alone. This holds for functions that
hold the GIL (a backtracking regex, C code), which no thread can stop. A batched or TRL-form call
runs whole under one deadline; past it, its samples are scored one by one, each under its own.
Functions that declare ``in_process = True`` (reward models and judges, which hold a model; tasks
whose grader keeps its own sandbox) and async functions run in the trainer's process, as with
``workers=0``: sync calls in a daemon thread awaited with the deadline (a call past it is
abandoned to its thread, which Python cannot kill), async ones under ``asyncio.wait_for`` per sample
(an async function that blocks without awaiting cannot be timed out). A worker is a fork of the
trainer: what the function changes in its own globals stays in the worker. Breaches never raise
``RewardError``: they are the sample's fault, not the function's. The ``nonfinite``, ``timeouts``,
``memory`` and ``crashes`` metrics appear in the steps where one occurred.

Several functions: ``RewardSum`` calls each (its metrics under its own name) and rewards the
weighted sum; ``load_reward_spec("a.py:right, 0.2*a.py:short")`` reads the ``reward.fn`` form
(comma-separated, each optionally ``WEIGHT*``; `rlvr.rewards.loading`).
"""

from __future__ import annotations

import inspect
import json
import math
import numbers
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from rlvr.errors import ConfigError, RewardError
from rlvr.rewards.calls import CallThread, Deadline, awaited, describe, each_awaited, run_coroutine, side_by_side, where
from rlvr.rewards.combine import weighted_sum
from rlvr.rewards.forms import COMPLETION_IDS, TrainerState, batched, reward_form, reward_values, trl_columns
from rlvr.rewards.loading import load_reward_fn, load_reward_spec, spec_entries  # noqa: F401  re-exported
from rlvr.rewards.workers import BREACHES, CRASH, MEMORY, TIMEOUT, WorkerPool

__all__ = ["RewardBatch", "RewardRunner", "RewardSum", "TrainerState", "batched", "load_reward_fn",
           "load_reward_spec", "reward_form"]

@dataclass
class RewardBatch:
    """Rewards for B samples: ``rewards[i]`` is a float or ``nan`` (not scorable or failed)."""

    rewards: list[float]
    metrics: dict[str, float] = field(default_factory=dict)
    errors: list[str | None] = field(default_factory=list)  # per sample: None or "Type: message"
    # Several functions (`RewardSum`): each one's own per-sample score and its weight in the sum, by
    # name, for advantages that normalise each reward separately (GDPO); empty for one function.
    components: dict[str, list[float]] = field(default_factory=dict)
    weights: dict[str, float] = field(default_factory=dict)


class RewardRunner:
    """Call one reward function over a batch; see the module doc for forms and return values.

    >>> run = RewardRunner(lambda p, c, **ex: {"reward": float(c == ex["answer"]), "len": len(c)}, name="exact")
    >>> out = run(["q", "q"], ["4", "five"], [{"answer": "4"}, {"answer": "4"}])
    >>> out.rewards, out.metrics["exact/len"], out.metrics["exact/errors"]
    ([1.0, 0.0], 2.5, 0.0)
    """

    def __init__(self, fn: Callable, *, name: str | None = None, batched: bool | None = None,
                 timeout_s: float = 0.0, workers: int = 0, memory_mb: int = 0, verifies: object = None):
        if not (isinstance(timeout_s, numbers.Real) and math.isfinite(timeout_s) and timeout_s >= 0):
            raise ConfigError(f"reward.timeout_s: must be a number >= 0 (0 = no limit), got {timeout_s!r}")
        if not (isinstance(workers, int) and workers >= 0):
            raise ConfigError(f"reward.workers: must be an integer >= 0 (0 = in the trainer's process), "
                              f"got {workers!r}")
        self.fn = fn
        self.verifies = verifies  # the task whose own verifier `fn` is (`derives_correct`), else None
        self.timeout_s = float(timeout_s)
        self._warned_unscorable = False
        self.beside_others = False  # a TRL-form function among others: its None leaves a sample to them
        # each calling thread's own worker: batches scored at once (`collect.produce_ahead`) never queue
        self._calls = threading.local()  # behind each other's calls
        self.name = name or getattr(fn, "__name__", "reward")
        self.form = reward_form(fn) if batched is None else ("batched" if batched else "sample")
        self.state = TrainerState()  # `trainer_state` of TRL-form functions; `on_step_begin` moves it
        # The __call__ method itself is inspected (an object with an ``async def __call__``), not callability.
        self.is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
            getattr(fn, "__call__", None))  # noqa: B004
        # Worker processes, where a call can be stopped; a model (in_process) or an event loop stays here.
        self.pool = None if (workers == 0 or self.is_async or getattr(fn, "in_process", False)) else WorkerPool(
            {"fn": fn}, size=workers, memory_mb=memory_mb, name=f"reward {self.name}")

    def __call__(self, prompts: list[str], completions: list[str], examples: list[dict[str, Any]]) -> RewardBatch:
        n = len(completions)
        if not (len(prompts) == len(examples) == n):
            raise ValueError(f"reward {self.name}: {len(prompts)} prompts, {n} completions, {len(examples)} examples")
        # A row's chat messages ride as its "prompt" column (`DatasetTask`); TRL-form functions get them.
        chats = [ex.get("prompt") if isinstance(ex.get("prompt"), list) else None for ex in examples]
        ids = [ex.get(COMPLETION_IDS) for ex in examples]
        # ``dataclasses.asdict(example)`` carries "prompt" too; it is passed positionally already.
        examples = [{k: v for k, v in ex.items() if k not in ("prompt", "completion", COMPLETION_IDS)}
                    for ex in examples]
        if self.form == "trl":
            raw = self._call_trl(prompts, completions, examples, chats, None if None in ids else ids)
        elif self.form == "batched":
            raw = self._call_batched(prompts, completions, examples)
        else:
            raw = self._call_each(prompts, completions, examples)
        return self._collect(raw)

    @property
    def reads_step(self) -> bool:
        """Only TRL-form functions see the step (`trainer_state`)."""
        return self.form == "trl"

    def on_step_begin(self, step: int, steps: int) -> None:
        """Step `step` of `steps` starts: ``step - 1`` optimizer steps are done (TRL's ``global_step``)."""
        self.state.global_step, self.state.max_steps = step - 1, steps

    # Each call path returns a list of (value, error-string-or-None).

    def _call_each(self, prompts, completions, examples) -> list[tuple[Any, str | None]]:
        calls = [((p, c), ex) for p, c, ex in zip(prompts, completions, examples)]
        if self.is_async:
            return each_awaited(self.fn, calls, self.timeout_s, self._timeout_error())
        return self._calls_of(calls)

    def _calls_of(self, calls: list[tuple[tuple, dict]], fn: Callable | None = None) -> list[tuple[Any, str | None]]:
        """Each call of `fn` (default: the function) under its own deadline, in the workers when there are."""
        if self.pool is not None and fn is None:
            return [(v, self._breach(e)) for v, e in self.pool.run("fn", calls, self.timeout_s)]
        fn, out = fn or self.fn, []
        for i, (args, kwargs) in enumerate(calls):
            out.append(self._guarded(fn, args, kwargs))
            error = out[-1][1]
            if error is not None and error.startswith(TIMEOUT + ":") and i + 1 < len(calls):
                return out + side_by_side(fn, calls[i + 1:], self.timeout_s, error)
        return out

    def _breach(self, error: str | None) -> str | None:
        return self._timeout_error() if error and error.startswith(TIMEOUT + ":") else error

    def derives_correct(self, task) -> bool:
        """Whether `task.is_correct` of a sample is "this call's reward is 1.0": `fn` is the task's own
        verifier and the task declares ``correct_is_full_reward``. Then the trainer reads correctness
        off the reward call and asks nothing twice (a completion that stalls the verifier does it once)."""
        return self.verifies is task and getattr(task, "correct_is_full_reward", False)

    def correct_in_workers(self, task) -> bool:
        """Whether `correct` asks `task` in worker processes (then it may run beside a reward call)."""
        if self.pool is None or getattr(task, "in_process", False):
            return False
        self.pool.register("correct", task.is_correct)  # before the workers fork, so they have it
        return True

    def judged(self, task, group: list, texts: list[str], examples: list[dict]) -> tuple[RewardBatch, list[bool]]:
        return judge_batch(self, task, group, texts, examples)

    def correct(self, task, group: list, texts: list[str]) -> list[bool]:
        """`task.is_correct` of each text under the same deadline and in the same workers as the rewards;
        a breach or an error is "not correct". A task that declares ``in_process`` is asked here."""
        calls = [((text, ex), {}) for text, ex in zip(texts, group)]
        if self.correct_in_workers(task):
            return [e is None and v is True for v, e in self.pool.run("correct", calls, self.timeout_s)]
        return [e is None and bool(v) for v, e in self._calls_of(calls, task.is_correct)]

    def _call_trl(self, prompts, completions, examples, chats, ids) -> list[tuple[Any, str | None]]:
        """TRL's call: everything as keywords, the columns as lists (`GRPOTrainer._calculate_rewards`)."""
        if all(chat is not None for chat in chats):
            prompts, completions = chats, [[{"role": "assistant", "content": c}] for c in completions]
        examples = [trl_columns(ex) for ex in examples]  # a file task's row: every column, as TRL passes them
        keys = sorted({k for ex in examples for k in ex} - {"completions"})
        kwargs = {**{k: [ex.get(k) for ex in examples] for k in keys}, "prompts": list(prompts),
                  "trainer_state": self.state, **({COMPLETION_IDS: [list(i) for i in ids]} if ids else {})}
        params = inspect.signature(self.fn).parameters
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            kwargs = {k: v for k, v in kwargs.items() if k in params}
        if self.pool is not None:
            def one(i):  # sample i alone, as TRL would pass a batch of one
                return (), {k: (v if k == "trainer_state" else v[i:i + 1]) for k, v in
                            {**kwargs, "completions": completions}.items()}
            return self._pooled_batch(((), {**kwargs, "completions": completions}), one, len(completions))
        fn = self.fn
        return self._call_batched(prompts, completions, [],
                                  call=lambda _prompts, completions: fn(completions=completions, **kwargs))

    def _call_batched(self, prompts, completions, examples, call=None) -> list[tuple[Any, str | None]]:
        keys = sorted({k for ex in examples for k in ex})
        columns = {k: [ex.get(k) for ex in examples] for k in keys}
        fn = call or self.fn
        if self.pool is not None:
            def one(i):
                return ([prompts[i]], [completions[i]]), {k: v[i:i + 1] for k, v in columns.items()}
            return self._pooled_batch(((list(prompts), list(completions)), columns), one, len(completions))

        def call(prompts, completions, **columns):
            values = fn(prompts, completions, **columns)
            if inspect.isawaitable(values):
                values = run_coroutine(awaited(values, self.timeout_s))
            return reward_values(values)  # a 1-D tensor or array as TRL reads it; one number is an error

        values, error = self._guarded(call, (list(prompts), list(completions)), columns)
        if error is None and len(values) != len(completions):
            error = f"ValueError: returned {len(values)} values for {len(completions)} samples"
        if error is not None:
            return [(None, error)] * len(completions)
        # An exception in a sample's place is that sample's error (a judge's unparsable verdict).
        return [(None, describe(v)) if isinstance(v, BaseException) else (v, None) for v in values]

    def _pooled_batch(self, whole: tuple[tuple, dict], one: Callable[[int], tuple[tuple, dict]],
                      n: int) -> list[tuple[Any, str | None]]:
        """A batched call in a worker under one deadline; past it (or over memory, or crashed),
        each sample alone under its own, so only the samples that breach are lost."""
        values, error = self._calls_of([whole])[0]
        if error is not None and error.startswith(BREACHES) and n > 1:
            parts = self._calls_of([one(i) for i in range(n)])
            parts = [(v, e) if e is not None else (_listed(v), None) for v, e in parts]
            return [(None, e) if e is not None else (v[0], None) if isinstance(v, list) and len(v) == 1 else
                    (None, "ValueError: a batch of one did not return one value") for v, e in parts]
        if error is None:
            try:
                values = reward_values(values)
            except TypeError as err:
                error = f"TypeError: a batched reward {err}, not a list of one value per completion"
        if error is None and len(values) != n:
            error = f"ValueError: returned {len(values)} values for {n} samples"
        if error is not None:
            return [(None, error)] * n
        return [(None, describe(v)) if isinstance(v, BaseException) else (v, None) for v in values]

    def _guarded(self, fn: Callable, args: tuple, kwargs: dict) -> tuple[Any, str | None]:
        """(value, None) or (None, error) for one call: any exception but KeyboardInterrupt is an
        error, and so is running past `timeout_s` (the call then goes on in its abandoned thread)."""
        if not self.timeout_s:
            try:
                return fn(*args, **kwargs), None
            except KeyboardInterrupt:
                raise
            except BaseException as err:  # noqa: BLE001 - one bad sample must not stop the run
                return None, describe(err)
        worker = getattr(self._calls, "worker", None)
        if worker is None or worker.stuck:
            worker = self._calls.worker = CallThread(self.name)
        future = worker.submit(fn, args, kwargs)
        try:
            return future.result(timeout=self.timeout_s), None
        except KeyboardInterrupt:
            raise
        except Deadline:
            return None, self._timeout_error()
        except TimeoutError:
            if not future.done():  # else the function itself raised TimeoutError: an ordinary error
                worker.stuck = True
                return None, self._timeout_error()
            return None, describe(future.exception())
        except BaseException as err:  # noqa: BLE001
            return None, describe(err)

    def _timeout_error(self) -> str:
        return f"{TIMEOUT}: took longer than reward.timeout_s={self.timeout_s:g}s"

    def _collect(self, raw: list[tuple[Any, str | None]]) -> RewardBatch:
        rewards, errors, extra = [], [], {}
        unscorable = 0
        for value, error in raw:
            reward = None
            if error is None:
                if isinstance(value, dict):
                    if "reward" not in value:
                        error = f"ValueError: dict reward without a 'reward' key (keys: {sorted(value)})"
                    elif taken := sorted(set(value) & set(OWN_METRICS)):
                        error = (f"ValueError: dict reward key {taken[0]!r} is the name of rlvr's own metric "
                                 f"reward/{self.name}/{taken[0]}; rename that key")
                    else:
                        reward = value["reward"]
                        for k, v in value.items():
                            if k != "reward" and isinstance(v, numbers.Real) and not isinstance(v, bool):
                                if math.isfinite(v):  # a non-finite side metric would poison its mean
                                    extra.setdefault(k, []).append(float(v))
                            elif k != "reward" and isinstance(v, bool):
                                extra.setdefault(k, []).append(float(v))
                else:
                    reward = value
                if error is None and reward is not None and (
                        isinstance(reward, bool) or not isinstance(reward, numbers.Real)):
                    error = f"TypeError: reward must be a number, dict or None, got {type(reward).__name__}"
                    reward = None
                if error is None and reward is not None and not math.isfinite(reward):
                    error = f"{NONFINITE_ERROR}: reward is {float(reward)!r}, not a finite number"
                    reward = None
            if error is None and reward is None:
                unscorable += 1
            if error is not None and error.startswith(BREACHES):
                reward = 0.0  # a completion that stalls or bloats the verifier earns nothing, and trains
            rewards.append(math.nan if reward is None else float(reward))
            errors.append(error)
        n_err = sum(e is not None for e in errors)
        source = where(self.fn)
        named = self.name if source in (self.name, "") else f"{self.name} ({source})"
        if raw and unscorable == len(raw) and not self._warned_unscorable and not self.beside_others:
            self._warned_unscorable = True  # once: a step of nothing scorable can be legitimate, a run of them not
            print(f"warning: reward {named} returned None (not scorable) for all {len(raw)} samples of a step: "
                  f"they do not train; return a number where the completion can be scored", file=sys.stderr)
        if raw and n_err == len(raw) and not any(e.startswith(BREACHES) for e in errors):
            first = next(e for e in errors if e)
            raise RewardError(f"reward {named} failed on all {len(raw)} samples of this step; first error: {first}; "
                              f"fix the function so it returns a finite number (None = unscorable)")
        metrics = {f"{self.name}/errors": float(n_err), f"{self.name}/unscorable": float(unscorable)}
        for kind, prefix in (("nonfinite", NONFINITE_ERROR), ("timeouts", TIMEOUT), ("memory", MEMORY),
                             ("crashes", CRASH)):
            count = sum(bool(e) and e.startswith(prefix + ":") for e in errors)
            if count:
                metrics[f"{self.name}/{kind}"] = float(count)
        ok = [r for r in rewards if not math.isnan(r)]
        if ok:
            metrics[f"{self.name}/mean"] = sum(ok) / len(ok)
        for k, vs in extra.items():
            metrics[f"{self.name}/{k}"] = sum(vs) / len(vs)
        return RewardBatch(rewards, metrics, errors)


NONFINITE_ERROR = "NonFiniteReward"
OWN_METRICS = ("mean", "errors", "unscorable", "nonfinite", "timeouts", "memory", "crashes")
"""What `_collect` reports per reward function: a dict reward's side metric of one of these names
would overwrite it, so such a key is an error."""


def _listed(values: Any) -> Any:
    """`reward_values(values)`, or `values` as they are when they are no list of any kind."""
    try:
        return reward_values(values)
    except TypeError:
        return values


class RewardSum:
    """Several reward functions as one: each runs as a `RewardRunner` (its metrics under its own
    name), and the reward is the weighted sum, not scorable (nan) when a function with non-zero
    weight could not score the sample (``rlvr.rewards.combine.weighted_sum``).

    Names: a single function is ``user`` (metrics ``reward/user/...``); several use their
    ``__name__`` (made unique with ``_2``, ``_3``), and the batch also carries each one's own
    scores (``RewardBatch.components``) and weights, which GDPO normalises one by one.
    ``columns=True``: each example's ``meta`` holds
    dataset columns, passed to the functions as the keywords (``fn(prompt, completion, **columns)``)
    instead of the example's fields.

    >>> right = lambda p, c, **ex: float(c == ex["answer"])
    >>> short = lambda p, c, **ex: 1.0 / len(c)
    >>> out = RewardSum([right, short], [1.0, 0.5])(["q", "q"], ["4", "44"], [{"answer": "4"}] * 2)
    >>> out.rewards, sorted(out.metrics)[:2]
    ([1.5, 0.25], ['lambda/errors', 'lambda/mean'])
    """

    def __init__(self, fns: Sequence[Callable], weights: Sequence[float] | None = None, *, columns: bool = False,
                 timeout_s: float = 0.0, workers: int = 0, memory_mb: int = 0):
        if not fns:
            raise ValueError("RewardSum needs at least one function")
        weights = [1.0] * len(fns) if weights is None else [float(w) for w in weights]
        if len(weights) != len(fns):
            raise ValueError(f"{len(weights)} weights for {len(fns)} reward functions")
        self.runners = [RewardRunner(fn, name=name, timeout_s=timeout_s, workers=workers, memory_mb=memory_mb)
                        for fn, name in zip(fns, _names(fns))]
        self.weights = dict(zip((r.name for r in self.runners), weights))
        for runner in self.runners:
            runner.beside_others = runner.form == "trl" and len(self.runners) > 1
        self.columns = columns
        self._recent: dict[tuple[str, str, str], float] = {}

    @property
    def names(self) -> list[str]:
        return [r.name for r in self.runners]

    @property
    def reads_step(self) -> bool:
        return any(runner.reads_step for runner in self.runners)

    def on_step_begin(self, step: int, steps: int) -> None:
        for runner in self.runners:
            runner.on_step_begin(step, steps)

    def __call__(self, prompts: list[str], completions: list[str], examples: list[dict[str, Any]]) -> RewardBatch:
        ids = [ex.get(COMPLETION_IDS) for ex in examples]  # beside the columns, for TRL-form runners
        examples = [ex.get("meta") or {} for ex in examples] if self.columns else [
            {k: v for k, v in ex.items() if k != COMPLETION_IDS} for ex in examples]  # (and `_recent`'s keys)
        given = [{**ex, COMPLETION_IDS: i} if i is not None else ex for ex, i in zip(examples, ids)]
        parts = [runner(prompts, completions, given) for runner in self.runners]
        rewards = weighted_sum(self._applicable(parts), self.weights)
        metrics = {k: v for b in parts for k, v in b.metrics.items()}
        errors = [next((e for e in sample if e), None) for sample in zip(*(b.errors for b in parts))]
        # Correctness is asked per sample right after the batch is scored: answer it from here.
        self._recent = {(p, c, _key(ex)): r for p, c, ex, r in zip(prompts, completions, examples, rewards)}
        components = {r.name: b.rewards for r, b in zip(self.runners, parts)} if len(parts) > 1 else {}
        return RewardBatch(rewards, metrics, errors, components, dict(self.weights) if components else {})

    def _applicable(self, parts: list[RewardBatch]) -> dict[str, list[float]]:
        """Each function's rewards for the weighted sum: a TRL-form None is "not applicable" (TRL's `nansum`),
        adding nothing where another weighted function scored the sample; a sample none scored, an rlvr-form
        None and any error leave it unscorable (`weighted_sum`)."""
        weighted = [b for r, b in zip(self.runners, parts) if self.weights[r.name] != 0]
        scored = [any(not math.isnan(b.rewards[i]) for b in weighted) for i in range(len(parts[0].rewards))]
        return {r.name: [0.0 if r.form == "trl" and math.isnan(v) and e is None and ok else v
                         for v, e, ok in zip(b.rewards, b.errors, scored)] if r.form == "trl" else b.rewards
                for r, b in zip(self.runners, parts)}

    def judged(self, task, group: list, texts: list[str], examples: list[dict]) -> tuple[RewardBatch, list[bool]]:
        return judge_batch(self, task, group, texts, examples)

    def correct(self, task, group: list, texts: list[str]) -> list[bool]:
        """`task.is_correct` per text, bounded as the rewards are (`RewardRunner.correct`)."""
        return self._judge().correct(task, group, texts)

    def correct_in_workers(self, task) -> bool:
        return self._judge().correct_in_workers(task)

    def derives_correct(self, task) -> bool:  # a sum's reward of 1 is not the task's verdict
        return False

    def _judge(self) -> RewardRunner:
        return next((r for r in self.runners if r.pool is not None), self.runners[0])

    def score_one(self, prompt: str, completion: str, example: dict[str, Any]) -> float:
        """The weighted reward of one sample (nan = not scorable): from the last batch when it was
        scored there, else by calling the functions. `example` is what a function receives
        (the columns when ``columns=True``)."""
        cached = self._recent.get((prompt, completion, _key(example)))
        if cached is not None:
            return cached
        parts = []
        for runner in self.runners:
            try:
                parts.append(runner([prompt], [completion], [example]).rewards)
            except RewardError:  # one sample that raised: not scorable, as in a batch
                parts.append([math.nan])
        return weighted_sum({r.name: v for r, v in zip(self.runners, parts)}, self.weights)[0]


def _names(fns: Sequence[Callable]) -> list[str]:
    if len(fns) == 1:
        return ["user"]
    names, seen = [], {}
    for fn in fns:
        base = "".join(ch if ch.isalnum() or ch == "_" else "" for ch in getattr(fn, "__name__", "reward")) or "reward"
        seen[base] = seen.get(base, 0) + 1
        names.append(base if seen[base] == 1 else f"{base}_{seen[base]}")
    return names


def _key(example: dict[str, Any]) -> str:
    return json.dumps(example, sort_keys=True, default=str)


def judge_batch(verifier: RewardRunner | RewardSum, task, group: list, texts: list[str],
                examples: list[dict]) -> tuple[RewardBatch, list[bool]]:
    """The rewards of a batch and each completion's `task.is_correct`, under the verifier's deadlines:
    read off the reward call where correctness is "the reward is 1" (`derives_correct`), else asked
    beside the reward call when both run in worker processes, so a completion that stalls both costs
    one deadline, not two."""
    prompts = [ex.prompt for ex in group]
    if verifier.derives_correct(task):
        out = verifier(prompts, texts, examples)
        return out, [r == 1.0 for r in out.rewards]
    if not verifier.correct_in_workers(task):
        out = verifier(prompts, texts, examples)
        return out, verifier.correct(task, group, texts)
    with ThreadPoolExecutor(1, thread_name_prefix="rlvr-correct") as side:
        verdicts = side.submit(verifier.correct, task, group, texts)
        out = verifier(prompts, texts, examples)
        return out, verdicts.result()
