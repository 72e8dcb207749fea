"""`trainer.backend=ray trainer.ray_learners=N`: the FSDP2 learner ranks as Ray actors, instead of
the processes `torchrun --nproc_per_node N` starts.

The driver (the `rlvr train` process) reserves N bundles of `threads` CPUs (and one GPU each on
CUDA) in a placement group (PACK: one machine fills first), starts one actor per bundle, and
gives each the torch.distributed environment torchrun would: MASTER_ADDR / MASTER_PORT (rank 0's
node and a port free there), RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE (the ranks on the
same node). Each actor then runs the run as that rank (`run_rank()`, what torchrun's process
runs), so rank 0 alone writes run.json, the metrics and the checkpoints and the others
follow it, exactly as under torchrun. With `trainer.rollout_workers` / `trainer.reward_workers` > 1
rank 0 owns those actors (`engines.ranks.LeadEngine`, `LeadReward`), scheduled outside the
placement group on the CPUs `launch` leaves for them. The driver waits for every rank; a failed run is one line:
the first rank's own error that is not a lost peer (`LearnerLost`, what the other ranks say when
one stops), else the first lost peer; an actor that died names its rank.

SIGTERM or Ctrl-C on the driver stops the ranks after their step, as in one process
(`ForwardedStops`).

Deviations from torchrun: no elastic restarts (a lost rank ends the run, `--resume RUN_DIR`
continues it); the ranks' printed lines stay in Ray's worker logs (the driver prints the last).
"""

from __future__ import annotations

import datetime
import functools
import os
import socket
from collections.abc import Callable

import torch

from rlvr.backends.ray import _ray, ensure_ray  # Ray is imported in that one module
from rlvr.errors import ConfigError, LearnerLost, RunInterrupted
from rlvr.runtime.liveness import STOP_KEY
from rlvr.tracking.run_dir import StopSignals

PLACEMENT_TIMEOUT_S = 60.0  # the bundles fit the cluster now, or the run says they do not
START_TIMEOUT_S = 300.0  # an actor's process started and answered
STORE_TIMEOUT_S = 10.0  # the driver reaching rank 0's store to pass a stop on


class _LearnerRank:
    """One learner rank's process."""

    def where(self) -> tuple[str, str]:
        """(this node's address, its Ray node id)."""
        ray = _ray()
        return ray.util.get_node_ip_address(), ray.get_runtime_context().get_node_id()

    def free_port(self) -> int:
        """A TCP port free on this node now (rank 0's: the process group's store listens there)."""
        with socket.socket() as s:
            s.bind(("", 0))
            return s.getsockname()[1]

    def run(self, run_rank, env: dict[str, str], cwd: str, threads: int):
        """Train as the rank `env` names: ("ok", final line, run directory), (error class, line) or
        ("interrupted", signal, exit status, step)."""
        os.environ.update(env)
        os.chdir(cwd)  # relative paths (trainer.out_dir, reward files) as the driver meant them
        torch.set_num_threads(threads)
        try:
            final, run_dir = run_rank()
        except ConfigError as err:
            return type(err).__name__, str(err)
        except RunInterrupted as err:  # a stop the driver passed on (`ForwardedStops`): run.json says so
            return "interrupted", err.signal_name, err.exit_status, err.step
        return "ok", final, run_dir


