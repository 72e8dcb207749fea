"""Likelihood estimators for masked-diffusion LMs, by name (papers: docs/papers.md).

A masked-diffusion LM has no tractable log π(y|c); each RL method uses a proxy. Every estimator
here has one signature,
    fn(ctx: Corruptor, **kwargs) -> (values (B, Tc), entropy (B, Tc) | None)
and returns either TOKEN values (a per-token log-probability proxy) or a SEQUENCE estimate
B̂_i SPREAD over the row's valid tokens (B̂_i / L_i on each, so the row sum is B̂_i):

| name | proxy | level | forwards (graph) |
|---|---|---|---|
| `mean_field` | d1: log p(y_k | completion all masked, prompt masked w.p. p_mask_prompt) | token | 1 |
| `coupled` | coupled-GRPO: ½[ℓ_k(all masked) + w_k ℓ_k(z_t or its complement)] | token | 3 (2 w/o full) |
| `elbo_mc` | ELBO, n stratified mask counts, optional antithetic complements | seq | n (2n), all kept |
| `bgpo` | the same ELBO, each draw recomputed and back-propagated alone | seq | n, one at a time |
| `spg` | ELBO if A >= 0, EUBO or ω-mixture if A < 0; random or block-wise masks | seq | 2n |
| `trace` | TraceRL/CJ-GRPO: log p(y_k | the sampler's state before its (merged) step) | token | ⌈steps/σ⌉ |
| `ar_order` | JustGRPO: log p(y_k | y_<k visible, rest masked), exact AR factorisation | token | L, one at a time |
| `prefix_block` | PBPO: log p(y_k | earlier blocks shown, k's block and later masked) | token | blocks |

How spread values meet the trainer's objectives: with `ppo_clip` the per-token ratio is
exp((B̂θ − B̂old)/L_i), the same on every token of a row: ESPO's length-normalised sequence
ratio, equal to `gspo` on these values. k2 KL on spread values is ½((B̂θ − B̂ref)/L_i)² per
token (ESPO's ½(B̂θ − B̂ref)² / L up to a factor 1/L, absorbed in the coefficient).

Common random numbers: every random choice of row i comes from hashed counters keyed by
(mask_seed, a hash of row i's prompt and completion tokens, draw index) (`rlvr.noise`), so the
current, old and reference policies see identical masks for the same row under the same
mask_seed, whatever the micro-batch, the row order or the padding width.

Window: `valid` (B, Tc) marks the "action" tokens (up to the first EOS, or the whole window).
Random masks are drawn over valid positions; positions outside the window are ALWAYS masked in
corrupted inputs (SPG's convention), so an estimate depends on the valid tokens only.

ELBO forms (L = valid length, ℓ_k = log p_θ(y_k | z)); both unbiased for the same discrete ELBO
B = E_{m~U{1..L}} (L/m) E_{|M|=m} Σ_{k∈M} ℓ_k = E_σ Σ_k log p(y_σk | y_σ<k) ≤ log π(y|c):
- plain: m ~ U{1..L} (stratified over the n draws: u_j = (u + j)/n), weight L/m;
- antithetic: M (|M| = m ~ U{1..L}) paired with M' = complement of M plus one position of M
  (|M'| = L + 1 − m), weights L/m and L/(L+1−m), halved. Each half is a plain draw, so the pair
  is unbiased; its masks are nearly complementary and its counts mirror (t, 1 − t).

Bounds (tests/dllm/test_estimators.py, exact enumeration at L = 3): log π here is the likelihood
of the random-order one-token-per-step sampler, log E_σ Π_k p(y_σk | y_σ<k). The ELBO is below
it (Jensen). SPG's per-token EUBO_β = Σ_i (1/β) log E[p_i^β] is above it for β >= L (Hölder over
the L tokens), but NOT in general for SPG's β ∈ {1, 1.5, 2}: on our model 62% / 14% / 3% of the
64 sequences violate it at β = 1 / 1.5 / 2. And log of an n-draw mean is biased low by O(1/n).

Deviations from the released code (see docs/papers.md rows):
1. `spg` weights its ELBO by 1/t (the paper's bound); the released code has no 1/t weight.
   Block-wise masking picks the block stratified over draws with weight K (number of blocks),
   i.e. the semi-autoregressive ELBO; EUBO terms use complementary pairs so every token of the
   chosen block is masked in exactly one pass; a token never masked falls back to its ELBO term.
2. `bgpo` is the ELBO with constant memory; BGPO's per-draw linearised bound is the objective
   `rlvr.algos.dllm_objectives.bgpo`, which reads the draws one by one (`bgpo_draws`).
3. `elbo_mc(antithetic=True)` is not ESPO's `reduce_var` pair (mask count c ~ U{0..L} and its
   exact complement, weights (L+1)/c and (L+1)/(L−c)): that pair is unbiased too, but at small L
   the c ∈ {0, L} draws halve the estimate's scale and it had MORE variance than two plain draws
   on our enumerable model; ours keeps each half an exact LLaDA draw.
4. `mean_field` and `coupled` use the whole window as in their code (post-EOS positions masked).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from rlvr.algos._registry import Requirement, requires
from rlvr.models.prefix_block import prefix_block
from rlvr.noise import mix32, uniform_noise

WINDOWS = ("eos", "full")
NO_EXPERT_ROWS = Requirement({"expert.per_step": 0}, "expert rows have no sampler trace or old per-draw estimates for "
                             "estimator.name={name}; use another estimator (e.g. mean_field) or set it to 0",
                             field="expert.per_step")
"""Of estimators that read what only the sampler's own rows carry (a trace, the old policy's draws)."""
SPG_BOUNDS = ("elbo", "eubo", "mixture")  # `spg`'s bound for negative advantages


def window_mask(completion_ids: torch.Tensor, eos_id: int, window: str = "eos") -> torch.Tensor:
    """(B, Tc) float: 1 up to and including the first EOS (`eos`), or everywhere (`full`)."""
    if window == "full":
        return torch.ones_like(completion_ids, dtype=torch.float32)
    if window != "eos":
        raise ValueError(f"unknown window {window!r}; valid: {', '.join(WINDOWS)}")
    is_eos = (completion_ids == eos_id).long()
    before = is_eos.cumsum(-1) - is_eos  # EOS strictly before this position
    return (before == 0).float()


def row_hash(prompt_ids, prompt_mask, completion_ids, mask_seed: int) -> torch.Tensor:
    """(B,) int64 key from the row's real tokens and the mask seed (padding-invariant)."""
    h = mix32(torch.full((prompt_ids.shape[0],), int(mask_seed) & 0xFFFFFFFF, dtype=torch.int64,
                         device=prompt_ids.device) + 0x2545F491)
    for j in range(prompt_ids.shape[1]):
        mixed = mix32(h ^ mix32(prompt_ids[:, j].to(torch.int64) + 0x1B873593))
        h = torch.where(prompt_mask[:, j] > 0, mixed, h)
    for j in range(completion_ids.shape[1]):
        h = mix32(h ^ mix32(completion_ids[:, j].to(torch.int64) * 0x3C6EF372 + j + 0x68E31DA4))
    return h


