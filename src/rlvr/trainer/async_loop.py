"""Asynchronous rollouts with bounded staleness (`trainer.max_staleness=η`).

A rollout side generates and scores the batches of later steps while the learner trains on the
current one. It samples from its own copy of the weights (`snapshot.SnapshotEngine`); after
every update the learner publishes its weights with the new version (the number of updates
so far) and the rollout side pushes the newest into its copy before its next batch.

Admission (AReaL's `max_head_offpolicyness`): the learner trains step k with version k-1, so the
batch of step k may start only once version k-1-η is published; a batch is therefore at most η
versions stale when it is trained on. η = 0 lets no batch start before the previous update is
published: the same draws in the same order as the synchronous loop, so its metrics are the
same bit for bit (a test checks it). η = 1 is one-step-off overlap. Which admissible version a
batch gets depends on the two sides' pace; `trainer.staleness=exact` makes it always k-1-η
(the slot keeps every published version until the rollout side has taken it), so the run does
not depend on timing. The queue between the sides
holds at most max(η, 1) batches.

Score-ahead: when nothing that samples reads a reward first (`collect.scores_ahead`: one round, uniform
draws, a single-turn task), the rollout side samples a batch, hands it to a scoring pool of η + 1
threads and starts the next one; the queue holds each batch's Future, in step order, and the learner
waits on it. The verifier's wait (a judge, a sandbox) then overlaps the next batches' sampling, the
update and the other batches' scoring, and holds no core. A batch counts toward η from the version
its sampling started with, so the bound is as without it; the run RNG's draws all happen in the
rollout thread in the synchronous order, so η = 0 is still the synchronous loop bit for bit. A verifier
that reads the step (TRL-form `trainer_state`) has each batch's step set just before it is scored,
one such batch at a time. Each batch comes from one version (no in-flight weight update), except under
partial rollouts (`trainer.partial_rollouts`): then an update reaches the batch in flight, between
chunks of tokens in the own sampler (`SnapshotEngine.follow`) or pushed to the servers mid-request
(`_pushed_in_flight`), and each token records its version (`token_staleness`: the per-token bound
and the `rollout/staleness_*` metrics). A stale batch trains with the decoupled PPO objective
(`sync.rl_step`), each token weighted by pi_prox over its own sampling version's log-prob.

The rollout side owns the prompt RNG and the sampler; each batch carries their state after it,
which is what a checkpoint of its step records, so a resumed run restarts the rollout side at
the step after its checkpoint (batches generated past it are discarded, never trained twice).

Cores (laid out by the builder, `builder.placement.thread_layout`): with rows split over threads
(`trainer.thread_mode=rows`, the default for causal models) the two sides share all of the
process's cores through one `rows.CoreLease`: each holds a core
while it works, and its row pool computes on the other one too whenever the other side waits (for
admission, queue space or a batch), so the faster side's idle core goes to the slower one and the
threads computing never outnumber `trainer.threads`. Each side splits its rows as the synchronous
loop does. Other modes and the Ray backend give each side a fixed share (`runtime.thread_budget`).

Data-parallel learners (FSDP2 ranks): each rank's rollout thread samples its share of every batch
from a snapshot of the plain full weights (`engines.ranks.RankEngine`) and the ranks exchange the
shares on a process group of the rollout side's own (`distributed.side_group`): on the default
group its collectives would pair up with the update's in a different order on each rank. The
learner gathers the step's weights into the plain copy on every rank (`sync.push_weights`) and
publishes that copy, so every rank's snapshot of a version is the same. Overlapping the update
(η >= 1) takes the exact schedule, so that the ranks sample a batch from the same version, and
each rank runs its batches whole: lanes of a row pool on the other side's idle core would unshard
a layer mid-forward.

Where the rollout side runs is the backend's business: a thread here (`LocalRollouts`), Ray
actors behind the same seams in `backends.ray` (the sampler as a `WeightSyncEngine`, the verifier).
With `rollout.engine=vllm` the local rollout side pushes into the run's one vLLM engine, which the
learner's evaluation shares (`snapshot.SharedEngine`); Ray workers each start their own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from rlvr.engines.snapshot import published
from rlvr.protocols import WeightSyncEngine
from rlvr.runtime.rows import CoreLease
from rlvr.tracking.run_dir import now
from rlvr.trainer.collect import Drawn, Produced, draw, produce, produce_ahead, roll, scores_ahead, stale_by
from rlvr.trainer.parts import Components, RolloutParts
from rlvr.trainer.plan import PartialPlan
from rlvr.trainer.sync import rl_step
from rlvr.trainer.token_staleness import staleness_metrics, token_staleness, within_bound


class Stopped(Exception):
    """The rollout side was closed while waiting."""


class WeightSlot:
    """The weights the learner published, for the rollout side to take: the newest (`wait`), or
    with `keep` a given version (`take`), every version from the oldest still to be taken kept."""

    def __init__(self, version: int, keep: bool = False):
        self._cond = threading.Condition()
        self.version, self.first, self.keep = version, version, keep
        self._tensors: dict[int, list] = {}

    def publish(self, tensors: list, version: int) -> None:
        with self._cond:
            if not self.keep:
                self._tensors.clear()
            self.version, self._tensors[version] = version, tensors
            self._cond.notify_all()

    def _until(self, at_least: int, stop: threading.Event) -> None:
        while self.version < at_least:
            if stop.is_set():
                raise Stopped
            self._cond.wait(0.05)

    def wait(self, at_least: int, newer_than: int, stop: threading.Event) -> tuple[int, list | None]:
        """Block until version `at_least` is published; (newest version, its tensors if newer than `newer_than`)."""
        with self._cond:
            self._until(at_least, stop)
            return self.version, self._tensors.get(self.version) if self.version > newer_than else None

    def take(self, version: int, held: int, stop: threading.Event) -> tuple[int, list | None]:
        """Block until `version` is published (`keep`); (it, its tensors unless it is `held`), older
        ones dropped. A version before the slot's first (a resumed run's) is the first."""
        version = max(version, self.first)
        with self._cond:
            self._until(version, stop)
            for old in [v for v in self._tensors if v < version]:
                del self._tensors[old]
            return version, self._tensors.get(version) if version != held else None


def admissible_version(step: int, max_staleness: int) -> int:
    """The oldest policy version the batch of `step` may be sampled with (the learner trains it with step-1)."""
    return max(0, step - 1 - max_staleness)


def rollout_facts(idle_s: float, sync_s: float, rollout_s: float) -> dict[str, float]:
    """The rollout side's metrics of one batch: its idle share since the previous batch and its weight push."""
    busy = sync_s + rollout_s
    return {"async/rollout_idle_frac": idle_s / max(idle_s + busy, 1e-12), "async/rollout_push_s": sync_s}


