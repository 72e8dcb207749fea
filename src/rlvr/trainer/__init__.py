"""The training loop: one RL step (`sync.rl_step`) and the update it makes (`step`), the rollout
phase with dynamic sampling (`collect`, `scoring`), the schedules (`sync.SyncSteps`,
`async_loop.AsyncSteps`) and the loop around them (`loop`: evaluation, trackers, checkpoints,
resume), expert rows, the critic step and the old/reference policy passes.

Everything here reads the run's frozen plans and its components (`plan`); nothing here reads the
config, which only `rlvr.builder` does."""