def distinct_forward(model, ids: torch.Tensor, attention: torch.Tensor, positions: torch.Tensor,
                     rows: torch.Tensor | None = None) -> torch.Tensor:
    """model(ids, attention, positions) (B, T, V), with each distinct input row run once.

    Rows of a group often feed the model identical inputs: a fully masked completion (`mean_field`
    without prompt masking, `coupled`'s all-masked pass, the sampler's first step) depends on the
    prompt only, so G rows cost one row's forward and the logits (and their gradients, summed by
    the gather's backward) are shared. This assumes the forward is a function of its inputs (no
    dropout), as for `DiffusionLM`. `rows` (B,) bool, at least one True: only these rows are
    needed; the others' logits are 0 (the sampler's rows whose block is done). Values equal the
    plain call's up to float rounding of a different batch size.
    """
    batch = ids.shape[0]
    wanted = torch.arange(batch, device=ids.device) if rows is None else rows.nonzero().squeeze(-1)
    if wanted.numel() == 0:
        raise ValueError("distinct_forward: `rows` selects no row; skip the call instead")
    key = torch.cat([ids[wanted], attention[wanted].to(ids.dtype), positions[wanted].to(ids.dtype)], dim=1)
    distinct, inverse = torch.unique(key, dim=0, return_inverse=True)
    if distinct.shape[0] == batch:  # every row wanted and no two alike: the plain call
        return model(ids, attention, positions)
    first = torch.full((distinct.shape[0],), batch, dtype=torch.long, device=ids.device).scatter_reduce(
        0, inverse, wanted, reduce="amin")
    logits = model(ids[first], attention[first], positions[first])[inverse]
    if rows is None:
        return logits
    return logits.new_zeros((batch,) + logits.shape[1:]).index_copy(0, wanted, logits)


