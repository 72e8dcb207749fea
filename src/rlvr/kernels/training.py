"""The packed training forward of Llama-family models: `completion_hidden`, the hidden states
that predict the completion tokens, with gradients to the model's parameters.

Each distinct prompt of a group is run once (its rows' gradients add up in the one copy), and the
completion tokens are packed: only positions that predict a scored token are computed (given
`lengths`, a row of length n feeds n-1 tokens); they are scattered into a (B, T) grid only for
attention. The backward pass copies little: attention is two explicit matmuls
(`LlamaWeights.attend_explicit`, ≈ 30% cheaper forward + backward than SDPA's CPU kernel at these
shapes); RoPE runs on the packed rows; q/k/v go straight into head-major grids (`_ToGrid`), keys
and values are built with the prompt rows in one buffer (`_KeysGrid`, whose backward sums each
prompt's rows with one matmul), and tensors are divided with `split`, never several slices (each
slice's backward is a full-size zero tensor plus a copy).

With `trainer.kernels=cpp` each layer is instead one C++ op each way (`ops.layer`, over prompt
and packed rows in one matrix). Same values as the `transformers` forward to float rounding
(tests/perf).
"""

from __future__ import annotations

import torch

from rlvr.kernels import native, ops
from rlvr.kernels.weights import LlamaWeights, additive, prompt_masks, unique_prompts


def kernels_for(model):
    """The C++ extension when `LlamaWeights(model, kernels=True)` may use its ops, else None
    (eager ops, after one stderr line)."""
    return native.load_for(model, what="training kernels")


class _ToGrid(torch.autograd.Function):
    """Packed rows (N, heads, d) -> head-major grid (B, heads, T, d), zero where no row lands: row n
    goes to cell (in_row[n], :, in_col[n]). The grid comes out contiguous in the layout attention's
    matmuls read, and the backward reads the gradient back at those cells in one gather (instead of a
    contiguous copy of the transposed gradient and an index_select). Pure copies: exact."""

    @staticmethod
    def forward(ctx, packed, in_row, in_col, rows: int, width: int):
        ctx.save_for_backward(in_row, in_col)
        grid = packed.new_zeros(rows, packed.shape[1], width, packed.shape[2])
        grid[in_row, :, in_col] = packed
        return grid

    @staticmethod
    def backward(ctx, grad):
        in_row, in_col = ctx.saved_tensors
        return grad[in_row, :, in_col], None, None, None, None


class _KeysGrid(torch.autograd.Function):
    """Keys (or values) for the completion queries, built in one buffer: the distinct prompts' rows
    fanned out to the B rows (prompt (U, kv, Tp, d), `rows` (B,)) in columns [0, Tp), and the packed
    completion rows (N, kv, d) at (in_row, :, Tp + in_col), zero elsewhere -> (B, kv, Tp + T, d).
    Replaces a row gather, a zero grid, a scatter and a concatenation (each a full copy). The
    backward sums each prompt's G row gradients with one matmul (one-hot (U, B) @ grad (B, ·)),
    several times faster than `index_add_`'s scatter at these shapes, and gathers the completion
    cells. Same values; gradients equal up to float summation order."""

    @staticmethod
    def forward(ctx, prompt, packed, rows, in_row, in_col, width: int):
        ctx.save_for_backward(rows, in_row, in_col)
        ctx.count, _, tp, _ = prompt.shape
        ctx.tp = tp
        kv, d = prompt.shape[1], prompt.shape[3]
        out = packed.new_empty(rows.shape[0], kv, tp + width, d)
        out[:, :, :tp] = prompt.index_select(0, rows)
        out[:, :, tp:] = 0.0
        out[in_row, :, tp + in_col] = packed
        return out

    @staticmethod
    def backward(ctx, grad):
        rows, in_row, in_col = ctx.saved_tensors
        b, kv, _, d = grad.shape
        tp = ctx.tp
        grad_prompt = grad_packed = None
        if ctx.needs_input_grad[0]:
            onehot = torch.zeros(ctx.count, b, dtype=grad.dtype)
            onehot[rows, torch.arange(b)] = 1.0
            grad_prompt = (onehot @ grad[:, :, :tp].reshape(b, -1)).view(ctx.count, kv, tp, d)
        if ctx.needs_input_grad[1]:
            grad_packed = grad[in_row, :, tp + in_col]
        return grad_prompt, grad_packed, None, None, None, None


class _FromGrid(torch.autograd.Function):
    """The inverse gather: grid (B, heads, T, d) -> packed rows (N, heads·d) at (in_row, :, in_col);
    the backward scatters into a zero grid without accumulation (cells are distinct). Exact."""

    @staticmethod
    def forward(ctx, grid, in_row, in_col):
        ctx.save_for_backward(in_row, in_col)
        ctx.shape = grid.shape
        return grid[in_row, :, in_col].flatten(1)

    @staticmethod
    def backward(ctx, grad):
        in_row, in_col = ctx.saved_tensors
        out = grad.new_zeros(ctx.shape)
        out[in_row, :, in_col] = grad.view(len(in_row), ctx.shape[1], ctx.shape[3])
        return out, None, None