class LocalRollouts:
    """The rollout side in a thread of this process: generates steps `start+1 .. last` into a bounded queue."""

    def __init__(self, r: RolloutParts, engine: WeightSyncEngine, *, start: int, last: int, max_staleness: int,
                 threads: int, lease: CoreLease | None = None, exact: bool = False,
                 lanes: tuple[tuple[RolloutParts, WeightSyncEngine], ...] = (),
                 lock: contextlib.AbstractContextManager | None = None, restarts: Callable[[], int] | None = None,
                 partial: PartialPlan | None = None):
        self.r = r  # the run's task, reward, RNG and sampler, with its own engine
        self.engine, self.max_staleness, self.threads = engine, max_staleness, threads
        self.lanes = lanes  # (parts, engine) of each lane (`trainer.rollout_lanes` > 1), else ()
        self.lock = lock or contextlib.nullcontext()  # a `SharedEngine`'s: one version a batch
        self.restarts = restarts  # the dead workers the engine's backend restarted so far; None = it restarts none
        self.lease = lease  # the process's cores, shared with the learner (None = a fixed share)
        self.exact = exact
        self.slot = WeightSlot(engine.policy_version, keep=exact)
        self.partial = partial  # partial rollouts: an update reaches the batch in flight
        if partial is not None and not partial.in_flight:  # the sampler swaps between chunks of tokens
            engine.follow(lambda: self.slot.wait(0, engine.policy_version, self.stop))
        self.queue: queue.Queue = queue.Queue(maxsize=max(1, max_staleness))  # of Futures, in step order
        # score-ahead: every batch admitted and not yet trained (at most η + 1) can be in scoring at once
        self.scoring = ThreadPoolExecutor(max_staleness + 1, thread_name_prefix="rlvr-scoring") \
            if scores_ahead(r) else None
        self.reads_step, self.step_lock = r.reward.reads_step, threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run_lanes if len(lanes) > 1 else self._run, args=(start, last),
                                       name="rlvr-rollouts", daemon=True)
        self.thread.start()

    def _run(self, start: int, last: int) -> None:
        torch.set_num_threads(self.threads)  # this thread's intra-op share (threads are per-thread in torch)
        idle = 0.0
        try:
            for step in range(start + 1, last + 1):
                t0 = now()
                version, tensors = self._admitted(step, self.engine.policy_version)
                with self.lease.held() if self.lease is not None else contextlib.nullcontext():
                    idle += now() - t0  # waiting for a core counts as idle
                    with self.lock:
                        t0 = now()
                        if tensors is not None:
                            self.engine.push_weights(tensors, version)
                        sync_s = now() - t0
                        with self._pushed_in_flight():
                            batch = self._sample(step, last, self.engine.policy_version)
                t0 = now()
                self._put(self._scored(batch, idle, sync_s))
                idle = now() - t0  # waiting for queue space counts toward the next batch's idle share
        except Stopped:
            return
        except BaseException as err:  # the learner re-raises it from get()
            self._fail(err)

    @contextlib.contextmanager
    def _pushed_in_flight(self):
        """Partial rollouts on an engine that takes pushes mid-request (`PartialPlan.in_flight`): while
        the batch samples, every version the learner publishes goes to the engine at once."""
        if self.partial is None or not self.partial.in_flight:
            yield
            return
        done, failed = threading.Event(), []

        def push() -> None:
            try:
                while not done.wait(0.02):
                    version, tensors = self.slot.wait(0, self.engine.policy_version, self.stop)
                    if tensors is not None:
                        self.engine.push_in_flight(tensors, version)
            except Stopped:
                return
            except BaseException as err:  # re-raised by the rollout thread, after the batch
                failed.append(err)

        pusher = threading.Thread(target=push, name="rlvr-partial-push", daemon=True)
        pusher.start()
        try:
            yield
        finally:
            done.set()
            pusher.join()
        if failed:
            raise failed[0]

    def _fail(self, err: BaseException) -> None:
        failed: Future = Future()
        failed.set_exception(err)
        self._put(failed)

    def _admitted(self, step: int, held: int) -> tuple[int, list | None]:
        """The version the batch of `step` samples with, once admissible, and its tensors unless the
        engine holds it already (`held`)."""
        oldest = admissible_version(step, self.max_staleness)
        return (self.slot.take if self.exact else self.slot.wait)(oldest, held, self.stop)

    def _run_lanes(self, start: int, last: int) -> None:
        """Batches rolled out side by side, one a lane, each lane with its own engine: a batch's
        admission, version and draws (`collect.draw`) are taken here in step order, so the run's
        draws and each batch's version are those of one lane; only the timing differs."""
        free: queue.Queue[int] = queue.Queue()
        for lane in range(len(self.lanes)):
            free.put(lane)
        idle_since = [now()] * len(self.lanes)
        pool = ThreadPoolExecutor(len(self.lanes), thread_name_prefix="rlvr-lane")
        try:
            for step in range(start + 1, last + 1):
                lane = self._next(free)
                r, engine = self.lanes[lane]
                version, tensors = self._admitted(step, engine.policy_version)
                drawn = draw(r, step)
                job = pool.submit(self._roll_lane, lane, step, drawn, version, tensors, idle_since)
                job.add_done_callback(lambda _, lane=lane: free.put(lane))
                self._put(job)
        except Stopped:
            return
        except BaseException as err:
            self._fail(err)
        finally:
            pool.shutdown(wait=True)

    def _next(self, free: queue.Queue) -> int:
        """The first lane whose batch is done."""
        while True:
            try:
                return free.get(timeout=0.05)
            except queue.Empty:
                if self.stop.is_set():
                    raise Stopped from None

    def _roll_lane(self, lane: int, step: int, drawn: Drawn, version: int, tensors: list | None,
                   idle_since: list[float]) -> Produced:
        """The batch of `step` rolled out and scored in lane `lane`, on a core of its own while it computes."""
        r, engine = self.lanes[lane]
        torch.set_num_threads(self.threads)  # this thread's intra-op share, as the rollout thread's
        with self.lease.held() if self.lease is not None else contextlib.nullcontext():
            t1 = now()
            if tensors is not None:
                engine.push_weights(tensors, version)
            sync_s = now() - t1
            produced = roll(r, drawn, step, engine.policy_version)
        facts = rollout_facts(t1 - idle_since[lane], sync_s, produced.rollout_s)  # a core's wait is idle
        idle_since[lane] = now()
        return dataclasses.replace(produced, facts=facts)

    def _begin(self, step: int, last: int) -> None:
        """TRL-form rewards' `trainer_state`: the step whose batch is scored, as in the synchronous loop."""
        self.r.reward.on_step_begin(step, last)

    def _sample(self, step: int, last: int, version: int) -> tuple[Callable[[], Produced], float]:
        """(the job that scores the batch, the seconds sampling took); the job is the whole
        `produce` when its sampling reads a reward (`collect.scores_ahead`)."""
        if self.scoring is None:
            self._begin(step, last)
            produced = produce(self.r, step, version)
            return (lambda: produced), produced.rollout_s
        job, sample_s = produce_ahead(self.r, step, version)

        def scored_at_its_step() -> Produced:  # batches scored at once each set their step in turn
            with self.step_lock if self.reads_step else contextlib.nullcontext():
                self._begin(step, last)
                return job()

        return scored_at_its_step, sample_s

    def _scored(self, batch: tuple[Callable[[], Produced], float], idle: float, sync_s: float) -> Future:
        """The batch's Future: scored in the pool (no core held: the verifier's wait overlaps the
        next batch's sampling and the update), or at once when nothing is scored ahead."""
        job, sample_s = batch
        facts = rollout_facts(idle, sync_s, sample_s)  # the sampling thread's own share: scoring runs beside it
        if self.restarts is not None:  # a backend that restarts dead workers counts them
            facts["async/worker_restarts"] = float(self.restarts())

        def finish() -> Produced:
            return dataclasses.replace(job(), facts=facts)

        if self.scoring is not None:
            return self.scoring.submit(finish)
        done: Future = Future()
        done.set_result(finish())
        return done

    def _put(self, item) -> None:
        while not self.stop.is_set():
            try:
                self.queue.put(item, timeout=0.05)
                return
            except queue.Full:
                continue
        raise Stopped

    def get(self) -> tuple[Produced, int]:
        """The next batch and how many were ready when it was asked for."""
        depth = self.queue.qsize()
        while True:
            try:
                item = self.queue.get(timeout=1.0)
                break
            except queue.Empty:
                if not self.thread.is_alive():
                    raise RuntimeError("the rollout thread ended without a batch") from None
        return item.result(), depth  # a scoring error or the rollout side's re-raised here

    def publish(self, tensors: list, version: int) -> None:
        self.slot.publish(tensors, version)

    def close(self) -> None:
        self.stop.set()
        while True:  # unblock a waiting put
            try:
                self.queue.get_nowait()
            except queue.Empty:
                break
        self.thread.join(timeout=60)
        if self.scoring is not None:
            self.scoring.shutdown(wait=True, cancel_futures=True)