@dataclass
class Corruptor:
    """One batch of rows and the means to corrupt and denoise them. Shapes (B, Tp), (B, Tc)."""

    model: Callable
    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    valid: torch.Tensor  # (B, Tc) bool
    keys: torch.Tensor  # (B,) int64 row keys (row_hash)
    mask_id: int
    temperature: float = 1.0

    @property
    def lengths(self) -> torch.Tensor:
        return self.valid.sum(-1)  # (B,) long

    def zeros(self) -> torch.Tensor:
        """(B, Tc) float32 zeros where the rows live."""
        return torch.zeros(self.valid.shape, device=self.valid.device)

    def uniform(self, draw: int, width: int) -> torch.Tensor:
        """(B, width) float64 uniforms, a pure function of (row key, draw)."""
        return uniform_noise(self.keys, draw, width)

    def denoise(self, completion_masked: torch.Tensor, prompt_masked: torch.Tensor | None = None,
                with_entropy: bool = False):
        """ℓ (B, Tc) = log p(y_k | corrupted input) at every completion position, and entropy.

        completion_masked (B, Tc) bool: which completion positions to replace by the mask token
        (positions outside the window are masked regardless); prompt_masked (B, Tp) bool or None.
        """
        hide = completion_masked | ~self.valid
        completion_in = torch.where(hide, torch.full_like(self.completion_ids, self.mask_id), self.completion_ids)
        prompt_in = self.prompt_ids
        if prompt_masked is not None:
            prompt_in = torch.where(prompt_masked & (self.prompt_mask > 0),
                                    torch.full_like(prompt_in, self.mask_id), prompt_in)
        ids = torch.cat([prompt_in, completion_in], dim=1)
        attention = torch.cat([self.prompt_mask, torch.ones_like(self.completion_ids)], dim=1)
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        logits = self.logits(ids, attention, positions).float()
        if self.temperature != 1.0:
            logits = logits / self.temperature
        logits[..., self.mask_id] = float("-inf")  # the mask token is never a target (as in the sampler)
        logp_all = logits.log_softmax(-1)
        ell = logp_all.gather(-1, self.completion_ids[..., None]).squeeze(-1)
        # entr(p) = -p log p with entr(0) = 0: the mask id's -inf logit must not give 0 * -inf = NaN
        entropy = torch.special.entr(logp_all.detach().exp()).sum(-1) if with_entropy else None
        return ell, entropy

    def logits(self, ids, attention, positions) -> torch.Tensor:
        """(B, Tc, V) denoiser logits of the completion columns of [prompt; corrupted completion]."""
        return distinct_forward(self.model, ids, attention, positions)[:, self.prompt_ids.shape[1]:]

    def spread(self, per_row: torch.Tensor) -> torch.Tensor:
        """Sequence estimate (B,) -> B̂_i / L_i on each valid token (B, Tc)."""
        return torch.where(self.valid, (per_row / self.lengths.clamp(min=1))[:, None], torch.zeros_like(self.valid,
                           dtype=per_row.dtype))


