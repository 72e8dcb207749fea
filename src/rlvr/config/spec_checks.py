"""Config checks of `rollout.speculative` (SPEC-RL) and `task.train_size`, kept beside the loader's own checks."""

from __future__ import annotations

from rlvr.config.schema import Config


def spec_checks(config: Config) -> list[tuple[bool, str, str]]:
    """(ok, field, fix): SPEC-RL verifies drafts with the trainer's own causal model, one completion
    per row, under the distribution the torch sampler samples from."""
    r, t = config.rollout, config.trainer
    finite = [(not config.task.train_size or config.sampler.name != "dump", "task.train_size",
               "sampler dump draws from the task's sources, not a finite train set; set task.train_size=0")]
    if not r.speculative:
        return finite
    untruncated = r.top_p == 1.0 and r.top_k == 0 and r.min_p == 0.0 and r.repetition_penalty == 1.0
    return [
        *finite,
        (r.engine == "torch", "rollout.speculative", "verifies drafts on the torch engine; set rollout.engine=torch"),
        (config.model.kind == "causal", "rollout.speculative",
         "drafts are verified token by token left to right: set model.kind=causal, or rollout.speculative=false"),
        (not config.task.name.startswith("agent_"), "rollout.speculative",
         "multi-turn episodes have no single completion to draft; set rollout.speculative=false"),
        (untruncated, "rollout.speculative",
         "the acceptance rule needs the policy's distribution: set top_p=1, top_k=0, min_p=0, repetition_penalty=1"),
        (r.micro_group_size == 0, "rollout.micro_group_size", "must be 0 with rollout.speculative (whole groups)"),
        (t.max_staleness is None and t.backend == "local", "rollout.speculative",
         "implemented for the synchronous local loop; unset trainer.max_staleness and use trainer.backend=local"),
    ]
