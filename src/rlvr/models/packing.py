"""Padding-free training forwards for any `transformers` causal LM: the rows of a micro-batch
packed into one sequence, each distinct prompt computed once for its group (`shared`) or once per
row (`packed`), and only the positions that predict a completion token sent to the LM head.

How it works (measured in transformers 5.19 on CPU, fp32: ≤ 1e-6 from the padded forward):
1. `pack_layout` strips the prompts' left padding and the completions' right padding and lays the
   tokens out as [prompt 0 | prompt 1 | … | completion 0 | completion 1 | …]; positions restart
   at 0 in every prompt and a completion continues from its own prompt's length.
2. `use_packed_attention` replaces transformers' registered function for the model's attention
   implementation (sdpa, flash) by a wrapper of it (`AttentionInterface`) that, when a forward
   carries a `pack` layout, runs SDPA on two grids: the prompts causally, and each completion
   against [its prompt, itself causally]. Without a layout (the sampler, the padded path, any other
   model) the wrapper calls the original unchanged, and the model keeps its implementation's name.
   A 4-D stand-in mask is passed so transformers builds no (N, N) packed-sequence mask.
3. The decoder body returns hidden states; the rows predicting completion tokens are gathered and
   the head runs on them in row chunks (`chunked_head_logprobs`), so no (tokens × vocabulary)
   tensor exists beyond a chunk.

A model this cannot serve exactly (attention that ignores `position_ids` or adds ALiBi, attention
logit soft-capping or sinks, a custom head) is found by `probe` when the policy is built: it falls
back to the padded forward with one notice line. Deviations from verl/TRL's packing: SDPA over
re-padded grids, not flash-attention varlen (CUDA's flash kernels are not used by this path yet).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from rlvr.kernels.weights import unique_prompts


@dataclass(frozen=True)
class PackLayout:
    """Where each token of a packed forward lives. U prompts, R completion rows fed to the model.

    prompt_lens (U,): real tokens of each prompt; owner (R,): the prompt of each fed completion
    row; fed_lens (R,) ≥ 1: completion tokens fed. Packed order: the U prompts, then the R rows."""

    prompt_lens: torch.Tensor
    owner: torch.Tensor
    fed_lens: torch.Tensor
    # what every layer's attention recomputes otherwise: cells and masks, per sliding window
    _plans: dict = field(default_factory=dict, compare=False, repr=False)

    def cells(self, lens: torch.Tensor):
        """(row, column) of each packed token of the part whose row lengths are `lens`."""
        row = torch.repeat_interleave(torch.arange(len(lens), device=lens.device), lens)
        start = torch.cumsum(lens, 0) - lens
        return row, torch.arange(len(row), device=lens.device) - start[row]


def pack_layout(prompt_ids, prompt_mask, completion_ids, lengths, *, share: bool):
    """Packed inputs of a (B,) batch: (ids (1, N), positions (1, N), layout, pick (M,), index (M,)).

    `lengths` (B,): completion tokens scored per row (a row of length n feeds n-1 tokens).
    `share`: rows with identical prompts share one copy (a group's prompt computed once).
    hidden[pick[i]] predicts completion token index[i] (flat into (B, Tc))."""
    b, tc = completion_ids.shape
    device = completion_ids.device
    if share:
        ids_u, mask_u, owner_of_row = unique_prompts(prompt_ids, prompt_mask)
    else:
        ids_u, mask_u, owner_of_row = prompt_ids, prompt_mask, torch.arange(b, device=device)
    prompt_lens = mask_u.sum(-1).long()
    if bool((prompt_lens == 0).any()):
        raise ValueError("a row has an empty prompt; the packed forward needs at least one prompt token per row")
    lengths = lengths.long().clamp(0, tc)
    fed = (lengths - 1).clamp(min=0)
    fed_rows = (fed > 0).nonzero().squeeze(-1)
    layout = PackLayout(prompt_lens, owner_of_row[fed_rows], fed[fed_rows])
    p_row, p_col = layout.cells(prompt_lens)
    c_row, c_col = layout.cells(layout.fed_lens)
    prompt_tokens = ids_u[mask_u.bool()]                                    # row-major: the real tokens
    ids = torch.cat([prompt_tokens, completion_ids[fed_rows[c_row], c_col]])
    positions = torch.cat([p_col, prompt_lens[layout.owner[c_row]] + c_col])
    # completion token 0 is predicted by its prompt's last token, token t by the row's own token t-1
    scored = (lengths > 0).nonzero().squeeze(-1)
    prompt_end = torch.cumsum(prompt_lens, 0) - 1
    n_prompt = int(prompt_lens.sum())
    pick = torch.cat([prompt_end[owner_of_row[scored]], n_prompt + torch.arange(len(c_row), device=device)])
    index = torch.cat([scored * tc, fed_rows[c_row] * tc + c_col + 1])
    return ids[None], positions[None], layout, pick, index


def _grid(x: torch.Tensor, row, col, rows: int, width: int) -> torch.Tensor:
    """Packed (heads, N, d) -> (rows, heads, width, d), zero where no token lands."""
    g = x.new_zeros(rows, x.shape[0], width, x.shape[2])
    g[row, :, col] = x.transpose(0, 1)
    return g


def _window(allowed: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor, window: int | None) -> torch.Tensor:
    """`allowed` restricted to keys fewer than `window` positions back (transformers' sliding window)."""
    if window is None:
        return allowed
    return allowed & ((q_pos[..., :, None] - k_pos[..., None, :]) < window)


def _attention_plan(layout: PackLayout, window: int | None, device):
    """The cells and masks of `layout_attention` for one sliding window (None = causal), built once
    per forward: (prompt cells, completion cells, prompt mask (Tp, Tp), completion mask (R, 1, Tc, Tp + Tc))."""
    if window in layout._plans:
        return layout._plans[window]
    tp = int(layout.prompt_lens.max())
    p_cells = layout.cells(layout.prompt_lens)
    cols_p = torch.arange(tp, device=device)
    causal_p = _window(cols_p[None, :] <= cols_p[:, None], cols_p, cols_p, window)
    c_cells, mask = None, None
    r = len(layout.fed_lens)
    if r:
        tc = int(layout.fed_lens.max())
        c_cells = layout.cells(layout.fed_lens)
        p_len = layout.prompt_lens[layout.owner]                                # (R,)
        cols_c = torch.arange(tc, device=device)
        q_pos = p_len[:, None] + cols_c[None, :]                                # (R, Tc) positions
        see_p = _window((cols_p[None, None, :] < p_len[:, None, None]).expand(r, tc, tp), q_pos, cols_p, window)
        see_c = _window((cols_c[None, :] <= cols_c[:, None]).expand(r, tc, tc), cols_c, cols_c, window)
        mask = torch.cat([see_p, see_c], dim=-1)[:, None]                       # (R, 1, Tc, Tp + Tc)
    layout._plans[window] = plan = (p_cells, c_cells, causal_p, mask)
    return plan


def layout_attention(query, key, value, layout: PackLayout, *, scaling=None, dropout: float = 0.0,
                     sliding_window: int | None = None) -> torch.Tensor:
    """Attention of a packed forward: (1, h, N, d) q and (1, kv, N, d) k/v -> (1, N, h, d).
    Prompts attend causally to themselves; a completion row to its whole prompt and causally to
    its own earlier tokens (`sliding_window`, when set, counts positions as transformers does)."""
    (p_row, p_col), c_cells, causal_p, mask = _attention_plan(layout, sliding_window, query.device)
    n_p = int(layout.prompt_lens.sum())
    q_p, q_c = query[0].split([n_p, query.shape[2] - n_p], dim=1)
    k_p, k_c = key[0].split([n_p, key.shape[2] - n_p], dim=1)
    v_p, v_c = value[0].split([n_p, value.shape[2] - n_p], dim=1)
    u, tp = len(layout.prompt_lens), causal_p.shape[0]
    kp, vp = _grid(k_p, p_row, p_col, u, tp), _grid(v_p, p_row, p_col, u, tp)   # (U, kv, Tp, d)
    out_p = F.scaled_dot_product_attention(_grid(q_p, p_row, p_col, u, tp), kp, vp, attn_mask=causal_p,
                                           dropout_p=dropout, scale=scaling, enable_gqa=True)
    outs = [out_p[p_row, :, p_col]]                                             # (n_p, h, d)
    if c_cells is not None:
        (c_row, c_col), (r, tc) = c_cells, (mask.shape[0], mask.shape[2])
        keys = torch.cat([kp[layout.owner], _grid(k_c, c_row, c_col, r, tc)], dim=2)
        values = torch.cat([vp[layout.owner], _grid(v_c, c_row, c_col, r, tc)], dim=2)
        out_c = F.scaled_dot_product_attention(_grid(q_c, c_row, c_col, r, tc), keys, values, attn_mask=mask,
                                               dropout_p=dropout, scale=scaling, enable_gqa=True)
        outs.append(out_c[c_row, :, c_col])
    return torch.cat(outs)[None]


WRAPPABLE = ("sdpa", "flash_attention_2", "flash_attention_3", "flash_attention_4")
"""Attention implementations the packing wrapper can stand in for (registered under the same
name: the model keeps its implementation's name, so a pickled or exported model carries nothing
of rlvr's). Eager attention is each model's own function, which no registry serves: not packed."""


def _wrapper(original):
    """An attention function that serves packed forwards and calls `original` for everything else."""

    def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, pack=None, **kwargs):
        if pack is None:
            return original(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
        unsupported = [k for k in ("softcap", "s_aux", "sinks", "position_bias") if kwargs.get(k) is not None]
        if unsupported or not getattr(module, "is_causal", True):
            raise NotImplementedError(f"packed attention does not support {unsupported or 'bidirectional layers'}")
        window = kwargs.get("sliding_window")
        return layout_attention(query, key, value, pack, scaling=scaling, dropout=dropout,
                                sliding_window=window if window else None), None

    attention.packs = True
    return attention


def use_packed_attention(model) -> None:
    """Make `model`'s attention implementation serve packed forwards: transformers' registered
    function for its name is replaced, once per process, by `_wrapper` of it. Without a `pack`
    layout the wrapper calls the original with the same arguments: every other forward (the
    sampler, the padded path, any other model) computes exactly what it did. ValueError for an
    implementation outside `WRAPPABLE`."""
    from transformers import AttentionInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    name = model.config._attn_implementation
    if name not in WRAPPABLE:
        raise ValueError(f"{name} attention (the packed forward wraps {', '.join(WRAPPABLE)})")
    current = ALL_ATTENTION_FUNCTIONS[name]
    if not getattr(current, "packs", False):
        AttentionInterface.register(name, _wrapper(current))


def causal_lm_of(model):
    """The transformers causal LM under a peft wrapper (LoRA layers are injected in place)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def head_function(lm):
    """hidden (M, H) -> logits (M, V) as the model's forward computes them after its body."""
    head = lm.get_output_embeddings()
    config = lm.config
    softcap = getattr(config, "final_logit_softcapping", None)
    scale = getattr(lm, "logit_scale", None)  # Cohere
    divisor = getattr(config, "logits_scaling", None)  # Granite

    def logits(hidden):
        out = head(hidden)
        if isinstance(scale, (int, float)):
            out = out * scale
        if divisor:
            out = out / divisor
        if softcap:
            out = torch.tanh(out / softcap) * softcap
        return out

    return logits


def body_of(lm):
    """The decoder body of a transformers causal LM (its hidden states, before the head)."""
    return getattr(lm, lm.base_model_prefix)


def packed_hidden(body, prompt_ids, prompt_mask, completion_ids, lengths, *, share: bool):
    """(hidden (M, H), index (M,)): the final hidden states predicting each scored completion token
    (flat index into (B, Tc)), from one padding-free forward of the decoder `body`."""
    ids, positions, layout, pick, index = pack_layout(prompt_ids, prompt_mask, completion_ids, lengths, share=share)
    stand_in = torch.zeros(1, 1, 1, 1, dtype=torch.bool, device=ids.device)  # masks are the layout's
    hidden = body(input_ids=ids, attention_mask=stand_in, position_ids=positions, use_cache=False,
                  pack=layout).last_hidden_state
    return hidden[0, pick], index


PROBE_TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-8}
"""Largest |packed − padded| / max|padded| of the probe's logits in that dtype (others: 5e-2)."""


def probe(model, *, share: bool) -> str | None:
    """None when `model`'s packed forward matches its padded forward on a small random batch (two
    prompts of different lengths, one shared by two rows, completions of different lengths) and
    no row's logits move when another row's tokens change; else why not, in a few words."""
    lm = causal_lm_of(model)
    weight = lm.get_input_embeddings().weight
    gen = torch.Generator().manual_seed(0)
    vocab = min(int(weight.shape[0]), 1000)
    prompt_ids = torch.randint(vocab, (3, 5), generator=gen)
    prompt_ids[1] = prompt_ids[0]
    prompt_mask = torch.tensor([[0, 0, 1, 1, 1], [0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    completion_ids = torch.randint(vocab, (3, 6), generator=gen)
    lengths = torch.tensor([4, 2, 6])
    moved = completion_ids.clone()
    moved[2] = torch.randint(vocab, (6,), generator=gen)
    modes = [(m, m.training) for m in model.modules()]
    model.eval()  # no dropout: the probe compares deterministic forwards and draws no random masks
    try:
        with torch.no_grad():
            head = head_function(lm)
            args = [x.to(weight.device) for x in (prompt_ids, prompt_mask, completion_ids, lengths)]
            hidden, index = packed_hidden(body_of(lm), *args, share=share)
            again, _ = packed_hidden(body_of(lm), args[0], args[1], moved.to(weight.device), args[3], share=share)
            ours, theirs = head(hidden).float(), _padded_logits(model, *args[:3]).flatten(0, 1)[index]
    except Exception as err:  # any failure inside the model's code means "not this path"
        return f"{type(err).__name__}: {str(err).splitlines()[0][:120] if str(err) else ''}".rstrip(": ")
    finally:
        for m, mode in modes:
            m.training = mode
    tolerance = PROBE_TOLERANCE.get(weight.dtype, 5e-2)
    error = float((ours - theirs).abs().max() / theirs.abs().max().clamp(min=1e-30))
    if not error <= tolerance:
        return f"packed logits differ from the padded forward's by {error:.1e} (relative)"
    untouched = index // completion_ids.shape[1] != 2
    if not torch.equal(hidden[untouched], again[untouched]):
        return "a row's outputs change when another packed row's tokens do (attention leaks across rows)"
    return None


def _padded_logits(model, prompt_ids, prompt_mask, completion_ids):
    """(B, Tc, V) logits predicting each completion token, from the plain padded forward."""
    ids = torch.cat([prompt_ids, completion_ids], dim=-1)
    attention = torch.cat([prompt_mask, torch.ones_like(completion_ids)], dim=-1)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=attention, position_ids=positions, use_cache=False).logits
    return logits[:, prompt_ids.shape[1] - 1:-1].float()


def prepare(model, mode: str) -> str | None:
    """Set `model` up for `mode` (`packed` or `shared`) and probe it: None when it packs exactly,
    else the reason (the caller keeps the padded forward and says so in one line)."""
    lm = causal_lm_of(model)
    if not hasattr(lm, "base_model_prefix") or not hasattr(lm.config, "_attn_implementation"):
        return "not a transformers model"
    try:
        use_packed_attention(lm)
    except Exception as err:  # an implementation the wrapper cannot stand in for (eager, remote code)
        return f"{type(err).__name__}: {err}"
    reason = probe(model, share=mode == "shared")
    return reason