# ---------------------------------------------------------------------------- mask draws


def elbo_draw(ctx: Corruptor, j: int, n: int, *, antithetic: bool, salt: int = 0):
    """The j-th of n stratified draws: list of (mask (B, Tc) bool, weight (B,)) passes whose
    Σ_pass weight · Σ_{masked} ℓ is an unbiased estimate of the sequence ELBO.

    Plain: m ~ U{1..L} (stratified over the n draws), exactly m valid positions, weight L/m.
    Antithetic: the same M plus M' = complement of M and one uniformly chosen position of M, so
    |M'| = L + 1 − m; each half is marginally a plain draw (weights halved), every token is masked
    in at least one half, and constant logits still give zero variance.
    """
    lengths = ctx.lengths.to(torch.float64)
    u = (ctx.uniform(salt * 1_000 + 999, 1)[:, 0] + j) / n % 1.0  # stratified over the n draws
    count = (u * lengths).floor().long() + 1  # U{1..L}
    scores = ctx.uniform(salt * 1_000 + j, ctx.valid.shape[1]).masked_fill(~ctx.valid, 2.0)
    rank = scores.argsort(-1).argsort(-1)
    mask = (rank < count[:, None]) & ctx.valid
    if not antithetic:
        return [(mask, lengths / count.clamp(min=1))]
    # the shared position: the masked one with the largest score (uniform among M by symmetry)
    mirror = (ctx.valid & ~mask) | ((rank == (count - 1)[:, None]) & ctx.valid)
    rest = ctx.lengths + 1 - count
    return [(mask, 0.5 * lengths / count.clamp(min=1)), (mirror, 0.5 * lengths / rest.clamp(min=1))]


def _elbo_draw_value(ctx: Corruptor, j: int, n: int, antithetic: bool, with_entropy: bool):
    """(sequence estimate of draw j (B,), entropy sum (B, Tc), times-masked (B, Tc))."""
    total, ent, hits = 0.0, ctx.zeros(), ctx.zeros()
    for mask, weight in elbo_draw(ctx, j, n, antithetic=antithetic):
        ell, h = ctx.denoise(mask, with_entropy=with_entropy)
        total = total + weight.float() * torch.where(mask, ell, torch.zeros_like(ell)).sum(-1)
        if with_entropy:
            ent, hits = ent + h * mask, hits + mask.float()
    return total, ent, hits


def _entropy_mean(ent, hits):
    return ent / hits.clamp(min=1)


# ---------------------------------------------------------------------------- estimators


def mean_field(ctx: Corruptor, *, p_mask_prompt: float = 0.15, with_entropy: bool = False):
    """d1 / diffu-GRPO / wd1: one forward, completion all masked, prompt tokens masked w.p. p."""
    prompt_masked = ctx.uniform(17, ctx.prompt_ids.shape[1])[:, :].lt(p_mask_prompt) if p_mask_prompt > 0 else None
    everything = torch.ones_like(ctx.valid)
    return ctx.denoise(everything, prompt_masked, with_entropy)


def coupled(ctx: Corruptor, *, t_min: float = 0.2, t_max: float = 0.8, include_full: bool = True,
            with_entropy: bool = False):
    """coupled-GRPO: t ~ U(t_min, t_max), mask M_t and its complement (weights 1/t, 1/(1-t)),
    averaged with the all-masked pass as the released code does."""
    t = (t_min + (t_max - t_min) * ctx.uniform(23, 1)).float()  # (B, 1)
    first = ctx.uniform(29, ctx.valid.shape[1]).float() < t
    ell1, h1 = ctx.denoise(first, with_entropy=with_entropy)
    ell2, h2 = ctx.denoise(~first, with_entropy=with_entropy)
    pair = torch.where(first, ell1 / t, ell2 / (1 - t))
    ent = torch.where(first, h1, h2) if with_entropy else None
    if not include_full:
        return pair, ent
    ell0, h0 = ctx.denoise(torch.ones_like(ctx.valid), with_entropy=with_entropy)
    return 0.5 * (ell0 + pair), (0.5 * (h0 + ent) if with_entropy else None)


