"""`trainer.backend=ray`: rollout workers and reward scorers as Ray actors (the one module that imports ray).

The builder hands this module what the workers build (`make_engine(model, tokenizer)`,
`make_reward(tokenizer)`: picklable functions of the run's config), so the backend never reads the
config itself. The learner stays in the driver process, which owns the run directory, the signals and the
checkpoints; the asynchronous schedule (`async_loop`) is the same as with the local
backend, and only two seams move out of the process:

- `RayEngine` is a `protocols.WeightSyncEngine`: each of `trainer.rollout_workers` actors holds
  its own copy of the weights (`snapshot.SnapshotEngine`, or with `rollout.engine=vllm` its own
  vLLM engine, started with the worker's threads) and samples a contiguous share
  of the batch's rows (each row has its own seed, so the shares stack into the batch's samples).
  `push_weights` puts the weights into Ray's object store once and every worker loads them with
  the version; each worker returns the version it sampled with, and the engine checks they agree.
- `RayReward` scores a batch on `trainer.reward_workers` actors, at most two calls in flight per
  actor (back-pressure: the rest wait in the driver, not in an unbounded actor queue).

Faults: a worker that dies (killed, out of memory) is restarted by Ray (`max_restarts=-1`); its
failed call is not retried by Ray (`max_task_retries=0`, since a restarted worker holds the
weights it was built with), but here: the newest weights are pushed into it first, then its
share is sampled again. The batch is accepted once, whole, so no rollout is lost or counted
twice (a test kills a worker mid-run and gets the metrics of an undisturbed run).
Every `ray.get` has a timeout.
"""

from __future__ import annotations

import os
import time
import weakref
from concurrent.futures import ThreadPoolExecutor

import torch

from rlvr.batch import Rollouts, concat_rollouts
from rlvr.engines.rows import split_engine
from rlvr.engines.snapshot import SnapshotEngine, frozen_copy
from rlvr.errors import ConfigError
from rlvr.rewards.runner import RewardBatch
from rlvr.runtime.rows import RowPool

TIMEOUT_S = 600.0  # one batch of one worker; a hung worker fails the run instead of stalling it
RESTART_ATTEMPTS = 3
_ENGINES: weakref.WeakSet = weakref.WeakSet()


def _ray():
    try:
        import ray
    except ImportError:
        raise ConfigError("trainer.backend: 'ray' needs Ray; pip install 'rlvr[ray]' or use trainer.backend=local") \
            from None
    return ray


def ensure_ray(address: str, cores: int):
    """Ray, initialised: joined to `address` (`auto` = the cluster `ray start --head` started), or a
    local one with `cores` CPUs; a Ray the caller already initialised is used as it is."""
    ray = _ray()
    if not ray.is_initialized():
        options = {"include_dashboard": False, "log_to_driver": False}
        if address:
            ray.init(address=address, **options)
        else:
            ray.init(num_cpus=cores, **options)
    return ray


def running_engines() -> list[RayEngine]:
    """The Ray engines of this process that are not closed (tests kill their workers)."""
    return [e for e in _ENGINES if e.workers]


