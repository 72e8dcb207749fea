"""A rollout engine over its own copy of the policy's weights, refreshed by `push_weights`.

The asynchronous rollout side samples from this copy while the learner updates the original;
the learner publishes its weights after every update (`published`) and the rollout side pushes
the newest ones into its copy between batches (`protocols.WeightSyncEngine`). A Ray rollout
worker holds one of these in its own process.

vLLM already holds its own copy: the rollout side pushes into it directly, and the learner
evaluates with the same engine (`SharedEngine`), so a process never starts a second one.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Iterable

import torch

from rlvr.batch import Rollouts
from rlvr.engines.torch_ar import Swaps


class SnapshotEngine:
    """`engine(prompt_ids, prompt_mask, seeds, *, temperature) -> Rollouts` from a frozen copy of
    `model`; `make_engine(copy)` builds the sampler over the copy."""

    def __init__(self, model: torch.nn.Module, make_engine: Callable, *, version: int = 0, copy_model: bool = True,
                 swap_every: int = 0):
        self.model = frozen_copy(model) if copy_model else model
        self.model.requires_grad_(False)
        self._params = dict(self.model.named_parameters())
        self.engine = make_engine(self.model)
        self.policy_version = version
        self.swap_every = swap_every  # partial rollouts: tokens between checks for newer weights (0 = off)
        self._newest: Callable[[], tuple[int, list | None]] | None = None

    def __call__(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, seeds: torch.Tensor, **kwargs) -> Rollouts:
        if self._newest is not None and self.swap_every:
            kwargs["swaps"] = Swaps(self._swap, self.swap_every)
        return self.engine(prompt_ids, prompt_mask, seeds, **kwargs)

    def follow(self, newest: Callable[[], tuple[int, list | None]]) -> None:
        """Partial rollouts: between chunks of `swap_every` tokens the sampler pushes `newest()` =
        (the newest published version, its tensors or None when not newer than this copy's)."""
        self._newest = newest

    def _swap(self) -> int:
        version, tensors = self._newest()
        if tensors is not None and version > self.policy_version:
            self.push_weights(tensors, version)
        return self.policy_version

    @torch.no_grad()
    def push_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        pushed = 0
        for name, tensor in named_tensors:
            if name not in self._params:
                raise KeyError(f"push_weights: the rollout copy has no parameter {name!r}")
            self._params[name].copy_(tensor)
            pushed += 1
        if pushed != len(self._params):
            raise ValueError(f"push_weights: {pushed} tensors pushed for {len(self._params)} parameters")
        self.policy_version = version


class SharedEngine:
    """A `WeightSyncEngine` with its own weights (vLLM) shared by the rollout side and the learner's
    evaluation, which run in two threads of one process.

    `lock` serialises them; the rollout side holds it for a whole batch (its push and every call),
    so each batch comes from one version. `evaluator(newest)` is the learner's view: under the lock
    it pushes `newest()` = (version, tensors) when the engine is behind, then samples, so evaluation
    sees the learner's current weights. A push older than the engine's version is skipped: the
    evaluation may have pushed newer weights since the rollout side took its own; with `exact`
    (`trainer.staleness=exact`) the rollout side's older version goes back in before its batch."""

    def __init__(self, engine, version: int, exact: bool = False):
        self.engine, self.lock, self.exact = engine, threading.RLock(), exact
        engine.policy_version = version  # the async loop counts versions in steps, the sync loop in optimizer steps

    @property
    def policy_version(self) -> int:
        return self.engine.policy_version

    def __call__(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, seeds: torch.Tensor, **kwargs) -> Rollouts:
        with self.lock:
            return self.engine(prompt_ids, prompt_mask, seeds, **kwargs)

    def push_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        with self.lock:
            if version > self.engine.policy_version or (self.exact and version != self.engine.policy_version):
                self.engine.push_weights(named_tensors, version)

    def push_in_flight(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Partial rollouts: a push while the rollout side's batch is in flight. The batch holds the
        lock; the engine pauses its requests, takes the weights and resumes them (`in_flight` kind)."""
        if version > self.engine.policy_version:
            self.engine.push_weights(named_tensors, version)

    def evaluator(self, newest: Callable[[], tuple[int, list | None]]) -> Callable[..., Rollouts]:
        def evaluate(prompt_ids, prompt_mask, seeds, **kwargs) -> Rollouts:
            with self.lock:
                version, tensors = newest()
                if tensors is not None:
                    self.push_weights(tensors, version)
                return self.engine(prompt_ids, prompt_mask, seeds, **kwargs)

        return evaluate


def frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A deep copy of `model` without its forward hooks: a policy's forward counter hooks the model,
    and the copy's forwards are not the policy's (copying the hook would copy the policy too)."""
    hooks = [(m, m._forward_hooks) for m in model.modules()]
    for m, _ in hooks:
        m._forward_hooks = type(m._forward_hooks)()
    try:
        return copy.deepcopy(model)
    finally:
        for m, saved in hooks:
            m._forward_hooks = saved


def published(model: torch.nn.Module, *, merged: bool = False, adapter: bool = False) -> list[tuple[str, torch.Tensor]]:
    """A copy of `model`'s parameters, by name, that later updates of `model` do not change.
    `merged`: under the base model's names with LoRA adapters folded in, as vLLM loads them;
    `adapter`: the LoRA adapter's own tensors alone, for an engine that serves it unmerged."""
    if adapter:
        from rlvr.models.lora import adapter_weights

        return [(name, t.clone()) for name, t in adapter_weights(model)]
    if merged:
        from rlvr.models.lora import merged_weights

        return [(name, t.detach().clone()) for name, t in merged_weights(model)]
    return [(name, p.detach().clone()) for name, p in model.named_parameters()]