def elbo_mc(ctx: Corruptor, *, n: int = 2, antithetic: bool = False, with_entropy: bool = False):
    """ESPO / VRPO-OL: mean of n stratified ELBO draws, spread over the row (all graphs kept)."""
    total, ent, hits = 0.0, 0.0, 0.0
    for j in range(n):
        value, e, k = _elbo_draw_value(ctx, j, n, antithetic, with_entropy)
        total, ent, hits = total + value, ent + e, hits + k
    return ctx.spread(total / n), (_entropy_mean(ent, hits) if with_entropy else None)


class _SumOfRecomputed(torch.autograd.Function):
    """out = Σ_j piece(j), computed without graph; backward recomputes each piece with graph and
    back-propagates it at once (parameter .grad accumulates), so memory holds one piece's graph."""

    @staticmethod
    def forward(fctx, anchor, piece, count):
        fctx.piece, fctx.count = piece, count
        with torch.no_grad():
            return sum(piece(j) for j in range(count))

    @staticmethod
    def backward(fctx, grad):
        with torch.enable_grad():
            for j in range(fctx.count):
                torch.autograd.backward(fctx.piece(j), grad)
        return None, None, None


def sum_of_recomputed(piece: Callable[[int], torch.Tensor], count: int) -> torch.Tensor:
    """Σ_j piece(j) with O(1) graph memory in `count` (see `_SumOfRecomputed`)."""
    anchor = torch.zeros((), requires_grad=torch.is_grad_enabled())  # a 0-dim graph anchor: no device data
    if not torch.is_grad_enabled():
        return sum(piece(j) for j in range(count))
    return _SumOfRecomputed.apply(anchor, piece, count)


class _StackOfRecomputed(torch.autograd.Function):
    """out[j] = piece(j), computed without graph; backward recomputes each piece with graph and
    back-propagates grad[j] into it at once, so memory holds one piece's graph whatever the loss
    does with the stack (BGPO's per-draw exp and clip)."""

    @staticmethod
    def forward(fctx, anchor, piece, count):
        fctx.piece, fctx.count = piece, count
        with torch.no_grad():
            return torch.stack([piece(j) for j in range(count)])

    @staticmethod
    def backward(fctx, grad):
        with torch.enable_grad():
            for j in range(fctx.count):
                torch.autograd.backward(fctx.piece(j), grad[j])
        return None, None, None


def stack_of_recomputed(piece: Callable[[int], torch.Tensor], count: int) -> torch.Tensor:
    """torch.stack([piece(j) for j < count]) with O(1) graph memory in `count`."""
    anchor = torch.zeros((), requires_grad=torch.is_grad_enabled())
    if not torch.is_grad_enabled():
        return torch.stack([piece(j) for j in range(count)])
    return _StackOfRecomputed.apply(anchor, piece, count)


def bgpo_draws(ctx: Corruptor, *, n: int = 16, antithetic: bool = False, with_entropy: bool = False):
    """((B, n), entropy (B, Tc) | None): draw j's sequence ELBO estimate over the row's length,
    e_j / L (the masks of `bgpo` and `elbo_mc` for the same n), each recomputed alone in the
    backward. Their mean, spread over the row, is `bgpo`'s value; the entropy is `bgpo`'s."""
    def piece(j):
        return _elbo_draw_value(ctx, j, n, antithetic, False)[0] / ctx.lengths.clamp(min=1)

    return stack_of_recomputed(piece, n).T, (_bgpo_entropy(ctx, n) if with_entropy else None)


