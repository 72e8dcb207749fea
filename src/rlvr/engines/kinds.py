"""What each rollout engine is, declared once (`rollout.engine` names an entry here).

The builder reads these declarations when it resolves a run's step plan; the loop never asks an
engine's name or type what it is. Torch-free, so the config can check a name without importing an
engine.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlvr.algos._registry import Requirement


@dataclass(frozen=True)
class EngineKind:
    own_weights: bool
    """Holds its own copy of the weights: the trainer pushes them after every update."""
    exact_logprobs: bool
    """Its behaviour log-probs are the trainer's own up to float rounding; False means they come from
    another implementation (another kernel, another precision), so the rollout correction defaults on
    and the step never takes them for the old policy's."""
    batches_itself: bool
    """Schedules its own batches and threads: never split over the row pool, and on a CPU the
    trainer keeps one thread of its own (the engine's threads share the cores)."""
    causal_only: bool
    """Samples causal LMs only (the masked-diffusion sampler is rlvr's own)."""
    own_processes: bool = False
    """Runs in processes of its own (servers): a learner rank drives it directly, never through a spawned
    process that keeps it out of the learners' process group."""
    adapters: bool = False
    """Loads LoRA adapters unmerged (`rollout.lora_sync=adapter`): a LoRA run pushes the adapter alone."""
    partial: str = ""
    """How a weight update reaches a batch in flight (`trainer.partial_rollouts`): `chunks` = the sampler
    swaps weights between chunks of tokens (rlvr's own); `in_flight` = the engine takes the push while its
    requests run (servers paused in `keep` mode); empty = it cannot (one call samples the batch)."""
    options: tuple[str, ...] = ()
    """Config fields only this engine reads: set under another engine, they are refused (they would be ignored)."""

    @property
    def requires(self) -> tuple[Requirement, ...]:
        """What the config must give this engine (`rlvr.config.checks` enforces it when chosen)."""
        if not self.causal_only:
            return ()
        return (Requirement({"model.kind": "causal"}, "{name} samples causal models only (the diffusion sampler is "
                            "rlvr's own); use rollout.engine=torch"),)


ENGINES = {
    "torch": EngineKind(own_weights=False, exact_logprobs=True, batches_itself=False, causal_only=False,
                        partial="chunks"),
    "vllm": EngineKind(own_weights=True, exact_logprobs=False, batches_itself=True, causal_only=True,
                       options=("rollout.vllm_kv_cache_mb", "rollout.vllm_block_size", "rollout.vllm_max_model_len")),
    "vllm_server": EngineKind(own_weights=True, exact_logprobs=False, batches_itself=True, causal_only=True,
                              own_processes=True, adapters=True, partial="in_flight",
                              options=("rollout.vllm_kv_cache_mb", "rollout.vllm_block_size",
                                       "rollout.vllm_max_model_len", "rollout.servers", "rollout.server_urls",
                                       "rollout.server_port",
                                       "rollout.server_start_timeout_s", "rollout.server_on_crash",
                                       "rollout.weight_bucket_mb", "rollout.lora_sync")),
}
