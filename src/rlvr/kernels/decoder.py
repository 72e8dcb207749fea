"""The KV-cache decoder of Llama-family models (the fast path of `engines.torch_ar.generate`).

Each distinct prompt is prefilled once and its keys/values indexed into every row of its group.
Keys/values go into a preallocated (b, kv_heads, S, d) cache instead of a new concatenated
cache every token, and finished rows are dropped from the batch (`Decoder.keep`) once enough of
them have finished to pay for the copy. In a decode step RoPE is applied in place, so k|v are one
block written into the cache with one copy; attention is two batched matmuls on the cache.

`Decoder(engine="cpp")` runs the prefill, each decode step and (with top_p = 1) the whole
sampling loop as single calls into the C++ engine (`csrc/decode.cpp`: the same math without the
per-op framework overhead, ≈ 1.5–1.9× the eager sampler at batch 64), eager after one stderr line
when it cannot be built. That engine is a bound (pybind) class, not `torch.library` ops like the
training kernels: it keeps state across calls (weights transposed once, workspaces, RoPE tables)
that a stateless op would have to take as arguments or rebuild per step, it has no autograd and
is never traced, and each method releases the GIL for its whole call.
"""

from __future__ import annotations

import contextlib
import threading

import torch

from rlvr.kernels import native
from rlvr.kernels.weights import LlamaWeights, prompt_masks, unique_prompts

SPAN_MULTIPLE = 16

_LOCAL = threading.local()