@torch.no_grad()
def _bgpo_entropy(ctx: Corruptor, n: int) -> torch.Tensor:
    # one antithetic pair (2 forwards) masks every valid token at least once
    return _entropy_mean(*_elbo_draw_value(ctx, 0, n, True, True)[1:])


@requires(NO_EXPERT_ROWS)
def bgpo(ctx: Corruptor, *, n: int = 16, antithetic: bool = False, with_entropy: bool = False):
    """BGPO: the `elbo_mc` estimate (same masks for the same n), each draw back-propagated alone."""
    def piece(j):
        return ctx.spread(_elbo_draw_value(ctx, j, n, antithetic, False)[0] / n)

    return sum_of_recomputed(piece, n), (_bgpo_entropy(ctx, n) if with_entropy else None)


def _block_draw(ctx: Corruptor, j: int, n: int, block_length: int):
    """SPG block-wise draw: block k (stratified over draws) gets a count c ~ U{0..b_k} and its
    complement; earlier blocks clean, later blocks masked. Returns [(mask, weight, scored)]."""
    lengths = ctx.lengths
    num_blocks = (lengths + block_length - 1) // block_length  # (B,)
    u = (ctx.uniform(7_777, 1)[:, 0] + j) / n % 1.0
    chosen = (u * num_blocks).floor().long()  # (B,)
    pos = torch.arange(ctx.valid.shape[1], device=ctx.valid.device)[None, :]
    block_of = pos // block_length
    in_block = (block_of == chosen[:, None]) & ctx.valid
    later = block_of > chosen[:, None]
    size = in_block.sum(-1)
    count = (ctx.uniform(7_000 + j, 1)[:, 0] * (size + 1)).floor().long()
    scores = ctx.uniform(8_000 + j, ctx.valid.shape[1]).masked_fill(~in_block, 2.0)
    first = (scores.argsort(-1).argsort(-1) < count[:, None]) & in_block
    scale = num_blocks.double() * 0.5 * (size + 1).double()
    return [(first | later, scale / count.clamp(min=1), first),
            ((in_block & ~first) | later, scale / (size - count).clamp(min=1), in_block & ~first)]


def spg(ctx: Corruptor, *, advantages: torch.Tensor | None = None, n: int = 2, beta: float = 1.5,
        omega: float = 0.5, bound: str = "mixture", block_length: int | None = None,
        with_entropy: bool = False):
    """SPG: ELBO where A >= 0, EUBO (`bound=eubo`) or ω·EUBO + (1-ω)·ELBO (`mixture`) where A < 0.

    EUBO per token: (1/β) log mean_passes[w · 1[masked] · p^β], summed over tokens.
    `advantages` (B,) or (B, Tc) is required unless bound == "elbo".
    """
    if bound not in SPG_BOUNDS:
        raise ValueError(f"spg: unknown bound {bound!r}; valid: {', '.join(SPG_BOUNDS)}")
    if bound != "elbo" and advantages is None:
        raise ValueError("spg needs advantages= (their sign picks ELBO or EUBO); pass them to token_logprobs")
    elbo_tok = ctx.zeros()
    log_terms, ent, hits = [], ctx.zeros(), ctx.zeros()
    for j in range(n):
        if block_length:
            passes = _block_draw(ctx, j, n, block_length)
        else:
            passes = [(m, w, m) for m, w in elbo_draw(ctx, j, n, antithetic=True, salt=3)]
        for mask, weight, scored in passes:
            ell, h = ctx.denoise(mask, with_entropy=with_entropy)
            w = weight.float()[:, None]
            elbo_tok = elbo_tok + torch.where(scored, w * ell, torch.zeros_like(ell)) / n
            log_terms.append(torch.where(scored, w.log() + beta * ell, torch.full_like(ell, float("-inf"))))
            if with_entropy:
                ent, hits = ent + h * scored, hits + scored.float()
    elbo = ctx.spread(elbo_tok.sum(-1))
    entropy = _entropy_mean(ent, hits) if with_entropy else None
    if bound == "elbo":
        return elbo, entropy
    stacked = torch.stack(log_terms)  # (passes, B, Tc)
    covered = torch.isfinite(stacked).any(0) & ctx.valid
    safe = torch.where(torch.isfinite(stacked), stacked, torch.full_like(stacked, -1e4))
    eubo_tok = (torch.logsumexp(safe, 0) - math.log(n)) / beta
    eubo_tok = torch.where(covered, eubo_tok, elbo_tok)  # never-masked token: fall back to its ELBO term
    eubo = ctx.spread(torch.where(ctx.valid, eubo_tok, torch.zeros_like(eubo_tok)).sum(-1))
    upper = eubo if bound == "eubo" else omega * eubo + (1 - omega) * elbo
    adv = advantages if advantages.dim() == 1 else advantages[:, 0]
    return torch.where((adv >= 0)[:, None], elbo, upper), entropy


