"""Turn-level advantages for multi-turn agents (torch + stdlib only).

Inputs (`AdvantageInputs`): `turn_rewards` r (B, K), `turn_states` (B, K) integer ids of the
environment state each action was taken in, `turn_valid` (B, K), `turn_index` (B, T) the turn of
every completion token (-1 none). Rows [p*G:(p+1)*G] share prompt p.

- `gigpo`: GiGPO (Feng et al. 2025, arXiv 2505.10978). Episode level
      A^E_i = (R_i - mean_g R) / F,  R_i = sum_k r_{i,k}
  step level: the discounted return from turn k, G_{i,k} = sum_{k'>=k} gamma^(k'-k) r_{i,k'},
  compared within its anchor group (same prompt, identical state):
      A^S_{i,k} = (G_{i,k} - mean_anchor G) / F_anchor,  0 for a state seen once,
  per token of turn k: A_{i,t} = A^E_i + omega * A^S_{i,k(t)}.  F = std + adv_eps, or 1 when
  `std_normalize` is False.
- `turn_return`: A_{i,k} = (G_{i,k} - mean of G over the group's rows at the same turn index) / F;
  a turn index is not a state (the baseline is coarser than GiGPO's), but it needs no state key.

Hyperparameters: `gamma` (turn discount), `omega` (GiGPO's step weight), `std_normalize`, `adv_eps`
(as in `advantages.py`).

Deliberate deviations:
1. GiGPO's outcome is the sum of the per-turn environment rewards (the answer's reward is the last
   turn's); the step return discounts those same rewards.
2. Bessel std in both levels (as GRPO here); `std_normalize` switches both scalings together.

Observation tokens carry the turn index of the action before them but mask 0, so they never get
an advantage (every result is multiplied by `response_mask`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlvr.algos._advantage_core import AdvantageInputs, centred_scores, group_stats, to_tokens


def _require(inp: AdvantageInputs, name: str) -> None:
    if inp.turn_rewards is None or inp.turn_index is None or inp.turn_valid is None:
        raise ValueError(f"advantage {name!r} needs per-turn tensors: use it with an agent task (task.name=agent_*)")


def discounted_returns(rewards: Tensor, valid: Tensor, gamma: float) -> Tensor:
    """(B, K) G_k = r_k + gamma * G_{k+1} over valid turns (padding turns contribute 0)."""
    r = torch.where(valid, rewards.float(), torch.zeros_like(rewards, dtype=torch.float32))
    out = torch.zeros_like(r)
    running = torch.zeros(r.shape[0], dtype=r.dtype, device=r.device)
    for k in range(r.shape[1] - 1, -1, -1):
        running = r[:, k] + gamma * running
        out[:, k] = running
    return torch.where(valid, out, torch.zeros_like(out))


def _grouped_normalise(values: Tensor, keys: Tensor, valid: Tensor, *, std_normalize: bool,
                       adv_eps: float) -> tuple[Tensor, Tensor]:
    """(centred / scaled values (B, K), size of each entry's group (B, K)) over entries sharing a
    key; singletons (and padding) get 0. Bessel std, as the episode-level GRPO."""
    flat_keys, flat_vals, flat_valid = keys.flatten(), values.flatten().float(), valid.flatten()
    out = torch.zeros_like(flat_vals)
    size = torch.zeros_like(flat_vals)
    if flat_valid.any():
        uniq, inverse = torch.unique(flat_keys[flat_valid], return_inverse=True)
        v = flat_vals[flat_valid]
        count = torch.zeros(len(uniq), dtype=v.dtype, device=v.device).scatter_add_(0, inverse, torch.ones_like(v))
        mean = torch.zeros(len(uniq), dtype=v.dtype, device=v.device).scatter_add_(0, inverse, v) / count
        sq = torch.zeros(len(uniq), dtype=v.dtype, device=v.device).scatter_add_(0, inverse, (v - mean[inverse]) ** 2)
        std = (sq / (count - 1).clamp(min=1)).sqrt()
        centred = v - mean[inverse]
        if std_normalize:
            centred = centred / (std[inverse] + adv_eps)
        centred = torch.where(count[inverse] > 1, centred, torch.zeros_like(centred))
        out[flat_valid] = centred
        size[flat_valid] = count[inverse]
    return out.view_as(values), size.view_as(values)


def _scatter_turns(a_turn: Tensor, inp: AdvantageInputs) -> Tensor:
    """A_tok[b, t] = a_turn[b, turn_index[b, t]] on response tokens, 0 elsewhere."""
    index = inp.turn_index.clamp(min=0, max=a_turn.shape[1] - 1)
    picked = a_turn.gather(1, index)
    return torch.where(inp.turn_index >= 0, picked, torch.zeros_like(picked)) * inp.response_mask


def gigpo(inp: AdvantageInputs, *, gamma: float = 0.95, omega: float = 1.0, std_normalize: bool = True,
          adv_eps: float = 1e-6) -> tuple[Tensor, dict[str, float]]:
    """GiGPO: episode-level group advantage + omega x anchor-state step advantage (see module doc)."""
    _require(inp, "gigpo")
    valid = inp.turn_valid
    outcome = torch.where(valid, inp.turn_rewards.float(), torch.zeros_like(inp.turn_rewards)).sum(-1)
    outcome = torch.where(torch.isnan(inp.rewards), inp.rewards, outcome)
    st = group_stats(outcome, inp.group_size)
    centred = centred_scores(st, inp.group_size)
    episode = (centred / (st.std + adv_eps) if std_normalize else centred).flatten()
    returns = discounted_returns(inp.turn_rewards, valid, gamma)
    group = torch.arange(len(outcome), device=outcome.device).div(inp.group_size, rounding_mode="floor")[:, None]
    states = inp.turn_states if inp.turn_states is not None else torch.zeros_like(group).expand_as(valid)
    keys = group * (int(states.max().clamp(min=0)) + 1) + states.clamp(min=0)
    step, size = _grouped_normalise(returns, keys, valid, std_normalize=std_normalize, adv_eps=adv_eps)
    adv = to_tokens(episode, inp.response_mask) + omega * _scatter_turns(step, inp)
    turns = valid.sum().clamp(min=1)
    metrics = {"anchor_frac": float(((size > 1) & valid).sum() / turns),
               "anchor_size_mean": float(size[valid].mean()) if valid.any() else 0.0,
               "step_abs_mean": float(step[valid].abs().mean()) if valid.any() else 0.0}
    return adv, metrics


def turn_return(inp: AdvantageInputs, *, gamma: float = 0.95, std_normalize: bool = True,
                adv_eps: float = 1e-6) -> tuple[Tensor, dict[str, float]]:
    """Per-turn discounted return minus the group's mean return at the same turn index."""
    _require(inp, "turn_return")
    valid = inp.turn_valid
    returns = discounted_returns(inp.turn_rewards, valid, gamma)
    group = torch.arange(returns.shape[0], device=returns.device).div(inp.group_size, rounding_mode="floor")[:, None]
    keys = group * returns.shape[1] + torch.arange(returns.shape[1], device=returns.device)[None, :]
    step, _ = _grouped_normalise(returns, keys, valid, std_normalize=std_normalize, adv_eps=adv_eps)
    return _scatter_turns(step, inp), {"turn_return_abs_mean": float(step[valid].abs().mean()) if valid.any() else 0.0}
