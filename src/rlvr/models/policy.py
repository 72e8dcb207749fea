"""PolicyModel for causal LMs: log-probs of given completion tokens under the current weights.

This is the seam of DESIGN §2 that lets the trainer stay model-agnostic: the update step only
calls `token_logprobs`. A masked-diffusion policy implements the same method with a named
likelihood estimator.
"""

from __future__ import annotations

import torch

from rlvr.models import llama_fast


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

    Llama-family models use `models.llama_fast` (each distinct prompt is run once for its whole
    group; same log-probs and gradients as the plain forward, tests/perf); `fast=False` or any
    other model runs the plain `transformers` forward.
    """

    def __init__(self, model, *, temperature: float = 1.0, fast: bool = True):
        self.model = model
        self.temperature = temperature if temperature > 0 else 1.0
        self.fast = fast

    def parameters(self):
        return self.model.parameters()

    def set_mask_seed(self, seed: int) -> None:
        """Exact log-probs draw no masks; present so every PolicyModel has the same surface."""

    def token_logprobs(self, prompt_ids, prompt_mask, completion_ids, *, with_entropy: bool = False,
                       completion_mask=None, **_estimator_inputs):
        """Log-probs (B, Tc) of `completion_ids` given the prompts, and entropy (B, Tc) or None.

        `completion_mask` (B, Tc), optional: positions after a row's last 1 are not computed
        (their log-prob and entropy are 0), which skips the padding of short completions.
        `_estimator_inputs` (e.g. `advantages=`) feed estimators of other policies; exact
        log-probs need none of them.
        """
        if self.fast and completion_ids.shape[1] and llama_fast.supports(self.model):
            return self._fast_logprobs(prompt_ids, prompt_mask, completion_ids, with_entropy, completion_mask)
        ids, attention, positions = sequence_inputs(prompt_ids, prompt_mask, completion_ids)
        width = completion_ids.shape[1]
        # Only the positions that predict completion tokens need logits (the last width+1, minus one).
        out = self.model(input_ids=ids, attention_mask=attention, position_ids=positions,
                         logits_to_keep=width + 1, use_cache=False)
        logits = out.logits[:, :-1].float() / self.temperature  # (B, Tc, V)
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
        w = llama_fast.LlamaWeights(self.model)
        hidden, index = llama_fast.completion_hidden(w, prompt_ids, prompt_mask, completion_ids, lengths)
        logits = w.logits(hidden).float() / self.temperature                  # (M, V), packed
        tokens = completion_ids.flatten()[index]
        size = completion_ids.numel()
        logp = gather_logprobs(logits[None], tokens[None])[0]
        logp = logp.new_zeros(size).index_copy(0, index, logp).view_as(completion_ids)
        entropy = None
        if with_entropy:
            entropy = token_entropy(logits)
            entropy = entropy.new_zeros(size).index_copy(0, index, entropy).view_as(completion_ids)
        return logp, entropy


def _up_to_last_one(mask: torch.Tensor) -> torch.Tensor:
    """(B, T) float: 1 up to and including each row's last nonzero of `mask`, 0 after."""
    nonzero = (mask != 0).float()
    return nonzero.flip(-1).cummax(-1).values.flip(-1)