class _RolloutWorker:
    """One rollout worker process: a snapshot of the weights and the configured sampler over it."""

    def __init__(self, make_engine, model, tokenizer, version: int, threads: int, rows_mode: bool,
                 own_weights: bool):
        torch.set_num_threads(1 if rows_mode else threads)  # this process's share (runtime.thread_budget)
        if own_weights:  # pushes go straight to it (vLLM keeps these threads)
            self.engine = make_engine(model, tokenizer)
            self.engine.policy_version = version
            return
        rows = RowPool(threads) if rows_mode and threads > 1 else None

        def make(m):
            engine = make_engine(m, tokenizer)
            return split_engine(engine, rows, tokenizer.pad_token_id, m) if rows is not None else engine

        self.engine = SnapshotEngine(model, make, version=version, copy_model=False)

    def generate(self, prompt_ids, prompt_mask, seeds, kwargs) -> tuple[Rollouts, int]:
        return self.engine(prompt_ids, prompt_mask, seeds, **kwargs), self.engine.policy_version

    def push_weights(self, tensors, version: int) -> int:
        self.engine.push_weights(tensors, version)
        return version

    def pid(self) -> int:
        return os.getpid()

    def facts(self) -> dict:
        """What this worker runs: its sampler, torch's threads and the cores it may use (the thread budget)."""
        return {"engine": type(self.engine).__name__, "torch_threads": torch.get_num_threads(),
                "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()}


class _RewardWorker:
    """One reward-scoring process: the run's verifier, built from the config."""

    def __init__(self, make_reward, tokenizer):
        self.reward = make_reward(tokenizer)

    def score(self, prompts, texts, examples, progress: tuple[int, int] | None = None) -> RewardBatch:
        """`progress` (step, steps): the step whose batch this is, for TRL-form rewards' `trainer_state`."""
        if progress is not None:  # the builder's verifier (`build_verifier`) is a `BatchVerifier`
            self.reward.on_step_begin(*progress)
        return self.reward(prompts, texts, examples)


def _slices(rows: int, parts: int) -> list[slice]:
    bounds = [rows * i // parts for i in range(parts + 1)]
    return [slice(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]


class RayEngine:
    """A `WeightSyncEngine` over `workers` Ray actors, each with `threads` threads."""

    def __init__(self, make_engine, model, tokenizer, *, workers: int, threads: int, rows_mode: bool, version: int,
                 own_weights: bool):
        ray = _ray()
        self.ray, self.pad_id, self.policy_version = ray, tokenizer.pad_token_id, version
        actor = ray.remote(num_cpus=threads, max_restarts=-1, max_task_retries=0)(_RolloutWorker)
        # Held for the run: Ray rebuilds a restarted worker from its constructor's arguments.
        self._model = ray.put(frozen_copy(model).cpu())
        self.workers = [actor.remote(make_engine, self._model, tokenizer, version, threads, rows_mode, own_weights)
                        for _ in range(workers)]
        self._weights = None  # (object ref, version) of the newest push, for restarted workers
        self.restarts = 0
        ray.get([w.pid.remote() for w in self.workers], timeout=TIMEOUT_S)  # built, or fail here
        _ENGINES.add(self)

    def __call__(self, prompt_ids, prompt_mask, seeds, **kwargs) -> Rollouts:
        parts = _slices(len(seeds), len(self.workers))
        calls = {i: self._call(i, prompt_ids[s], prompt_mask[s], seeds[s], kwargs) for i, s in enumerate(parts)}
        results = {}
        for i, ref in calls.items():
            results[i] = self._result(i, ref, prompt_ids[parts[i]], prompt_mask[parts[i]], seeds[parts[i]], kwargs)
        versions = {version for _, version in results.values()}
        if versions != {self.policy_version}:
            raise RuntimeError(f"rollout workers sampled with versions {sorted(versions)}, expected "
                               f"{self.policy_version}")
        return concat_rollouts([results[i][0] for i in range(len(parts))], self.pad_id)

    def _call(self, i, ids, mask, seeds, kwargs):
        return self.workers[i].generate.remote(ids, mask, seeds, kwargs)

    def _result(self, i, ref, ids, mask, seeds, kwargs):
        """Worker `i`'s share, sampled with the current version: a worker that died (the call
        fails) or was restarted before the call (it answers with the version it was built with)
        gets the newest weights, then samples its share again."""
        ray = self.ray
        for _ in range(RESTART_ATTEMPTS):
            try:
                rollouts, version = ray.get(ref, timeout=TIMEOUT_S)
                if version == self.policy_version:
                    return rollouts, version
            except self._dead:
                pass
            self._restore(i)
            ref = self._call(i, ids, mask, seeds, kwargs)
        return ray.get(ref, timeout=TIMEOUT_S)

    @property
    def _dead(self) -> tuple[type, ...]:
        """What a call to a dead or restarting actor raises."""
        return self.ray.exceptions.RayActorError, self.ray.exceptions.ActorUnavailableError

    def _restore(self, i: int) -> None:
        """Worker `i` died: wait while Ray restarts it, then give it the newest weights."""
        self.restarts += 1
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            try:
                call = (self.workers[i].push_weights.remote(*self._weights) if self._weights is not None
                        else self.workers[i].pid.remote())
                self.ray.get(call, timeout=TIMEOUT_S)
                return
            except self._dead:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def push_weights(self, named_tensors, version: int) -> None:
        ray = self.ray
        ref = ray.put([(name, t.detach().cpu()) for name, t in named_tensors])
        self._weights = (ref, version)
        for i, worker in enumerate(self.workers):
            try:
                ray.get(worker.push_weights.remote(ref, version), timeout=TIMEOUT_S)
            except self._dead:  # died between batches: the restarted one gets them now
                self._restore(i)
        self.policy_version = version

    def worker_pids(self) -> list[int]:
        return self.ray.get([w.pid.remote() for w in self.workers], timeout=TIMEOUT_S)

    def close(self) -> None:
        for worker in self.workers:
            self.ray.kill(worker, no_restart=True)
        self.workers = []


class RayReward:
    """The run's verifier on `workers` Ray actors: `reward(prompts, completions, examples) -> RewardBatch`.

    One worker scores a batch in one call (the same numbers as in-process); several split it into
    contiguous chunks, at most two in flight per worker, and average each metric over the chunks by
    their sizes (exact for metrics every sample reports). `on_step_begin(step, steps)` is sent
    with every later call, so each worker's verifier (a restarted one too) knows the step it scores."""

    def __init__(self, make_reward, tokenizer, *, workers: int, local=None):
        ray = _ray()
        self.ray = ray
        self.progress: tuple[int, int] | None = None
        self.local = local  # the driver's own verifier: asks `task.is_correct` under its per-sample deadlines
        actor = ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1)(_RewardWorker)  # pure: retry is safe
        self.workers = [actor.remote(make_reward, tokenizer) for _ in range(workers)]

    def __call__(self, prompts, texts, examples) -> RewardBatch:
        chunks = _slices(len(texts), len(self.workers) * 2 if len(self.workers) > 1 else 1)
        pending, done, free = {}, {}, [w for _ in range(2) for w in self.workers]  # two slots per worker
        queue = list(enumerate(chunks))
        while queue or pending:
            while queue and free:
                index, s = queue.pop(0)
                worker = free.pop(0)
                pending[worker.score.remote(prompts[s], texts[s], examples[s], self.progress)] = (index, worker)
            ready, _ = self.ray.wait(list(pending), num_returns=1, timeout=TIMEOUT_S)
            if not ready:
                raise TimeoutError(f"reward workers gave no result in {TIMEOUT_S:.0f} s")
            index, worker = pending.pop(ready[0])
            done[index] = self.ray.get(ready[0], timeout=TIMEOUT_S)
            free.append(worker)
        return _merge_rewards([done[i] for i in range(len(chunks))], [s.stop - s.start for s in chunks])

    def on_step_begin(self, step: int, steps: int) -> None:
        self.progress = (step, steps)

    def judged(self, task, group: list, texts: list[str], examples: list[dict]) -> tuple[RewardBatch, list[bool]]:
        """The batch's rewards from the workers and `task.is_correct` of each completion under the same
        per-sample deadlines as in one process: read off the rewards where the driver's verifier says
        correctness is "the reward is 1", else asked through its worker processes beside the workers'
        call (`rlvr.rewards.runner.judge_batch`'s choices)."""
        local = self.local
        if local is not None and getattr(local, "derives_correct", lambda task: False)(task):
            out = self([ex.prompt for ex in group], texts, examples)
            return out, [r == 1.0 for r in out.rewards]
        with ThreadPoolExecutor(1, thread_name_prefix="rlvr-correct") as side:
            verdicts = side.submit(self.correct, task, group, texts)
            return self([ex.prompt for ex in group], texts, examples), verdicts.result()

    def correct(self, task, group: list, texts: list[str]) -> list[bool]:
        if self.local is None:  # no verifier of the driver's: asked here, unbounded (the API's own verifiers)
            return [bool(task.is_correct(text, ex)) for ex, text in zip(group, texts)]
        return self.local.correct(task, group, texts)

    def close(self) -> None:
        for worker in self.workers:
            self.ray.kill(worker, no_restart=True)
        self.workers = []


def _merge_rewards(parts: list[RewardBatch], sizes: list[int]) -> RewardBatch:
    if len(parts) == 1:
        return parts[0]
    total = sum(sizes)
    keys = {k for p in parts for k in p.metrics}
    metrics = {k: sum(p.metrics.get(k, 0.0) * n for p, n in zip(parts, sizes)) / total for k in sorted(keys)}
    components = {k: [v for p in parts for v in p.components[k]] for k in parts[0].components}
    return RewardBatch([r for p in parts for r in p.rewards], metrics, [e for p in parts for e in p.errors],
                       components, parts[0].weights)