def _cache_buffers(shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """Two (layers, 2, b, kv, S, d) buffers, reused across calls in this thread (not zeroed).

    A fresh multi-megabyte tensor is a fresh mmap, and first-touch page faults cost more than a
    whole decode step at this scale; keeping the memory warm avoids them. Two buffers so that
    `Decoder.keep` can gather the surviving rows from one into the other.
    """
    numel = 1
    for n in shape:
        numel *= n
    pool = getattr(_LOCAL, "pool", None)
    if getattr(_LOCAL, "busy", False):  # a decoder in this thread still holds the pool
        pool = (torch.empty(numel), torch.empty(numel))
    elif pool is None or pool[0].numel() < numel:
        pool = _LOCAL.pool = (torch.empty(numel), torch.empty(numel))
        _LOCAL.busy = True
    else:
        _LOCAL.busy = True
    return pool[0][:numel].view(shape), pool[1][:numel].view(shape)


ENGINES = ("eager", "cpp")
"""Decode-step engines: the eager ATen ops of `Decoder.step`, or the fused C++ engine of
`csrc/decode.cpp` (built on first use; falls back to eager if it cannot be built)."""


class Decoder:
    """Prefill once per distinct prompt, then one token per live row per `step`, into a static
    KV cache of width Tp + max_new_tokens. Rows are slots; `keep` drops finished slots.

    `engine` picks how a step runs (`ENGINES`); both give the same samples, with log-probs equal
    to float rounding (tests/perf); `cpp` needs a C++ compiler once per machine (the build is
    cached)."""

    def __init__(self, model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, max_new_tokens: int, *,
                 engine: str = "eager"):
        if engine not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
        self._cpp = native.load_for(model) if engine == "cpp" else None
        self.engine = "eager" if self._cpp is None else engine
        shared = _SHARED.get(id(model))
        w = self.w = LlamaWeights(model) if shared is None else shared.weights(model)
        ids_u, mask_u, row = unique_prompts(prompt_ids, prompt_mask)
        b, tp = prompt_ids.shape
        shape = (len(w.layers), 2, b, w.kv_heads, tp + max_new_tokens, w.head_dim)
        self.cache, self.spare = _cache_buffers(shape)
        # The padded span in `step` reads columns not written yet (with weight 0, so they must be
        # finite, and the pool holds stale data): `step` zeroes each new span block as it comes into
        # view, over the rows still live then. The prompt columns are all written below. (The C++
        # step needs neither.)
        self.zeroed = tp                                 # columns [0, zeroed) are finite
        self.rot_table = w.rope(torch.arange(tp + max_new_tokens + 1))     # (S+1, 1, d/2)
        if self.engine == "cpp":  # prefill in C++ too: it writes the cache in the layout its step reads
            self._fused = _cpp_engine(self._cpp, w, self.rot_table, b, shared)
            self.logits = self._fused.prefill(ids_u.contiguous(), mask_u.long().contiguous(), row.contiguous(),
                                              self.cache)
        else:
            self.logits = self._prefill(ids_u, mask_u, row)   # (b, V) next-token logits
        # Additive mask over cache columns, per kv head so it views as (b·kv, 1, S): -inf on the
        # prompt's left padding and on columns not yet written (`step` opens one per token).
        self.key_bias = torch.full((b, w.kv_heads, 1, tp + max_new_tokens), float("-inf"))
        self.key_bias[:, :, 0, :tp].masked_fill_(mask_u.bool()[row][:, None, :], 0.0)
        self.width = tp
        self.pos = mask_u.sum(-1)[row]                   # (b,) position of the next token

    def _prefill(self, ids_u, mask_u, row) -> torch.Tensor:
        """Eager prefill of the distinct prompts into the cache rows; returns each row's logits."""
        w, tp = self.w, ids_u.shape[1]
        rot = w.rope((mask_u.cumsum(-1) - 1).clamp(min=0))
        attn_mask = prompt_masks(mask_u)
        x = w.lookup(ids_u)
        for i, layer in enumerate(w.layers):
            x, k, v = w.prompt_layer(layer, x, rot, attn_mask)
            # One gather of the distinct prompts' k|v into the rows, from a contiguous copy (gathering
            # from the transposed view directly is several times slower).
            kv_u = torch.stack([k, v])                                     # (2, U, kv, Tp, d)
            self.cache[i, :, :, :, :tp] = kv_u.index_select(1, row)
        return w.logits(x[:, -1])[row]

    def close(self) -> None:
        """Hand the cache buffers back to this thread's pool (the decoder is unusable after)."""
        if getattr(_LOCAL, "pool", None) is not None and self.cache is not None:
            pooled = {_LOCAL.pool[0].data_ptr(), _LOCAL.pool[1].data_ptr()}
            if self.cache.data_ptr() in pooled or self.spare.data_ptr() in pooled:
                _LOCAL.busy = False
        self.cache = self.spare = None

    def keep(self, slots: torch.Tensor) -> None:
        """Keep only `slots` (indices into the current rows), copying their cache rows (one gather)."""
        n = len(slots)
        layers, two, _, kv, width, d = self.cache.shape
        spare = self.spare.flatten()[:layers * two * n * kv * width * d].view(layers, two, n, kv, width, d)
        torch.index_select(self.cache, 2, slots, out=spare)
        self.cache, self.spare = spare, self.cache
        self.key_bias = self.key_bias[slots]
        self.pos = self.pos[slots]

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed one token per row (b,); returns next-token logits (b, V)."""
        if self.engine == "cpp":
            return self._cpp_step(tokens)
        w, col = self.w, self.width
        b = tokens.shape[0]
        h, kv, d = w.heads, w.kv_heads, w.head_dim
        x = w.lookup(tokens)                             # (b, H)
        rot = self.rot_table[self.pos]                   # (b, 1, d/2)
        # Attend over a span rounded up to a multiple of 16 columns: masked columns cost little, and
        # CPU softmax/bmm kernels are several times slower on rows shorter than a vector register.
        span = min(self.key_bias.shape[-1], -(-(col + 1) // SPAN_MULTIPLE) * SPAN_MULTIPLE)
        if span > self.zeroed:
            self.cache[..., self.zeroed:span, :].zero_()
            self.zeroed = span
        self.key_bias[..., col] = 0.0
        bias = self.key_bias[..., :span].reshape(b * kv, 1, span)
        scale = d ** -0.5
        for layer, layer_cache in zip(w.layers, self.cache):             # (2, b, kv, S, d)
            fused = w.fused_qkv(layer, x)                # (b, h+2kv, d)
            w.rotate_(fused[:, :h + kv], rot)            # RoPE in place: k|v are now one contiguous block
            layer_cache[:, :, :, col] = fused[:, h:].unflatten(1, (2, kv)).transpose(0, 1)  # one write
            k_cache, v_cache = layer_cache
            # One query per row: explicit attention beats SDPA's kernel here, and grouping the
            # query heads by their kv head handles GQA without repeating the cache.
            q = fused[:, :h].reshape(b * kv, h // kv, d)
            keys = k_cache[:, :, :span].reshape(b * kv, span, d)
            scores = torch.baddbmm(bias, q, keys.transpose(1, 2), alpha=scale)     # (b·kv, h/kv, span)
            attn = torch.bmm(scores.softmax(-1), v_cache[:, :, :span].reshape(b * kv, span, d))
            x = w.finish(layer, x, attn.reshape(b, h * d))
        self.width += 1
        self.pos = self.pos + 1
        return w.logits(x)

    def sample_all(self, seeds: torch.Tensor, max_new_tokens: int, *, temperature: float, eos_id: int,
                   pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The cpp engine's whole sampling loop in one call (top_p = 1 only): the same tokens as
        `torch_ar._decode` over `step`, with finished rows leaving at once instead of in batches.
        Returns (tokens (b, n) long, log-probs (b, n), done (b,) bool); the decoder is spent after."""
        if self.engine != "cpp":
            raise ValueError("sample_all needs the cpp engine")
        return self._fused.generate(self.logits.contiguous(), seeds.long().contiguous(), self.pos.contiguous(),
                                    self.cache, self.key_bias, self.width, max_new_tokens, float(temperature),
                                    eos_id, pad_id)

    def _cpp_step(self, tokens: torch.Tensor) -> torch.Tensor:
        # The fused step gives columns whose bias is -inf probability 0 whatever they hold, so it needs
        # no zeroed cache span.
        col = self.width
        self.key_bias[..., col] = 0.0
        logits = self._fused.step(tokens.contiguous(), self.pos, self.cache, self.key_bias, col)
        self.width += 1
        self.pos = self.pos + 1
        return logits


def _cpp_engine(module, w: LlamaWeights, rot_table: torch.Tensor, rows: int, shared: _Shared | None = None):
    """The C++ step for these weights (which it copies, transposed), absent biases as empty
    tensors, RoPE as cos/sin tables (S+1, d/2), workspaces for up to `rows` rows. Inside a
    `shared_weights` block the weights are prepared once and each call forks that engine."""
    def plain(t):
        return torch.empty(0) if t is None else t.detach().contiguous()

    table = rot_table[:, 0]
    cos, sin = table.real.contiguous(), table.imag.contiguous()

    def build():
        flat = [plain(getattr(layer, f)) for layer in w.layers
                for f in ("ln1", "wqkv", "bqkv", "wo", "bo", "ln2", "wgu", "wd")]
        return module.Engine(plain(w.embed), plain(w.norm), plain(w.lm_head), plain(w.lm_bias), flat,
                             cos, sin, w.heads, w.kv_heads, w.eps, rows)

    if shared is None:
        return build()
    with shared.lock:
        if shared.engine is None:
            shared.engine = build()
    return shared.engine.fork(cos, sin, rows)


class _Shared:
    """One preparation of a model's weights for the Decoders of a `shared_weights` block."""

    def __init__(self):
        self.lock = threading.Lock()
        self.prepared: LlamaWeights | None = None
        self.engine = None  # the C++ engine built first; later Decoders fork it

    def weights(self, model) -> LlamaWeights:
        with self.lock:
            if self.prepared is None:
                self.prepared = LlamaWeights(model)
            return self.prepared


_SHARED: dict[int, _Shared] = {}


@contextlib.contextmanager
def shared_weights(model):
    """Within this block, Decoders of `model` (from any thread) share one `LlamaWeights` and one
    set of the C++ engine's transposed weights, made by the first of them; row-parallel workers
    sampling one batch then prepare the weights once instead of once each. The model's weights
    must not change inside the block."""
    _SHARED[id(model)] = _Shared()
    try:
        yield
    finally:
        _SHARED.pop(id(model), None)
