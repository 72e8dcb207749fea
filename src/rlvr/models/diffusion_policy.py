"""PolicyModel for masked-diffusion LMs: a named likelihood estimator behind `batch_logprobs`.

The trainer calls `batch_logprobs(batch, with_entropy=...)` exactly as for `CausalPolicy`
(`rlvr.protocols.PolicyModel`) and never branches on the model type. What the
returned (B, Tc) "log-probs" mean depends on the estimator (`rlvr.models.likelihood`): token
estimators give per-token proxies, sequence estimators give B̂_i / L_i on each valid token.
Values outside the window (`window_mask`) are 0 and carry no gradient.

Common random numbers. The trainer calls `begin_step(seed)` once per step, on the policy and
on the reference, before any log-prob of that step; `mask_seed=` per call wins. Each row's masks
are a function of (mask seed, the row's tokens), so current / old / reference share them across
micro-batches and row orders.

`batch_logprobs(batch)` reads what some estimators need from the batch: `batch.advantages`
(the sign selects ELBO or EUBO in `spg`) and `batch.trace` (the sampler's commit steps, which
the diffusion engine puts on its `Rollouts`, for `trace`). `token_logprobs` takes them as
keywords for direct use.

`batch_draws(batch)` (estimator `bgpo` only, `rlvr.protocols.DrawsPolicy`) also returns the n per-draw
estimates (B, n) that BGPO's own objective reads (`rlvr.algos.dllm_objectives.bgpo`); the
log-probs are then their mean spread over the row, from the same forwards.
"""

from __future__ import annotations

import torch

from rlvr.models.likelihood import Corruptor, bgpo_draws, get_estimator, row_hash, window_mask


class DiffusionPolicy:
    """`model`: a DiffusionLM (or anything with model(ids, attention, positions) -> logits and a
    `config.mask_token_id` / `config.eos_token_id`). `estimator`: a name in `ESTIMATORS`; the
    remaining keywords are that estimator's options (e.g. n=4, antithetic=True)."""

    exact_logprobs = False  # each forward is an estimator's sample of the log-likelihood, not the log-probs
    corruptor = Corruptor  # how a corrupted row is denoised (block models: `BlockCorruptor`)

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
        self.forwards = 0  # model forwards, counted by a hook: the cost unit of dLLM estimators
        model.register_forward_hook(self._count_forward)
        window_mask(torch.zeros((1, 1), dtype=torch.long), 0, window)  # validates `window`

    def _count_forward(self, module, args, output) -> None:
        self.forwards += 1

    def parameters(self):
        return self.model.parameters()

    def begin_step(self, seed: int) -> None:
        """Masks of every following call come from `seed` (one call per step, shared with the reference)."""
        self.mask_seed = int(seed)

    def batch_logprobs(self, batch, *, with_entropy: bool = False):
        """`token_logprobs` of a `TrainBatch`, with its advantages and trace as estimator inputs."""
        return self.token_logprobs(batch.prompt_ids, batch.prompt_mask, batch.completion_ids,
                                   with_entropy=with_entropy, advantages=batch.advantages, trace=batch.trace)

    def batch_draws(self, batch, *, with_entropy: bool = False):
        """(log-probs (B, Tc), entropy, {"draws": (B, n)}): BGPO's per-draw estimates, each
        recomputed alone in the backward; the log-probs are `bgpo`'s values built from them."""
        if self.estimator_name != "bgpo":
            raise ValueError(f"per-draw estimates need estimator.name=bgpo, not {self.estimator_name!r}")
        ctx = self.corruption_context(batch.prompt_ids, batch.prompt_mask, batch.completion_ids, None)
        kwargs = {k: v for k, v in self.estimator_kwargs.items() if k in ("n", "antithetic")}
        draws, entropy = bgpo_draws(ctx, with_entropy=with_entropy, **kwargs)  # (B, n)
        logp = torch.where(ctx.valid, draws.mean(-1)[:, None], torch.zeros_like(ctx.valid, dtype=draws.dtype))
        if entropy is not None:
            entropy = torch.where(ctx.valid, entropy, torch.zeros_like(entropy))
        return logp, entropy, {"draws": draws}

    def corruption_context(self, prompt_ids, prompt_mask, completion_ids, mask_seed):
        """The estimator's corruptor bound to these rows (their window, per-row mask keys from
        `mask_seed`, or the step's seed when None): what a caller needs to draw its own masks."""
        valid = window_mask(completion_ids, self.eos_id, self.window) > 0
        seed = self.mask_seed if mask_seed is None else mask_seed
        return self.corruptor(model=self.model, prompt_ids=prompt_ids, prompt_mask=prompt_mask,
                              completion_ids=completion_ids, valid=valid,
                              keys=row_hash(prompt_ids, prompt_mask, completion_ids, seed),
                              mask_id=self.mask_id, temperature=self.temperature)

    def token_logprobs(self, prompt_ids, prompt_mask, completion_ids, *, with_entropy: bool = False,
                       advantages: torch.Tensor | None = None, trace: torch.Tensor | None = None,
                       mask_seed: int | None = None):
        """Estimator values (B, Tc) and entropy (B, Tc) or None; see the module doc. The window
        (`self.window`) decides which tokens are scored."""
        ctx = self.corruption_context(prompt_ids, prompt_mask, completion_ids, mask_seed)
        valid = ctx.valid
        kwargs = dict(self.estimator_kwargs)
        if self.estimator_name == "spg":
            kwargs["advantages"] = advantages
        if self.estimator_name == "trace":
            kwargs["trace"] = trace
        values, entropy = self.estimator(ctx, with_entropy=with_entropy, **kwargs)
        values = torch.where(valid, values, torch.zeros_like(values))
        if entropy is not None:
            entropy = torch.where(valid, entropy, torch.zeros_like(entropy))
        return values, entropy


__all__ = ["DiffusionPolicy"]
