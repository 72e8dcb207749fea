"""PolicyModel for masked-diffusion LMs: a named likelihood estimator behind `token_logprobs`.

The trainer calls `token_logprobs(prompt_ids, prompt_mask, completion_ids, with_entropy=...)`
exactly as for `CausalPolicy` and never branches on the model type. What the
returned (B, Tc) "log-probs" mean depends on the estimator (`rlvr.models.likelihood`): token
estimators give per-token proxies, sequence estimators give B̂_i / L_i on each valid token.
Values outside the window (`window_mask`) are 0 and carry no gradient.

Common random numbers. Call `set_mask_seed(seed)` once per inner iteration (before the old,
reference and current policy calls of that iteration); or pass `mask_seed=` per call, which wins.
Each row's masks are a function of (mask seed, the row's tokens), so current / old / reference
share them across micro-batches and row orders. Share one seed between the policy and the
reference: `reference.set_mask_seed(seed)` too (or `DiffusionPolicy.share_seed_with`).

Two optional keyword arguments of `token_logprobs` carry what some estimators need:
- `advantages` (B,) or (B, Tc): required by `spg` (the sign selects ELBO or EUBO); ignored by
  every other estimator. The trainer can pass `advantages=mb.advantages` unconditionally.
- `trace` (B, Tc): the sampler's commit steps, for `trace`. Without it the policy looks the rows
  up among the traces that `DiffusionSampler(policies=[...])` recorded (`record_traces`).
"""

from __future__ import annotations

import torch

from rlvr.models.likelihood import Corruptor, get_estimator, row_hash, window_mask


class DiffusionPolicy:
    """`model`: a DiffusionLM (or anything with model(ids, attention, positions) -> logits and a
    `config.mask_token_id` / `config.eos_token_id`). `estimator`: a name in `ESTIMATORS`; the
    remaining keywords are that estimator's options (e.g. n=4, antithetic=True)."""

    def __init__(self, model, estimator: str = "mean_field", *, window: str = "eos", temperature: float = 1.0,
                 mask_id: int | None = None, eos_id: int | None = None, **estimator_kwargs):
        self.model = model
        self.estimator_name = estimator
        self.estimator = get_estimator(estimator)
        self.estimator_kwargs = estimator_kwargs
        self.window = window
        self.temperature = temperature if temperature > 0 else 1.0
        self.mask_id = model.config.mask_token_id if mask_id is None else mask_id
        self.eos_id = model.config.eos_token_id if eos_id is None else eos_id
        self.mask_seed = 0
        self._traces: dict[int, torch.Tensor] = {}
        window_mask(torch.zeros((1, 1), dtype=torch.long), 0, window)  # validates `window`

    def parameters(self):
        return self.model.parameters()

    def set_mask_seed(self, seed: int) -> None:
        """Masks of every following call come from `seed` (one call per inner iteration)."""
        self.mask_seed = int(seed)

    def record_traces(self, rollouts) -> None:
        """Remember each row's commit steps (keyed by its tokens) for the `trace` estimator."""
        keys = row_hash(rollouts.prompt_ids, rollouts.prompt_mask, rollouts.completion_ids, 0).tolist()
        self._traces = dict(zip(keys, rollouts.trace))

    def _lookup_traces(self, prompt_ids, prompt_mask, completion_ids):
        keys = row_hash(prompt_ids, prompt_mask, completion_ids, 0).tolist()
        missing = [k for k in keys if k not in self._traces]
        if missing:
            return None
        return torch.stack([self._traces[k] for k in keys])

    def token_logprobs(self, prompt_ids, prompt_mask, completion_ids, *, with_entropy: bool = False,
                       advantages: torch.Tensor | None = None, trace: torch.Tensor | None = None,
                       mask_seed: int | None = None, completion_mask: torch.Tensor | None = None):
        """Estimator values (B, Tc) and entropy (B, Tc) or None; see the module doc.

        `completion_mask` is accepted for the PolicyModel surface; the window (`self.window`)
        decides which tokens are scored here."""
        valid = window_mask(completion_ids, self.eos_id, self.window) > 0
        seed = self.mask_seed if mask_seed is None else mask_seed
        ctx = Corruptor(model=self.model, prompt_ids=prompt_ids, prompt_mask=prompt_mask,
                        completion_ids=completion_ids, valid=valid,
                        keys=row_hash(prompt_ids, prompt_mask, completion_ids, seed),
                        mask_id=self.mask_id, temperature=self.temperature)
        kwargs = dict(self.estimator_kwargs)
        if self.estimator_name == "spg":
            kwargs["advantages"] = advantages
        if self.estimator_name == "trace":
            kwargs["trace"] = trace if trace is not None else self._lookup_traces(prompt_ids, prompt_mask,
                                                                                  completion_ids)
        values, entropy = self.estimator(ctx, with_entropy=with_entropy, **kwargs)
        values = torch.where(valid, values, torch.zeros_like(values))
        if entropy is not None:
            entropy = torch.where(valid, entropy, torch.zeros_like(entropy))
        return values, entropy


__all__ = ["DiffusionPolicy"]