def train_ranks(make_trainer: Callable, config) -> tuple[dict, str]:
    """Train on `trainer.ray_learners` Ray actors, each rank building its trainer with
    `make_trainer()` (`rlvr.Trainer` from the config) and running it as one rank: (rank 0's final
    line, the run directory)."""
    from rlvr.runtime.process import available_cores, resolve_device

    t = config.trainer
    gpus = resolve_device(t.device, config.model.kind).type == "cuda"
    threads = t.threads or max(1, available_cores() // t.ray_learners)  # each rank's CPU bundle
    rollout_cpus = t.rollout_workers * (t.threads or 1) if t.rollout_workers > 1 else 0  # rank 0's actors
    _, final, run_dir = launch(functools.partial(_train_rank, make_trainer), learners=t.ray_learners,
                               threads=threads, gpus=gpus, address=t.ray_address, actor_cpus=rollout_cpus)
    return final, run_dir


def _train_rank(make_trainer: Callable) -> tuple[dict, str]:
    """One Ray learner rank's run: (its final line, the run directory)."""
    made = make_trainer()
    return made.train_here(), str(made.run_dir)


def rank_envs(where: list[tuple[str, str]], port: int) -> list[dict[str, str]]:
    """The torch.distributed environment of each rank from its (node address, node id), rank 0's
    node the master's; a rank's local rank counts the ranks before it on its node."""
    nodes = [node for _, node in where]
    return [{"MASTER_ADDR": where[0][0], "MASTER_PORT": str(port), "RANK": str(rank), "WORLD_SIZE": str(len(where)),
             "LOCAL_RANK": str(nodes[:rank].count(node)), "LOCAL_WORLD_SIZE": str(nodes.count(node))}
            for rank, node in enumerate(nodes)]


def outcome(results: list[tuple]) -> tuple:
    """Rank 0's ("ok", final, run dir) when every rank finished, `RunInterrupted` when the ranks
    stopped on a signal, else raise the run's one line (`results`: each rank's `run` result, or
    ("died", line) for an actor that died)."""
    failed = [(rank, r) for rank, r in enumerate(results) if r[0] != "ok"]
    if not failed:
        return results[0]
    if all(r[0] == "interrupted" for _, r in failed):  # every rank stopped where they agreed to
        raise RunInterrupted(*failed[0][1][1:])
    own = [r for _, r in failed if r[0] not in ("LearnerLost", "died", "interrupted")]
    kind, line = (own or [r for _, r in failed if r[0] != "interrupted"])[0][:2]
    raise (ConfigError if own else LearnerLost)(line)


def launch(run_rank, *, learners: int, threads: int, gpus: bool, address: str, actor_cpus: int = 0) -> tuple:
    """Run `run_rank()` -> (final line, run directory) on `learners` Ray actors as the ranks of one process group and
    return rank 0's ("ok", final line, run directory); a failure is one line (`outcome`). `actor_cpus`: what
    rank 0's rollout workers take outside the placement group (a local Ray is started with them too)."""
    if int(os.environ.get("WORLD_SIZE", 1)) > 1:
        raise ConfigError("trainer.ray_learners: Ray starts the learner ranks itself; run `rlvr train` without "
                          "torchrun, or set trainer.ray_learners=0")
    ray = ensure_ray(address, learners * threads + actor_cpus)
    placement_group, remove_placement_group = ray.util.placement_group, ray.util.remove_placement_group
    PlacementGroupSchedulingStrategy = ray.util.scheduling_strategies.PlacementGroupSchedulingStrategy  # noqa: N806

    bundle = {"CPU": threads, **({"GPU": 1} if gpus else {})}
    group = placement_group([bundle] * learners, strategy="PACK")
    ranks = []
    try:
        if not ray.wait([group.ready()], timeout=PLACEMENT_TIMEOUT_S)[0]:
            have = {k: v for k, v in ray.cluster_resources().items() if k in bundle}
            raise ConfigError(f"trainer.ray_learners: {learners} learner(s) x {bundle} do not fit the Ray "
                              f"cluster ({have}); set fewer learners or trainer.threads, or add nodes")
        actor = ray.remote(_LearnerRank)
        ranks = [actor.options(num_cpus=threads, num_gpus=1 if gpus else 0, max_restarts=0,
                               scheduling_strategy=PlacementGroupSchedulingStrategy(group, i)).remote()
                 for i in range(learners)]
        where = ray.get([r.where.remote() for r in ranks], timeout=START_TIMEOUT_S)
        port = ray.get(ranks[0].free_port.remote(), timeout=START_TIMEOUT_S)
        calls = [r.run.remote(run_rank, env, os.getcwd(), threads)
                 for r, env in zip(ranks, rank_envs(where, port))]
        with ForwardedStops(where[0][0], port):
            return outcome([_result(ray, rank, call) for rank, call in enumerate(calls)])
    finally:
        for r in ranks:
            ray.kill(r, no_restart=True)
        remove_placement_group(group)


class ForwardedStops(StopSignals):
    """The driver's SIGTERM or SIGINT (Ctrl-C): the first is set in rank 0's store (`STOP_KEY`), so
    every rank stops after the step it is in, checkpoints and records `interrupted`, as one
    process does (`Shard.agree_stop`); a second stops the driver at once (its actors are killed)."""

    def __init__(self, host: str, port: int, echo=print):
        super().__init__(echo)
        self.host, self.port = host, port

    def _handle(self, signum, frame) -> None:
        super()._handle(signum, frame)  # a second signal raises here
        try:
            store = torch.distributed.TCPStore(self.host, self.port, is_master=False,
                                               timeout=datetime.timedelta(seconds=STORE_TIMEOUT_S))
            store.set(STOP_KEY, self.received)
        except (RuntimeError, OSError):  # rank 0 has no store yet, or has left: nobody to stop in step
            raise RunInterrupted(self.received, self.exit_status) from None


def _result(ray, rank: int, call):
    """Rank `rank`'s result; waits as long as the rank runs (its collectives time out on their own,
    `trainer.collective_timeout_s`). A bug in the rank raises its own traceback here."""
    try:
        return ray.get(call)
    except ray.exceptions.RayActorError as err:
        first = str(err).strip().splitlines()[0][:160] if str(err).strip() else type(err).__name__
        return "died", (f"learner rank {rank}: its Ray actor died ({first}); --resume RUN_DIR continues from "
                        "the last checkpoint")
