"""PolicyModel for causal LMs: log-probs of given completion tokens under the current weights.

This is the seam that lets the trainer stay model-agnostic: the update step only
calls `token_logprobs`. A masked-diffusion policy implements the same method with a named
likelihood estimator. A loss or an estimator that reads more of the logits than the log-prob of
the sampled token (ShiQ's logsumexp, the optimal token baseline's Σπ²) asks `batch_token_stats`
for them: same forward, same logits, nothing extra computed for a loss that asks for none.
"""

from __future__ import annotations

import contextlib
import threading

import torch
from torch.utils.checkpoint import checkpoint

from rlvr.kernels import training
from rlvr.kernels.weights import LlamaWeights, supports
from rlvr.models import packing

CHUNK_ELEMENTS = 1 << 24
"""The fast path computes the LM head in row chunks once tokens × vocabulary exceeds this (64 MB
of float32 per (tokens, vocabulary) tensor; the default 101-token vocabulary never does)."""


def _logsumexp(logits: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """logsumexp over the last dim, over vocabulary chunks so a 150k-token vocabulary costs one
    extra (B, T, chunk) buffer, not a second full-vocabulary tensor."""
    if logits.shape[-1] <= chunk_size:
        return logits.logsumexp(-1)
    return torch.stack([chunk.logsumexp(-1) for chunk in logits.split(chunk_size, dim=-1)], -1).logsumexp(-1)


LOGIT_STATS = ("logsumexp", "logit", "sum_pi_squared")
"""Per-token statistics of the (temperature-scaled) logits a policy can return beside the
log-probs, from the same forward (`CausalPolicy.batch_token_stats`): `logsumexp` lse(ℓ) (the soft
value ShiQ reads), `logit` ℓ at the sampled token (= log-prob + logsumexp), `sum_pi_squared`
Σ_v π_v² = exp(lse(2ℓ) − 2 lse(ℓ)) (verl's form; the optimal token baseline reads it)."""


def head_outputs(logits: torch.Tensor, tokens: torch.Tensor, *, with_entropy: bool = False,
                 stats: tuple[str, ...] = (), chunk_size: int = 4096):
    """(log-probs, entropy or None, {stat: values}) of `tokens` under softmax(`logits`), all
    (...,) from one logits tensor (..., V). The logsumexp of the log-probs is reused for the
    `logsumexp` and `logit` stats, so they cost a gather at most; `sum_pi_squared` costs one
    more logsumexp. No stat asked: log softmax(logits)[tokens] (and `token_entropy`)."""
    unknown = set(stats) - set(LOGIT_STATS)
    if unknown:
        raise ValueError(f"unknown logit stats {sorted(unknown)}; valid: {', '.join(LOGIT_STATS)}")
    picked = logits.gather(-1, tokens[..., None]).squeeze(-1)
    lse = _logsumexp(logits, chunk_size)
    extra = {}
    if "logsumexp" in stats:
        extra["logsumexp"] = lse
    if "logit" in stats:
        extra["logit"] = picked
    if "sum_pi_squared" in stats:
        extra["sum_pi_squared"] = torch.exp(_logsumexp(2.0 * logits, chunk_size) - 2.0 * lse)
    return picked - lse, (token_entropy(logits) if with_entropy else None), extra


def chunked_head_logprobs(head, hidden: torch.Tensor, tokens: torch.Tensor, *, temperature: float = 1.0,
                          with_entropy: bool = False, chunk_rows: int = 256, stats: tuple[str, ...] = ()):
    """log softmax(head(hidden) / temperature)[tokens] and the entropy, in row chunks.
    hidden (M, H), tokens (M,) -> (log-probs (M,), entropy (M,) or None); with `stats`
    (`LOGIT_STATS` names) a third element {stat: (M,)}.

    Each chunk's (chunk_rows, V) logits are recomputed in the backward pass (activation
    checkpointing), so peak memory holds a few (chunk_rows, V) tensors instead of several (M, V)
    ones (logits, scaled logits, log-softmax and its exp for the entropy): the difference
    between megabytes and gigabytes at a 150k-token vocabulary. Same values and gradients as the
    unchunked computation up to float summation order (tests/perf).
    """
    def piece(h, t):
        logp, entropy, extra = head_outputs(head(h).float() / temperature, t, with_entropy=with_entropy,
                                            stats=stats)
        return (logp, *([entropy] if with_entropy else []), *(extra[k] for k in stats))

    grad = torch.is_grad_enabled()
    parts = [checkpoint(piece, h, t, use_reentrant=False) if grad else piece(h, t)
             for h, t in zip(hidden.split(chunk_rows), tokens.split(chunk_rows))]
    columns = [torch.cat(col) for col in zip(*parts)]
    logp, entropy = columns[0], (columns[1] if with_entropy else None)
    if not stats:
        return logp, entropy
    return logp, entropy, dict(zip(stats, columns[1 + with_entropy:]))


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) per position. (B, T, V) -> (B, T)."""
    logp = logits.log_softmax(-1)
    return -(logp.exp() * logp).sum(-1)


def sequence_inputs(prompt_ids, prompt_mask, completion_ids):
    """Concatenate left-padded prompts and right-padded completions: ids, attention, positions (B, S)."""
    ids = torch.cat([prompt_ids, completion_ids], dim=-1)
    attention = torch.cat([prompt_mask, torch.ones_like(completion_ids)], dim=-1)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    return ids, attention, positions


class CausalPolicy:
    """Wraps a `transformers` causal LM; temperature matches the sampler's so ratios are exact.

    Llama-family models use `rlvr.kernels.training` (each distinct prompt is run once for its
    whole group; same log-probs and gradients as the plain forward, tests/perf); `fast=False` or
    any other model runs the plain `transformers` forward: padding-free (`models.packing`) when
    `packing` names a layout, else one padded row per completion.
    """

    exact_logprobs = True  # its training forward gives the log-probs themselves (the step may keep them)

    def __init__(self, model, *, temperature: float = 1.0, fast: bool = True, kernels: str = "eager",
                 checkpointing: bool = False, packing: str | None = None):
        self.model = model
        # None: the padded forward; "packed" / "shared": `models.packing`'s (the builder probed the model)
        self.packing = packing
        # True: the model's layers were set to recompute activations (`trainer.gradient_checkpointing`);
        # transformers does so only in training mode, which the plain forward switches on for them.
        self.checkpointing = checkpointing
        self._lock, self._users, self._switched = threading.Lock(), 0, []
        self.temperature = temperature if temperature > 0 else 1.0
        self.fast = fast
        self.kernels = kernels  # "cpp": the fast path's layers run as C++ calls forward and backward
        self._module = None
        self.forwards = 0  # model forwards, padded or packed (the fused fast path is not counted)
        model.register_forward_hook(self._count_forward)

    def _count_forward(self, module, args, output) -> None:
        self.forwards += 1

    def parameters(self):
        return self.model.parameters()

    def begin_step(self, seed: int) -> None:
        """Exact log-probs draw no random masks: nothing to seed."""

    def batch_logprobs(self, batch, *, with_entropy: bool = False):
        """`token_logprobs` of a `TrainBatch` (the PolicyModel seam)."""
        return self.token_logprobs(batch.prompt_ids, batch.prompt_mask, batch.completion_ids,
                                   with_entropy=with_entropy, completion_mask=batch.completion_mask)

    def batch_token_stats(self, batch, *, with_entropy: bool = False, stats: tuple[str, ...] = ()):
        """`batch_logprobs` plus {stat: (B, Tc)} for the `LOGIT_STATS` names in `stats`, from the
        same forward and the same logits (the LogitStatsPolicy seam); 0 where log-probs are 0."""
        return self._outputs(batch.prompt_ids, batch.prompt_mask, batch.completion_ids, with_entropy,
                             batch.completion_mask, tuple(stats))

    def token_logprobs(self, prompt_ids, prompt_mask, completion_ids, *, with_entropy: bool = False,
                       completion_mask=None):
        """Log-probs (B, Tc) of `completion_ids` given the prompts, and entropy (B, Tc) or None.

        `completion_mask` (B, Tc), optional: positions after a row's last 1 are not computed
        (their log-prob and entropy are 0), which skips the padding of short completions.
        """
        logp, entropy, _ = self._outputs(prompt_ids, prompt_mask, completion_ids, with_entropy, completion_mask, ())
        return logp, entropy

    def _outputs(self, prompt_ids, prompt_mask, completion_ids, with_entropy, completion_mask, stats):
        if self.fast and completion_ids.shape[1] and supports(self.model):
            return self._fast_outputs(prompt_ids, prompt_mask, completion_ids, with_entropy, completion_mask, stats)
        if self.packing and completion_ids.shape[1]:
            return self._packed_outputs(prompt_ids, prompt_mask, completion_ids, with_entropy, completion_mask, stats)
        device = self.model.get_input_embeddings().weight.device
        if completion_ids.device != device:  # trainer tensors live on the host; the model may not
            prompt_ids, prompt_mask, completion_ids = (x.to(device) for x in (prompt_ids, prompt_mask, completion_ids))
            completion_mask = None if completion_mask is None else completion_mask.to(device)
        ids, attention, positions = sequence_inputs(prompt_ids, prompt_mask, completion_ids)
        width = completion_ids.shape[1]
        # Only the positions that predict completion tokens need logits (the last width+1, minus one).
        with self._recompute():
            out = self.model(input_ids=ids, attention_mask=attention, position_ids=positions,
                             logits_to_keep=width + 1, use_cache=False)
        logits = out.logits[:, :-1].float() / self.temperature  # (B, Tc, V), float32 whatever the weights
        logp, entropy, extra = head_outputs(logits, completion_ids, with_entropy=with_entropy, stats=stats)
        if completion_mask is not None:
            keep = _up_to_last_one(completion_mask)
            logp = logp * keep
            entropy = None if entropy is None else entropy * keep
            extra = {k: v * keep for k, v in extra.items()}
        return logp, entropy, extra

    def _fast_outputs(self, prompt_ids, prompt_mask, completion_ids, with_entropy, completion_mask, stats):
        lengths = None
        if completion_mask is not None:
            lengths = _up_to_last_one(completion_mask).sum(-1).long()
        w = LlamaWeights(self.model, kernels=self._kernels() is not None)
        hidden, index = training.completion_hidden(w, prompt_ids, prompt_mask, completion_ids, lengths)
        return self._scored_outputs(w.logits, w.lm_head.shape[0], hidden, index, completion_ids, with_entropy, stats)

    def _packed_outputs(self, prompt_ids, prompt_mask, completion_ids, with_entropy, completion_mask, stats):
        """The padding-free forward of any causal LM (`models.packing`; `self.packing` names the layout)."""
        lm = packing.causal_lm_of(self.model)
        device = lm.get_input_embeddings().weight.device
        prompt_ids, prompt_mask, completion_ids = (x.to(device) for x in (prompt_ids, prompt_mask, completion_ids))
        lengths = (torch.full(completion_ids.shape[:1], completion_ids.shape[1], device=device)
                   if completion_mask is None else _up_to_last_one(completion_mask.to(device)).sum(-1).long())
        self.forwards += 1  # one forward of the model's own layers, as the padded path's module call counts
        with self._recompute():
            hidden, index = packing.packed_hidden(packing.body_of(lm), prompt_ids, prompt_mask, completion_ids, lengths,
                                                  share=self.packing == "shared")
        head = packing.head_function(lm)
        return self._scored_outputs(head, lm.get_output_embeddings().weight.shape[0], hidden, index, completion_ids,
                                    with_entropy, stats)

    def _scored_outputs(self, head, vocab: int, hidden, index, completion_ids, with_entropy, stats):
        """Log-probs, entropy and stats of the scored tokens from the hidden states predicting them
        (hidden (M, H), index (M,) into (B, Tc)), scattered into (B, Tc) grids, 0 elsewhere."""
        tokens = completion_ids.flatten()[index]
        size = completion_ids.numel()
        if hidden.shape[0] * vocab > CHUNK_ELEMENTS:  # large vocabulary: never hold (M, V) tensors
            logp, entropy, *extra = chunked_head_logprobs(head, hidden, tokens, temperature=self.temperature,
                                                          with_entropy=with_entropy, stats=stats,
                                                          chunk_rows=max(1, CHUNK_ELEMENTS // 4 // vocab))
            extra = extra[0] if extra else {}
        else:
            logits = head(hidden).float()                                     # (M, V), packed
            if self.temperature != 1.0:  # x / 1 is x exactly: skip the op (and its backward)
                logits = logits / self.temperature
            logp, entropy, extra = head_outputs(logits, tokens, with_entropy=with_entropy, stats=stats)

        def grid(packed):  # packed (M,) -> (B, Tc), 0 at positions not computed
            return packed.new_zeros(size).index_copy(0, index, packed).view_as(completion_ids)

        return grid(logp), (grid(entropy) if with_entropy else None), {k: grid(v) for k, v in extra.items()}

    @contextlib.contextmanager
    def _recompute(self):
        """Checkpointed layers in training mode for this forward (only their own flag, so dropout
        elsewhere keeps the model's mode), when gradients are being taken. Counted, so row workers
        in flight together share one switch."""
        if not (self.checkpointing and torch.is_grad_enabled()):
            yield
            return
        with self._lock:
            if self._users == 0:
                self._switched = [m for m in self.model.modules()
                                  if getattr(m, "gradient_checkpointing", False) is True and not m.training]
                for m in self._switched:
                    m.training = True
            self._users += 1
        try:
            yield
        finally:
            with self._lock:
                self._users -= 1
                if self._users == 0:
                    for m in self._switched:
                        m.training = False

    def _kernels(self):
        if self.kernels != "cpp":
            return None
        if self._module is None:  # loaded (or found missing, with one stderr line) on first use
            self._module = training.kernels_for(self.model) or False
        return self._module or None


def _up_to_last_one(mask: torch.Tensor) -> torch.Tensor:
    """(B, T) float: 1 up to and including each row's last nonzero of `mask`, 0 after."""
    nonzero = (mask != 0).float()
    return nonzero.flip(-1).cummax(-1).values.flip(-1)