@requires(NO_EXPERT_ROWS)
def trace(ctx: Corruptor, *, trace: torch.Tensor | None = None, shrink: int = 1, with_entropy: bool = False):
    """TraceRL (shrink σ) / CJ-GRPO (σ = 1): log p(y_k | state before the merged step that committed
    y_k), the state being the completion with every token of that or a later step masked.
    Replays the real state: post-EOS tokens are kept as the sampler saw them."""
    if trace is None:
        raise ValueError("trace estimator: no trace for these rows; pass the sampler's Rollouts.trace "
                         "(TrainBatch.trace, or trace= to token_logprobs)")
    merged = trace // shrink
    values = ctx.zeros()
    ent = ctx.zeros() if with_entropy else None
    full = ctx.valid
    ctx.valid = torch.ones_like(full)  # replay the whole window (no forced masking outside it)
    try:
        for s in torch.unique(merged[full]).tolist():
            ell, h = ctx.denoise(merged >= s, with_entropy=with_entropy)
            target = merged == s
            values = torch.where(target, ell, values)
            if with_entropy:
                ent = torch.where(target, h, ent)
    finally:
        ctx.valid = full
    return values, ent


def ar_order(ctx: Corruptor, *, with_entropy: bool = False):
    """JustGRPO: log p(y_k | prompt, y_<k visible, y_>=k masked) for every k; one forward per
    position, each back-propagated on its own (constant memory in L)."""
    width = ctx.valid.shape[1]
    pos = torch.arange(width, device=ctx.valid.device)
    entropy = ctx.zeros() if with_entropy else None

    def piece(k):
        # the entropy is read off the no-grad value pass (never the backward recompute): no extra forwards
        want = with_entropy and not torch.is_grad_enabled()
        ell, h = ctx.denoise((pos >= k)[None, :].expand_as(ctx.valid), with_entropy=want)
        if want:
            entropy[:, k] = h[:, k]
        return torch.where((pos == k)[None, :], ell, torch.zeros_like(ell))

    return sum_of_recomputed(piece, width), entropy


ESTIMATORS: dict[str, Callable] = {
    "mean_field": mean_field, "coupled": coupled, "elbo_mc": elbo_mc, "bgpo": bgpo, "spg": spg,
    "trace": trace, "ar_order": ar_order, "prefix_block": prefix_block,
}
SEQUENCE_LEVEL = frozenset({"elbo_mc", "bgpo", "spg"})


def get_estimator(name: str) -> Callable:
    if name not in ESTIMATORS:
        raise ValueError(f"unknown likelihood estimator {name!r}; valid: {', '.join(sorted(ESTIMATORS))}")
    return ESTIMATORS[name]


__all__ = ["ESTIMATORS", "SEQUENCE_LEVEL", "SPG_BOUNDS", "WINDOWS", "Corruptor", "ar_order", "bgpo", "bgpo_draws",
           "coupled", "distinct_forward", "elbo_draw", "elbo_mc", "get_estimator", "mean_field", "row_hash", "spg",
           "stack_of_recomputed", "sum_of_recomputed", "trace", "window_mask"]
