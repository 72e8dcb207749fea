"""The pure math of the RL loop: four registries of torch functions, chosen by name.

- `advantages.ADVANTAGES`: rewards -> token advantages (B, T)
- `objectives.OBJECTIVES`: per-token policy loss (B, T) from log-probs and advantages
- `aggregate.AGGREGATIONS`: per-token loss -> this micro-batch's share of the step's scalar loss
- `kl.KL_ESTIMATORS`: per-token KL estimate (B, T) against a reference policy

Beside them, plain functions: `value.value_loss` (critic), `shaping` (DAPO overlong penalty and
zero-variance groups), `entropy.token_entropy`, `correction.importance_correction` (rollout vs
trainer log-prob mismatch), `kl.adaptive_kl_coef`, `returns.gae_returns` (critic targets).

Everything here imports only torch and the standard library (a test checks it). Functions take
plain tensors and keyword-only hyperparameters whose defaults are their papers'; the trainer
binds each chosen function's hyperparameters once from the config fields of the same names
(`rlvr.config.binding.bind`), so a name means the same thing everywhere it appears.
`docs/papers.md` lists every method, its paper and its deviations.
"""