class AsyncSteps:
    """The asynchronous schedule of `loop.run_loop`: `step(k)` trains on the rollout side's batch of
    step k and publishes the new weights; `rollout_state()` is the prompt RNG and sampler as of
    the last trained batch; `engine` is what evaluation samples with; `close()` stops the rollout
    side. The builder made both sides (`c.asynchronous`, `c.rollout_side`); this only runs them."""

    def __init__(self, c: Components, start: int):
        plan = c.asynchronous
        self.c, self.max_staleness, self.threads = c, plan.max_staleness, plan.facts
        self._restore_threads = torch.get_num_threads()
        torch.set_num_threads(plan.learner_threads)
        side = c.rollout_side(start)
        rows = c.learner.rows
        self.lease = rows.lease if rows is not None else None  # the cores both sides share, if they do
        self._closers = side.closers
        self.rollouts = LocalRollouts(side.rollout, side.engine, start=start, last=c.loop.steps,
                                      max_staleness=self.max_staleness, threads=side.threads, lease=self.lease,
                                      exact=plan.exact, lanes=side.lanes, lock=side.lock, restarts=side.restarts,
                                      partial=plan.partial)
        self.token_bound = self.max_staleness if plan.token_bound is None else plan.token_bound
        self.engine = side.engine.evaluator(lambda: self.rollouts.slot.wait(0, -1, self.rollouts.stop)) \
            if side.shared else c.rollout.engine
        self._state = None

    def step(self, step: int) -> tuple[dict[str, float], list[dict]]:
        t0 = now()
        produced, depth = self.rollouts.get()
        ages = token_staleness(produced.got.rollouts, produced.version, step - 1)
        produced = dataclasses.replace(produced, staleness=stale_by(produced, step),
                                       within_bound=within_bound(ages, self.token_bound))
        with self.lease.held() if self.lease is not None else contextlib.nullcontext():
            wait = now() - t0  # for a batch, then for a core
            t0 = now()
            metrics, samples = rl_step(self.c, step, produced)
            work = now() - t0
            t0 = now()
            # sharded learners: the plain copy, which `rl_step` gathered the step's weights into on every rank
            self.rollouts.publish(published(self.c.learner.full_weights, merged=self.c.asynchronous.publish_merged,
                                            adapter=self.c.asynchronous.publish_adapter), step)
            publish_s = now() - t0
        metrics.update(produced.facts)
        metrics.update(staleness_metrics(ages, self.token_bound, self.max_staleness))
        metrics.update(step_facts(produced.staleness, self.max_staleness, depth=depth, wait_s=wait,
                                  work_s=work + publish_s, version=produced.version,
                                  weight_sync_s=publish_s + produced.facts.get("async/rollout_push_s", 0.0)))
        self._state = {"task_rng": produced.task_rng, "sampler": produced.sampler_state,
                       "replay": produced.replay_state}
        return metrics, samples

    def rollout_state(self) -> dict:
        return self._state

    def close(self) -> None:
        self.rollouts.close()
        for close in self._closers:
            close()
        torch.set_num_threads(self._restore_threads)


def step_facts(staleness: int, max_staleness: int, *, depth: int, wait_s: float, work_s: float, version: int,
               weight_sync_s: float) -> dict[str, float]:
    """The learner's async metrics of one step: the staleness histogram of its rows (one batch, one
    version), its idle share, the queue depth it found and the seconds spent moving weights."""
    hist = {f"async/staleness_{k}_frac": float(staleness == k) for k in range(max_staleness + 1)}
    return {**hist, "async/staleness": float(staleness), "async/policy_version": float(version),
            "async/queue_depth": float(depth), "async/trainer_idle_frac": wait_s / max(wait_s + work_s, 1e-12),
            "async/step_s": wait_s + work_s,  # the learner's wall-clock for the step (time/step_s sums phases)
            "async/weight_sync_s": weight_sync_s}
