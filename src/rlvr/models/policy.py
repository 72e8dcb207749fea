"""PolicyModel for causal LMs: log-probs of given completion tokens under the current weights.

This is the seam that lets the trainer stay model-agnostic: the update step only
calls `token_logprobs`. A masked-diffusion policy implements the same method with a named
likelihood estimator.
"""

from __future__ import annotations

import contextlib
import threading

import torch
from torch.utils.checkpoint import checkpoint

from rlvr.kernels import training
from rlvr.kernels.weights import LlamaWeights, supports

CHUNK_ELEMENTS = 1 << 24
"""The fast path computes the LM head in row chunks once tokens × vocabulary exceeds this (64 MB
of float32 per (tokens, vocabulary) tensor; the default 101-token vocabulary never does)."""


def gather_logprobs(logits: torch.Tensor, tokens: torch.Tensor, *, chunk_size: int = 4096) -> torch.Tensor:
    """log softmax(logits)[tokens] without materialising (B, T, V) log-probs. (B,T,V),(B,T) -> (B,T).

    logsumexp is taken over vocabulary chunks so a 150k-token vocabulary costs one extra
    (B, T, chunk) buffer, not a second full-vocabulary tensor.
    """
    picked = logits.gather(-1, tokens[..., None]).squeeze(-1)
    if logits.shape[-1] <= chunk_size:
        return picked - logits.logsumexp(-1)
    parts = [chunk.logsumexp(-1) for chunk in logits.split(chunk_size, dim=-1)]
    return picked - torch.stack(parts, -1).logsumexp(-1)


def chunked_head_logprobs(head, hidden: torch.Tensor, tokens: torch.Tensor, *, temperature: float = 1.0,
                          with_entropy: bool = False, chunk_rows: int = 256):
    """log softmax(head(hidden) / temperature)[tokens] and the entropy, in row chunks.
    hidden (M, H), tokens (M,) -> (log-probs (M,), entropy (M,) or None).

    Each chunk's (chunk_rows, V) logits are recomputed in the backward pass (activation
    checkpointing), so peak memory holds a few (chunk_rows, V) tensors instead of several (M, V)
    ones (logits, scaled logits, log-softmax and its exp for the entropy): the difference
    between megabytes and gigabytes at a 150k-token vocabulary. Same values and gradients as the
    unchunked computation up to float summation order (tests/perf).
    """
    def piece(h, t):
        logits = head(h).float() / temperature
        logp = gather_logprobs(logits[None], t[None])[0]
        return (logp, token_entropy(logits)) if with_entropy else (logp,)

    grad = torch.is_grad_enabled()
    parts = [checkpoint(piece, h, t, use_reentrant=False) if grad else piece(h, t)
             for h, t in zip(hidden.split(chunk_rows), tokens.split(chunk_rows))]
    logp = torch.cat([p[0] for p in parts])
    return logp, (torch.cat([p[1] for p in parts]) if with_entropy else None)


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
    any other model runs the plain `transformers` forward.
    """

    def __init__(self, model, *, temperature: float = 1.0, fast: bool = True, kernels: str = "eager",
                 checkpointing: bool = False):
        self.model = model
        # True: the model's layers were set to recompute activations (`trainer.gradient_checkpointing`);
        # transformers does so only in training mode, which the plain forward switches on for them.
        self.checkpointing = checkpointing
        self._lock, self._users, self._switched = threading.Lock(), 0, []
        self.temperature = temperature if temperature > 0 else 1.0
        self.fast = fast
        self.kernels = kernels  # "cpp": the fast path's layers run as C++ calls forward and backward
        self._module = None
        self.forwards = 0  # module forwards (the fused fast path bypasses the module and is not counted)
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

    def token_logprobs(self, prompt_ids, prompt_mask, completion_ids, *, with_entropy: bool = False,
                       completion_mask=None):
        """Log-probs (B, Tc) of `completion_ids` given the prompts, and entropy (B, Tc) or None.

        `completion_mask` (B, Tc), optional: positions after a row's last 1 are not computed
        (their log-prob and entropy are 0), which skips the padding of short completions.
        """
        if self.fast and completion_ids.shape[1] and supports(self.model):
            return self._fast_logprobs(prompt_ids, prompt_mask, completion_ids, with_entropy, completion_mask)
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
        logp = gather_logprobs(logits, completion_ids)
        entropy = token_entropy(logits) if with_entropy else None
        if completion_mask is not None:
            keep = _up_to_last_one(completion_mask)
            logp = logp * keep
            entropy = None if entropy is None else entropy * keep
        return logp, entropy

    def _fast_logprobs(self, prompt_ids, prompt_mask, completion_ids, with_entropy, completion_mask):
        lengths = None
        if completion_mask is not None:
            lengths = _up_to_last_one(completion_mask).sum(-1).long()
        w = LlamaWeights(self.model, kernels=self._kernels() is not None)
        hidden, index = training.completion_hidden(w, prompt_ids, prompt_mask, completion_ids, lengths)
        tokens = completion_ids.flatten()[index]
        size = completion_ids.numel()
        vocab = w.lm_head.shape[0]
        if hidden.shape[0] * vocab > CHUNK_ELEMENTS:  # large vocabulary: never hold (M, V) tensors
            logp, entropy = chunked_head_logprobs(w.logits, hidden, tokens, temperature=self.temperature,
                                                  with_entropy=with_entropy,
                                                  chunk_rows=max(1, CHUNK_ELEMENTS // 4 // vocab))
        else:
            logits = w.logits(hidden).float()                                 # (M, V), packed
            if self.temperature != 1.0:  # x / 1 is x exactly: skip the op (and its backward)
                logits = logits / self.temperature
            logp = gather_logprobs(logits[None], tokens[None])[0]
            entropy = token_entropy(logits) if with_entropy else None
        logp = logp.new_zeros(size).index_copy(0, index, logp).view_as(completion_ids)
        if with_entropy:
            entropy = entropy.new_zeros(size).index_copy(0, index, entropy).view_as(completion_ids)
        return logp, entropy

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

