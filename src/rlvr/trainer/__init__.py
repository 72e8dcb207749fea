"""The training loop and what it owns: building components from the config, the synchronous RL
loop (`sync`), the update step (`step`), rollout collection with dynamic sampling (`collect`),
evaluation, checkpoints, supervised warm starts (`sft`), prompt selection, the critic step, and the
process settings a run applies (`runtime`, `rows`, `allocator`)."""
