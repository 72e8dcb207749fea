"""Batched autoregressive sampler with a KV cache, for any `transformers` causal LM.

Returns everything the trainer needs (the RolloutEngine seam): completion ids and mask,
behaviour log-probs and the finish reason. Sampling is Gumbel-max over per-sample hashed noise
(`rlvr.noise`), so the same seed gives the same completion whatever else is in the batch.

Log-prob semantics: behaviour log-probs are log-softmax(logits / temperature) of the sampled
token *before* the repetition penalty and the top-p / top-k / min-p truncation, the same quantity
the trainer recomputes; with either on, the distribution sampled is not the one recorded (verl
records before truncation; TRL's `transformers` path trains on the model's own log-probs whatever
`repetition_penalty` sampled from). The samples are then treated as on-policy: the recorded and
recomputed log-probs agree, so no importance weight corrects for the penalty. The vLLM engine
records the processed distribution instead and corrects by rollout correction (`engines.vllm`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rlvr.batch import Rollouts
from rlvr.kernels.decoder import Decoder
from rlvr.kernels.weights import supports
from rlvr.noise import gumbel_noise, gumbel_noise_block


def top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Set logits outside the smallest nucleus with mass >= top_p to -inf. (B, V) -> (B, V)."""
    if top_p >= 1.0:
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    probs = sorted_logits.softmax(-1)
    # A token stays if the mass strictly before it is below top_p (the top token always stays).
    drop_sorted = probs.cumsum(-1) - probs >= top_p
    drop = drop_sorted.scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def top_k_filter(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """Set logits below the k-th largest of their row to -inf (ties with it stay); 0 = off. (B, V) -> (B, V)."""
    if top_k <= 0 or top_k >= logits.shape[-1]:
        return logits
    kth = logits.topk(top_k, dim=-1).values[:, -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def min_p_filter(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    """Set logits of tokens with probability < min_p x the row's largest to -inf; 0 = off. (B, V) -> (B, V)."""
    if min_p <= 0:
        return logits
    # p_v < min_p * p_max  <=>  logit_v < logit_max + log(min_p): no softmax needed
    threshold = logits.max(-1, keepdim=True).values + torch.log(torch.tensor(min_p, dtype=logits.dtype))
    return logits.masked_fill(logits < threshold, float("-inf"))


def repetition_penalized(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """`transformers`' RepetitionPenaltyLogitsProcessor and vLLM's repetition penalty: the logits of
    tokens in `seen` (B, V) bool are divided by `penalty` when positive and multiplied by it
    otherwise (so > 1 makes a seen token less likely whatever its sign); 1 = off. (B, V) -> (B, V)."""
    if penalty == 1.0:
        return logits
    penalized = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(seen, penalized, logits)


def seen_tokens(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """(B, V) bool: the tokens each prompt holds under its mask (padding counts as unseen, as in vLLM,
    which never sees the pads; `transformers` counts a left pad token as seen)."""
    counts = torch.zeros((prompt_ids.shape[0], vocab_size), device=prompt_ids.device)
    return counts.scatter_add_(1, prompt_ids, prompt_mask.to(counts.dtype)) > 0


def truncated(logits: torch.Tensor, *, top_p: float = 1.0, top_k: int = 0, min_p: float = 0.0) -> torch.Tensor:
    """The sampling truncations in `transformers`' order (after temperature): top-k, top-p, min-p."""
    return min_p_filter(top_p_filter(top_k_filter(logits, top_k), top_p), min_p)


def choose_tokens(logits: torch.Tensor, seeds: torch.Tensor, step: int, *,
                  temperature: float, top_p: float, noise: torch.Tensor | None = None, top_k: int = 0,
                  min_p: float = 0.0, repetition_penalty: float = 1.0,
                  seen: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row; returns (tokens (B,), behaviour log-probs (B,)).

    `noise` (B, V) float64, optional: this step's Gumbel noise if already computed
    (`gumbel_noise_block`); it must equal `gumbel_noise(seeds, step, V)`. `seen` (B, V) bool: the
    tokens the repetition penalty applies to (prompt and completion so far); needed when it is on.
    Greedy (temperature 0) is the model's own argmax: like the truncations, the penalty shapes
    sampling only, so evaluation scores the policy itself."""
    if temperature <= 0:  # greedy
        logp = logits.float().log_softmax(-1)
        tokens = logits.argmax(-1)
        return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)
    raw = logits.float()
    # transformers' order: the penalty on the raw logits, then temperature (the two scalings commute
    # up to rounding; this order matches its samples bit for bit)
    sampled = repetition_penalized(raw, seen, repetition_penalty)
    scaled = raw
    if temperature != 1.0:  # x / 1 is x exactly: skip the op
        scaled, sampled = raw / temperature, sampled / temperature
    logp = scaled.log_softmax(-1)
    if noise is None:
        noise = gumbel_noise(seeds, step, scaled.shape[-1])
    if noise.device != scaled.device:  # the noise is hashed from the seeds on the host
        noise = noise.to(scaled.device)
    noisy = truncated(sampled, top_p=top_p, top_k=top_k, min_p=min_p).double() + noise
    tokens = noisy.argmax(-1)
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)


@torch.no_grad()
def generate(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, seeds: torch.Tensor, *,
             max_new_tokens: int, eos_id: int, pad_id: int,
             temperature: float = 1.0, top_p: float = 1.0, fast: bool = True, engine: str = "eager",
             top_k: int = 0, min_p: float = 0.0, repetition_penalty: float = 1.0,
             swaps: Swaps | None = None) -> Rollouts:
    """Sample one completion per row. prompt_ids/prompt_mask (B, Tp), seeds (B,) int.

    Llama-family models take the fast path (`rlvr.kernels.decoder`: one prefill per distinct
    prompt, static KV cache, finished rows dropped); anything else, or `fast=False`, runs the
    plain `transformers` forward with its dynamic cache. Both give the same samples (tests/perf).
    `engine` picks how the fast path runs a decode step (`kernels.decoder.ENGINES`: `eager`, or
    `cpp` the fused C++ engine, which pays a one-off build per machine, cached on disk); both give
    the same samples. `repetition_penalty` counts the prompt's tokens (under its mask) and the
    completion's so far, as `transformers` and vLLM do.

    `swaps` (partial rollouts): every `swaps.every` tokens the sampler asks `swaps.poll()` for the
    policy version now in `model` (which may have put newer weights there); after a change it
    recomputes the rows' cache under the new weights from their prompts and tokens so far and goes
    on with the same noise, so each token is sampled by one version and its log-prob is that
    version's on the whole prefix. `Rollouts.versions` then tells which version sampled each token.
    """
    was_training = model.training
    model.eval()
    try:
        if fast and prompt_ids.shape[0] and supports(model):
            return _generate_fast(model, prompt_ids, prompt_mask, seeds, max_new_tokens=max_new_tokens,
                                  eos_id=eos_id, pad_id=pad_id, temperature=temperature, top_p=top_p,
                                  engine=engine, top_k=top_k, min_p=min_p,
                                  repetition_penalty=repetition_penalty, swaps=swaps)
        if swaps is not None:
            raise ValueError(f"partial rollouts swap weights in the KV-cache fast path, which "
                             f"{type(model).__name__} does not take; unset trainer.partial_rollouts")
        device = model.get_input_embeddings().weight.device
        if prompt_ids.device != device:  # prompts come from the host; rollouts go back to it
            host = prompt_ids.device
            out = _generate_hf(model, prompt_ids.to(device), prompt_mask.to(device), seeds,
                               max_new_tokens=max_new_tokens, eos_id=eos_id, pad_id=pad_id,
                               temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p,
                               repetition_penalty=repetition_penalty)
            return Rollouts(*(x.to(host) for x in (out.prompt_ids, out.prompt_mask, out.completion_ids,
                                                   out.completion_mask, out.logprobs, out.truncated)))
        return _generate_hf(model, prompt_ids, prompt_mask, seeds, max_new_tokens=max_new_tokens,
                            eos_id=eos_id, pad_id=pad_id, temperature=temperature, top_p=top_p, top_k=top_k,
                            min_p=min_p, repetition_penalty=repetition_penalty)
    finally:
        model.train(was_training)


class Swaps:
    """Partial rollouts' weight swaps between chunks of `every` tokens: `poll()` returns the policy
    version in the model from now on (having put newer weights there, or not); `trail` records the
    version of each decoding step of the current call."""

    def __init__(self, poll: Callable[[], int], every: int):
        self.poll, self.every = poll, every
        self.trail: list[int] = []


def _rollouts(prompt_ids, prompt_mask, tokens, logprobs, length, done, trail: list[int] | None = None) -> Rollouts:
    width = int(length.max()) if len(length) else 0
    steps = torch.arange(width, device=length.device)
    mask = (steps[None, :] < length[:, None]).float()
    versions = None
    if trail is not None:  # the version of each decoding step, -1 on padding
        per_step = torch.tensor((trail + trail[-1:] * width)[:width] if trail else [-1] * width, dtype=torch.long)
        versions = per_step[None, :].expand(len(length), width).masked_fill(mask == 0, -1).clone()
    return Rollouts(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        completion_ids=tokens[:, :width],
        completion_mask=mask,
        logprobs=logprobs[:, :width],
        truncated=~done,
        versions=versions,
    )


NOISE_BLOCK = 8
"""Decoding steps of Gumbel noise computed at once (fewer, larger integer-hash ops)."""

COMPACT_FRACTION = 0.25
"""Drop finished rows from the decode batch once they are this share of it (copying the cache
costs about one decode step, so compacting after every finished row would not pay)."""


def _generate_fast(model, prompt_ids, prompt_mask, seeds, *, max_new_tokens, eos_id, pad_id,
                   temperature, top_p, engine="eager", top_k=0, min_p=0.0, repetition_penalty=1.0,
                   swaps: Swaps | None = None) -> Rollouts:
    batch = prompt_ids.shape[0]
    if swaps is not None:
        swaps.trail = [swaps.poll()]
    decoder = Decoder(model, prompt_ids, prompt_mask, max_new_tokens, engine=engine)
    held = [decoder]  # the live decoder: a weight swap replaces it

    def recomputed(rows: torch.Tensor, so_far: torch.Tensor) -> Decoder:
        """A decoder of the slots `rows` whose cache holds their prompts and `so_far` (slots, t)
        under the model's current weights."""
        held[0].close()
        ones = torch.ones_like(so_far)
        held[0] = Decoder(model, torch.cat([prompt_ids[rows], so_far], 1), torch.cat([prompt_mask[rows], ones], 1),
                          max_new_tokens - so_far.shape[1], engine=engine)
        return held[0]

    try:
        plain = top_p >= 1.0 and top_k <= 0 and min_p <= 0 and repetition_penalty == 1.0
        if decoder.engine == "cpp" and plain and swaps is None:
            # The whole loop in C++ (no Python per token, the GIL released throughout).
            tokens, logprobs, done = decoder.sample_all(seeds, max_new_tokens, temperature=temperature,
                                                        eos_id=eos_id, pad_id=pad_id)
        else:
            tokens = torch.full((batch, max_new_tokens), pad_id, dtype=torch.long)
            logprobs = torch.zeros((batch, max_new_tokens))
            done = torch.zeros(batch, dtype=torch.bool)
            seen = (seen_tokens(prompt_ids, prompt_mask, decoder.logits.shape[-1])
                    if repetition_penalty != 1.0 and temperature > 0 else None)
            _decode(decoder, decoder.logits, seeds, tokens, logprobs, done, max_new_tokens=max_new_tokens,
                    eos_id=eos_id, pad_id=pad_id, temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p,
                    repetition_penalty=repetition_penalty, seen=seen,
                    swap=None if swaps is None else (swaps, recomputed))
    finally:
        held[0].close()
    return _rollouts(prompt_ids, prompt_mask, tokens, logprobs, _lengths(tokens, done, eos_id, max_new_tokens), done,
                     None if swaps is None else swaps.trail)


def _decode(decoder, logits, seeds, tokens, logprobs, done, *, max_new_tokens, eos_id, pad_id,
            temperature, top_p, top_k=0, min_p=0.0, repetition_penalty=1.0, seen=None, swap=None) -> None:
    """The sampling loop over decode slots; fills tokens/logprobs/done (B, ...) in place.

    Per step the slots' tokens and log-probs go into slot-ordered buffers (one column write each);
    they are written back to their original rows only when finished slots are dropped and at the
    end, and lengths are derived once at the end (first EOS + 1, or every step), rather than a
    handful of row-indexed updates per token. `seen` (B, V) bool, with the repetition penalty on:
    the prompts' tokens, updated in place with each slot's sampled token. `swap`: (Swaps, a maker of
    a decoder recomputed from the slots' rows and tokens so far) for partial rollouts."""
    batch = tokens.shape[0]
    rows = torch.arange(batch)                 # original row of each decode slot
    slot_seeds = seeds
    slot_done = torch.zeros(batch, dtype=torch.bool)
    slot_tokens = torch.full((batch, max_new_tokens), pad_id, dtype=torch.long)
    slot_logprobs = torch.zeros((batch, max_new_tokens))
    block = None
    for step in range(max_new_tokens):
        if temperature > 0 and step % NOISE_BLOCK == 0:
            block = gumbel_noise_block(slot_seeds, step, min(NOISE_BLOCK, max_new_tokens - step), logits.shape[-1])
        noise = block[:, step % NOISE_BLOCK] if temperature > 0 else None
        tok, logp = choose_tokens(logits, slot_seeds, step, temperature=temperature, top_p=top_p, noise=noise,
                                  top_k=top_k, min_p=min_p, repetition_penalty=repetition_penalty, seen=seen)
        tok = tok.masked_fill_(slot_done, pad_id)
        if seen is not None:  # a finished slot's pad marks nothing it will be scored on
            seen[torch.arange(len(tok)), tok] |= ~slot_done
        slot_tokens[:, step] = tok
        slot_logprobs[:, step] = logp.masked_fill_(slot_done, 0.0)
        slot_done |= tok == eos_id
        if step == max_new_tokens - 1:
            break
        finished = int(slot_done.sum())
        if finished == len(rows):
            break
        if finished >= COMPACT_FRACTION * len(rows):
            live = (~slot_done).nonzero().squeeze(-1)
            tokens[rows], logprobs[rows], done[rows] = slot_tokens, slot_logprobs, slot_done
            decoder.keep(live)
            rows, slot_seeds, tok = rows[live], slot_seeds[live], tok[live]
            slot_tokens, slot_logprobs = slot_tokens[live], slot_logprobs[live]
            block = block[live] if block is not None else None
            seen = seen[live] if seen is not None else None
            slot_done = slot_done[live]
        if swap is None:
            logits = decoder.step(tok)
        else:
            decoder, logits = _swapped(swap, step, rows, slot_tokens, decoder, tok)
    tokens[rows], logprobs[rows], done[rows] = slot_tokens, slot_logprobs, slot_done


def _swapped(swap, step: int, rows: torch.Tensor, slot_tokens: torch.Tensor, decoder,
             tok: torch.Tensor) -> tuple[Decoder, torch.Tensor]:
    """The next step's logits under partial rollouts: at a chunk boundary the version in force is
    polled, and after a change the slots' cache is recomputed under the new weights (their prompts
    and tokens so far) rather than stepped on with the old weights' cache; the version is recorded."""
    swaps, recomputed = swap
    version = swaps.trail[-1]
    if (step + 1) % swaps.every == 0:
        version = swaps.poll()
    swaps.trail.append(version)
    if version == swaps.trail[-2]:
        return decoder, decoder.step(tok)
    decoder = recomputed(rows, slot_tokens[:, :step + 1])
    return decoder, decoder.logits


def _lengths(tokens, done, eos_id: int, max_new_tokens: int) -> torch.Tensor:
    """A row that finished emitted EOS at its first EOS position and pad after it; a row that did not
    ran every step (the loop ends early only when all rows have finished)."""
    if not max_new_tokens:
        return torch.zeros(len(tokens), dtype=torch.long)
    first_eos = (tokens == eos_id).int().argmax(-1)
    return torch.where(done, first_eos + 1, max_new_tokens)


def _generate_hf(model, prompt_ids, prompt_mask, seeds, *, max_new_tokens, eos_id, pad_id,
                 temperature, top_p, top_k=0, min_p=0.0, repetition_penalty=1.0) -> Rollouts:
    """The reference sampler: `transformers` forward with its own cache, full batch every step."""
    batch = prompt_ids.shape[0]
    attention = prompt_mask.clone()
    positions = (prompt_mask.cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=prompt_ids, attention_mask=attention, position_ids=positions, use_cache=True)
    cache, last_logits = out.past_key_values, out.logits[:, -1]
    next_pos = positions[:, -1:] + 1

    device = prompt_ids.device
    tokens = torch.full((batch, max_new_tokens), pad_id, dtype=torch.long, device=device)
    logprobs = torch.zeros((batch, max_new_tokens), device=device)
    done = torch.zeros(batch, dtype=torch.bool, device=device)
    length = torch.zeros(batch, dtype=torch.long, device=device)
    seen = (seen_tokens(prompt_ids, prompt_mask, last_logits.shape[-1])
            if repetition_penalty != 1.0 and temperature > 0 else None)
    for step in range(max_new_tokens):
        tok, logp = choose_tokens(last_logits, seeds, step, temperature=temperature, top_p=top_p, top_k=top_k,
                                  min_p=min_p, repetition_penalty=repetition_penalty, seen=seen)
        tok = tok.masked_fill(done, pad_id)
        if seen is not None:
            seen[torch.arange(batch, device=device), tok] |= ~done
        tokens[:, step] = tok
        logprobs[:, step] = logp.masked_fill(done, 0.0)
        length += (~done).long()
        done |= tok == eos_id
        if bool(done.all()) or step == max_new_tokens - 1:
            break
        attention = torch.cat([attention, torch.ones((batch, 1), dtype=attention.dtype, device=device)], dim=-1)
        out = model(input_ids=tok[:, None], attention_mask=attention, position_ids=next_pos,
                    past_key_values=cache, use_cache=True)
        cache, last_logits = out.past_key_values, out.logits[:, -1]
        next_pos = next_pos + 1
    return _rollouts(prompt_ids, prompt_mask, tokens, logprobs, length, done)