def completion_hidden(w: LlamaWeights, prompt_ids, prompt_mask, completion_ids, lengths=None):
    """Hidden states, before the final norm, at the positions that predict completion tokens.

    Returns (hidden (M, H), index (M,)): row r's token t (flat index r·Tc + t) is predicted by
    hidden[i] where index[i] == r·Tc + t, for every t < lengths[r] (all Tc when `lengths` is
    None). Same as the HF forward over cat([prompt, completion]) with attention
    cat([prompt_mask, 1]) and positions cumsum-1, but each distinct prompt is run once and only
    the completion tokens that feed a scored prediction go through the weights.
    """
    ids_u, mask_u, row = unique_prompts(prompt_ids, prompt_mask)
    b, tc = completion_ids.shape
    if lengths is None:
        lengths = torch.full((b,), tc, dtype=torch.long)
    lengths = lengths.long().clamp(0, tc)
    fed = (lengths - 1).clamp(min=0)                                      # completion tokens fed per row
    t_in = int(fed.max()) if b else 0
    flat = (torch.arange(t_in)[None, :] < fed[:, None]).flatten().nonzero().squeeze(-1)  # into (B·t_in)
    in_row, in_col = flat // max(t_in, 1), flat % max(t_in, 1)
    if w.kernels:
        xp, xc = _layers_cpp(w, ids_u, mask_u, row, completion_ids[in_row, in_col], in_row, in_col)
    else:
        xp, xc = _layers_eager(w, ids_u, mask_u, row, completion_ids, flat, in_row, in_col, t_in)
    scored = (lengths > 0).nonzero().squeeze(-1)
    hidden = torch.cat([xp[row[scored], -1], xc])
    index = torch.cat([scored * tc, in_row * tc + in_col + 1])
    return hidden, index


def _layers_eager(w: LlamaWeights, ids_u, mask_u, row, completion_ids, flat, in_row, in_col, t_in):
    """The layers of `completion_hidden` as ATen ops: (prompt rows (U, Tp, H), packed rows (N, H))."""
    b, tp = completion_ids.shape[0], ids_u.shape[1]
    rot_p = w.rope((mask_u.cumsum(-1) - 1).clamp(min=0))                 # (U, Tp, 1, d/2)
    rot_c = w.rope(mask_u.sum(-1)[row][in_row] + in_col)                  # (N, 1, d/2): packed tokens
    mask_p = prompt_masks(mask_u)
    bias_p = additive(mask_p)                                            # (U, 1, Tp, Tp)
    causal = torch.ones(t_in, t_in, dtype=torch.bool).tril()
    bias_c = additive(torch.cat([mask_u.bool()[row][:, None, None, :].expand(b, 1, t_in, tp),
                                  causal.expand(b, 1, t_in, t_in)], dim=-1))  # (B, 1, t_in, Tp+t_in)
    xp = w.lookup(ids_u)                                                   # (U, Tp, H)
    xc = w.lookup(completion_ids[in_row, in_col])                          # (N, H) packed
    h, kv = w.heads, w.kv_heads
    for layer in w.layers:
        if len(flat):
            # Parts of one tensor are taken with split, never with slices: the backward of a slice
            # is a zero tensor of the whole input plus a copy, per slice; split's is one cat.
            qk, v = w.fused_qkv(layer, xc).split([h + kv, kv], dim=1)     # (N, h+kv, d), (N, kv, d)
            q, k = w.rotate(qk, rot_c).split([h, kv], dim=1)               # RoPE on the packed rows only
            q = _ToGrid.apply(q, in_row, in_col, b, t_in)                  # (B, h, t_in, d)
        xp, kp, vp = w.prompt_layer(layer, xp, rot_p, mask_p, bias_p)
        if len(flat):
            keys = _KeysGrid.apply(kp, k, row, in_row, in_col, t_in)       # (B, kv, Tp+t_in, d)
            values = _KeysGrid.apply(vp, v, row, in_row, in_col, t_in)
            attn = w.attend_explicit(q, keys, values, bias_c)
            xc = w.finish(layer, xc, _FromGrid.apply(attn, in_row, in_col))
    return xp, xc


def _layers_cpp(w: LlamaWeights, ids_u, mask_u, row, fed_ids, in_row, in_col):
    """The layers of `completion_hidden` as one C++ call per layer each way (`trainer.kernels=cpp`):
    prompt rows and packed completion rows go through one (U·Tp + N, H) matrix, attention follows
    the same masks as `_layers_eager`. Returns (prompt rows (U, Tp, H), packed rows (N, H))."""
    u, tp = ids_u.shape
    mask_u = mask_u.long().contiguous()
    pos = torch.cat([((mask_u.cumsum(-1) - 1).clamp(min=0)).flatten(), mask_u.sum(-1)[row][in_row] + in_col])
    table = w.rope(torch.arange(int(pos.max()) + 1))[:, 0]                # (S, d/2) complex
    # Packed rows are row-major, so a sequence's first packed row is `in_col` rows back.
    plan = (mask_u, row[in_row].contiguous(), (torch.arange(len(in_row)) - in_col).contiguous(), pos.contiguous(),
            table.real.contiguous(), table.imag.contiguous())
    x = torch.cat([w.lookup(ids_u).flatten(0, 1), w.lookup(fed_ids)])
    for layer in w.layers:
        x = ops.layer(x, (layer.ln1, layer.wqkv, layer.bqkv, layer.wo, layer.bo, layer.ln2, layer.wgu, layer.wd),
                      plan, w.heads, w.kv_heads, w.eps)
    return x[:u * tp].view(u, tp, -1), x[u * tp:]
