"""rlvr's registries vs verl 0.9.1's `verl/trainer/ppo/core_algos.py`, function by function.

    python bench/parity_verl.py --setup --venv .venv-verl   # once: a separate venv with verl 0.9.1
    python bench/parity_verl.py --venv .venv-verl           # compare, print tables, write the fixture

`--setup` makes a plain virtual environment (never the project's) with torch 2.13, numpy, verl
0.9.1 installed `--no-deps`, and only the packages importing `verl.trainer.ppo.core_algos` needs
(verl's package imports pull in ray, tensordict, omegaconf, transformers and three small ones).

The run builds inputs with a fixed seed covering the edge cases that matter (singleton groups,
all-equal groups, tiny std, interleaved group ids, single-token rows, fully masked rows, interior
mask zeros, log-ratios beyond +-20, junk at masked positions, float64 inputs; for the losses and
aggregations also a different advantage at every token), calls verl's functions in that venv (a
subprocess) and rlvr's here, and prints one table per family: cases, match, documented deviation,
mismatch. An input both sides reject (raise on) is a match. Besides the hyperparameters set on
both sides (PARAMS), DPPO is compared at each side's own defaults (`dppo_*_defaults`) and at
verl's defaults against rlvr's with ratio_cap 3.0 (`dppo_*_cap3`). Losses compare the value and
the gradient with respect to the log-probs on valid positions; advantages, returns and per-token
values compare on valid positions (rlvr is also checked to be exactly 0 on padding). Tolerance
rtol = atol = 1e-6 in float32 (relative to the largest value), 1e-8 in float64 (verl adds 1e-8 to
a few denominators). With junk at masked positions verl is given the same inputs with the junk
zeroed: the check is that rlvr ignores it (verl's gradients there would not be finite;
`objectives` deviation 2).

Each deviation is listed in DEVIATIONS with the reason; anything else that differs is a
mismatch. The inputs and verl's outputs are saved to tests/algos/fixtures/verl_parity.pt, which
tests/algos/test_verl_parity.py replays against rlvr without verl.
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "algos" / "fixtures" / "verl_parity.pt"
VERL = "verl==0.9.1"
VERL_IMPORTS = ["torch==2.13.0", "numpy", "packaging", "pyyaml", "omegaconf", "ray", "codetiming", "orjson",
                "tensordict>=0.8.0,<=0.10.0,!=0.9.0", "transformers>=5.5.3,<5.11,!=5.6.0"]

WHITEN = "whitening divides by (std + 1e-6), verl multiplies by rsqrt(var + 1e-8) (returns deviation 1)"
TINY = "std ~1e-7: (x - m) / (s + 1e-6) and (x - m) / sqrt(s^2 + 1e-8) scale differently (the eps placement)"
CLAMP = "log-ratios clamped at +-20 (objectives_zoo deviation 1); verl does not clamp"
# (verl function, case) -> (why rlvr deliberately differs, the largest relative error that reason explains);
# case "*" = every case of that function. An error beyond the bound is a mismatch.
DEVIATIONS = {
    ("rloo_vectorized", "singleton_groups"): ("G = 1: rlvr gives A = R (verl's loop `rloo`), verl's vectorised "
                                              "form 0", math.inf),
    ("grpo_vectorized", "float64"): ("verl's group_mean_std computes in float32; rlvr keeps float64", 1e-6),
    ("grpo_vectorized", "tiny_std"): ("verl's group_mean_std computes in float32, which cannot resolve a 1e-7 "
                                      "spread; rlvr keeps float64 (verl's loop `grpo` matches)", math.inf),
    ("geo_mean", "fully_masked_rows"): ("rows with no valid token are not counted in the mean over rows "
                                        "(verl counts them)", math.inf),
    ("gspo", "log_ratio_beyond_20"): ("sequence log-ratio clamped at +-20; verl clamps at max 10 only", math.inf),
    ("k3", "log_ratio_beyond_20"): ("k3 not clamped to [-10, 10] (kl deviation 1); verl clamps", math.inf),
    ("k3+", "log_ratio_beyond_20"): ("k3 not clamped to [-10, 10] (kl deviation 1); verl clamps", math.inf),
}
for _fn in ("dppo_tv_defaults", "dppo_kl_defaults"):
    DEVIATIONS[(_fn, "*")] = ("ratio_cap defaults to 20, verl's actor config runs its dppo losses with clip_ratio_c "
                              "3.0 (objectives_zoo deviation 5)", math.inf)
for _fn in ("geo_mean", "kl_cov", "clip_cov", "dro"):
    DEVIATIONS[(_fn, "log_ratio_beyond_20")] = (CLAMP, math.inf)
for _fn in ("gae", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "gdpo", "gdpo_components"):
    DEVIATIONS[(_fn, "*")] = (WHITEN, 1e-4)  # the two differ by about 1e-6 / std
    DEVIATIONS[(_fn, "tiny_std")] = (TINY, math.inf)

CASES = ["random", "singleton_groups", "all_equal_groups", "tiny_std", "interleaved_ids", "single_token_rows",
         "fully_masked_rows", "interior_mask_zeros", "log_ratio_beyond_20", "junk_at_masked", "float64",
         "per_token_advantages"]
TOKEN_ADVANTAGE_FAMILIES = ("policy_loss", "aggregation")  # the families per_token_advantages changes


# ------------------------------------------------------------------------------------------ inputs

def _case(name: str, seed: int) -> dict:
    """One input set: P groups of G rows, T tokens; everything a verl function may read."""
    g = torch.Generator().manual_seed(seed)
    dtype = torch.float64 if name in ("float64", "tiny_std") else torch.float32
    P, G, T = (6, 1, 5) if name == "singleton_groups" else (3, 4, 5)
    B = P * G
    lengths = torch.randint(2, T + 1, (B,), generator=g)
    if name == "single_token_rows":
        lengths[::2] = 1
    if name == "fully_masked_rows":
        lengths[1::3] = 0
    mask = (torch.arange(T)[None, :] < lengths[:, None]).to(dtype)
    if name == "interior_mask_zeros":
        mask[:, 1] = 0.0
        mask[::2, 3] = 0.0
        mask[:, 0] = 1.0
    rewards = torch.randint(0, 3, (B,), generator=g).to(dtype) / 2 + 0.1 * torch.randn(B, generator=g, dtype=dtype)
    if name == "all_equal_groups":
        rewards = rewards.view(P, G)[:, :1].expand(P, G).reshape(-1).clone() * 0.1 + 0.3
    if name == "tiny_std":
        rewards = 1.0 + 1e-7 * torch.randn(B, generator=g, dtype=dtype)
    if name == "fully_masked_rows":
        rewards = torch.where(mask.sum(-1) > 0, rewards, torch.zeros_like(rewards))  # no token holds a reward
    old = -torch.rand(B, T, generator=g, dtype=dtype) * 3 - 0.05
    logp = old + 0.3 * torch.randn(B, T, generator=g, dtype=dtype)
    if name == "log_ratio_beyond_20":
        logp = logp.clamp(max=-0.01)
        old[0, 0], old[1, 0], logp[2, 0], logp[3, 1] = -25.0, -30.0, -28.0, -23.0
    logp = logp.clamp(max=-1e-4)
    ref = old + 0.5 * torch.randn(B, T, generator=g, dtype=dtype)
    if name == "log_ratio_beyond_20":
        ref[4, 0], ref[5, 0] = -26.0, 0.0
        logp[5, 0] = -27.0
    values = torch.randn(B, T, generator=g, dtype=dtype)
    index = torch.arange(B) // G
    if name == "interleaved_ids":
        index = torch.arange(B) % P  # group p holds rows p, p + P, p + 2P, ...
    adv_tok = torch.randn(B, 1, generator=g, dtype=dtype).expand(B, T).clone() * mask
    case = dict(name=name, P=P, G=G, T=T, mask=mask, rewards=rewards, old_logp=old, logp=logp, ref_logp=ref,
                values=values, old_values=values + 0.3 * torch.randn(B, T, generator=g, dtype=dtype),
                returns=torch.randn(B, T, generator=g, dtype=dtype), index=index, advantages=adv_tok,
                baselines=torch.randn(P, generator=g, dtype=dtype).repeat_interleave(G)[::G].clone(),
                sum_pi_squared=torch.rand(B, T, generator=g, dtype=dtype) * 0.5 + 0.2,
                components=torch.randint(0, 2, (B, 2), generator=g).to(dtype),
                logits=torch.randn(B, T, 7, generator=g, dtype=dtype) * 3)
    if name == "per_token_advantages":  # a different advantage, and sign, at every token
        case["advantages"] = torch.randn(B, T, generator=g, dtype=dtype) * mask
    if name == "junk_at_masked":
        for key in ("logp", "old_logp", "ref_logp", "values", "old_values", "returns", "advantages"):
            case[key] = torch.where(mask > 0, case[key], torch.full_like(case[key], math.inf))
        case["logp"] = torch.where(mask > 0, case["logp"], torch.full_like(mask, math.nan))
    return case


def clean(case: dict) -> dict:
    """The case with junk at masked positions set to 0 (what verl is given)."""
    out = dict(case)
    keep = case["mask"] > 0
    for key in ("logp", "old_logp", "ref_logp", "values", "old_values", "returns", "advantages"):
        out[key] = torch.where(keep, case[key], torch.zeros_like(case[key]))
    out["logits"] = torch.where(keep[..., None], case["logits"], torch.zeros_like(case["logits"]))
    return out


def token_rewards(case: dict) -> torch.Tensor:
    """(B, T) the outcome reward at each row's last valid token (verl's token_level_rewards)."""
    mask = case["mask"]
    T = mask.shape[1]
    last = torch.where(mask > 0, torch.arange(T).expand_as(mask), torch.zeros_like(mask, dtype=torch.long)).amax(-1)
    has = mask.sum(-1) > 0
    out = torch.zeros_like(mask)
    out[torch.arange(len(last)), last] = torch.where(has, case["rewards"], torch.zeros_like(case["rewards"]))
    return out


ADVANTAGE_FNS = ["gae", "grpo", "grpo_vectorized", "gdpo", "gdpo_components", "grpo_passk", "reinforce_plus_plus",
                 "reinforce_plus_plus_baseline", "remax", "rloo", "rloo_vectorized", "opo", "gpg", "gpg_f_norm",
                 "optimal_token_baseline", "tir_optimal_token_baseline"]
# dppo_*_defaults: both sides at their own defaults (verl's ActorConfig, rlvr's keyword defaults);
# dppo_*_cap3: verl at its defaults, rlvr at its own but ratio_cap 3.0 (the cap is the only difference)
POLICY_FNS = ["vanilla", "gspo", "sapo", "cispo", "gpg", "clip_cov", "kl_cov", "geo_mean", "dro", "dppo_tv", "dppo_kl",
              "dppo_tv_defaults", "dppo_kl_defaults", "dppo_tv_cap3", "dppo_kl_cap3"]
AGG_MODES = ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
KL_FNS = ["k1", "k2", "k3", "abs", "k1+", "k3+"]
PARAMS = dict(clip_low=0.2, clip_high=0.28, gspo_low=3e-4, gspo_high=4e-4, cispo_high=4.0, dual=3.0, tau_pos=1.0,
              tau_neg=1.05, dro_beta=0.05, cov_ratio=0.2, cov_kl_coef=0.1, cov_lb=-5.0, cov_ub=5.0, ratio_cap=20.0,
              gamma=0.9, lam=0.95, value_clip=0.5, f_norm=2.5)
SKIP = {("gdpo_components", "interleaved_ids")}  # verl's component path needs a batch layout; ids tested by gdpo


def entries() -> list[dict]:
    """Every (family, function, case) to compare."""
    families = [("advantage", ADVANTAGE_FNS, 100), ("policy_loss", POLICY_FNS, 200), ("aggregation", AGG_MODES, 300),
                ("kl", KL_FNS, 400), ("entropy", ["entropy_from_logits"], 500),
                ("value_loss", ["compute_value_loss"], 600)]
    out = []
    for i, name in enumerate(CASES):
        for family, fns, seed in families:
            if name == "per_token_advantages" and family not in TOKEN_ADVANTAGE_FAMILIES:
                continue
            out += [dict(family=family, fn=fn, case=name, seed=seed + i) for fn in fns if (fn, name) not in SKIP]
    return out


# ------------------------------------------------------------------------------------------ verl side

def _verl_policy(ca, fn: str, c: dict) -> dict:
    from verl.workers.config.actor import ActorConfig, PolicyLossConfig

    p = PARAMS
    lo, hi = {"gspo": (p["gspo_low"], p["gspo_high"]), "cispo": (1.0, p["cispo_high"])}.get(fn, (p["clip_low"],
                                                                                                 p["clip_high"]))
    if fn.endswith(("_defaults", "_cap3")):
        fn = fn.removesuffix("_defaults").removesuffix("_cap3")
        cfg = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, loss_agg_mode="token-mean",
                          policy_loss=PolicyLossConfig(loss_mode=fn))
        return _verl_loss(ca, fn, c, cfg)
    cfg = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, clip_ratio=lo, clip_ratio_low=lo,
                      clip_ratio_high=hi, clip_ratio_c=p["dual"] if fn == "vanilla" else p["ratio_cap"],
                      tau_pos=p["tau_pos"], tau_neg=p["tau_neg"], loss_agg_mode="token-mean",
                      policy_loss=PolicyLossConfig(loss_mode=fn, dro_beta=p["dro_beta"], kl_cov_ratio=p["cov_ratio"],
                                                   ppo_kl_coef=p["cov_kl_coef"], clip_cov_ratio=p["cov_ratio"],
                                                   clip_cov_lb=p["cov_lb"], clip_cov_ub=p["cov_ub"]))
    return _verl_loss(ca, fn, c, cfg)


def _verl_loss(ca, fn: str, c: dict, cfg) -> dict:
    logp = c["logp"].clone().requires_grad_(True)
    torch.manual_seed(c["seed"])  # clip_cov's random choice
    loss, _ = ca.get_policy_loss_fn(fn)(c["old_logp"], logp, c["advantages"], c["mask"], "token-mean", cfg)
    loss.backward()
    return {"loss": loss.detach(), "grad": logp.grad.detach()}


def _verl_advantage(ca, fn: str, c: dict) -> dict:
    import numpy as np
    from omegaconf import OmegaConf

    trew, mask, index = token_rewards(c), c["mask"], c["index"].numpy()
    cfg = OmegaConf.create({"gamma": PARAMS["gamma"], "norm_adv_by_std_in_grpo": True})
    if fn == "gae":
        adv, ret = ca.compute_gae_advantage_return(trew, c["values"], mask, PARAMS["gamma"], PARAMS["lam"])
        return {"adv": adv, "returns": ret}
    if fn == "remax":
        base = c["baselines"][c["index"]]
        adv, _ = ca.compute_remax_outcome_advantage(trew, base, mask)
        return {"adv": adv}
    if fn in ("optimal_token_baseline", "tir_optimal_token_baseline"):
        adv, _ = ca.get_adv_estimator_fn(fn)(trew, mask, index, old_log_probs=c["old_logp"],
                                             sum_pi_squared=c["sum_pi_squared"])
        return {"adv": adv}
    if fn == "gpg_f_norm":
        adv, _ = ca.compute_gpg_outcome_advantage(trew, mask, index, f_norm=PARAMS["f_norm"])
        return {"adv": adv}
    if fn == "gdpo_components":
        B, T = mask.shape
        attn = torch.cat([torch.ones(B, 2), mask], dim=1).long()
        keys = ["r0", "r1"]
        ntb = {k: np.asarray(c["components"][:, j].tolist()) for j, k in enumerate(keys)}
        cfg = OmegaConf.create({"gdpo_reward_keys": keys, "gdpo_reward_weights": [1.0, 0.5]})
        adv, _ = ca.compute_gdpo_outcome_advantage(trew, mask, index, config=cfg, non_tensor_batch=ntb,
                                                   batch={"prompts": torch.zeros(B, 2), "attention_mask": attn})
        return {"adv": adv}
    kwargs = {"config": cfg} if fn == "reinforce_plus_plus" else {"index": index, "config": cfg}
    adv, _ = ca.get_adv_estimator_fn(fn)(token_level_rewards=trew, response_mask=mask, **kwargs)
    return {"adv": adv}


def verl_outputs(entry: dict, case: dict) -> dict:
    """verl's outputs for one entry (run inside the verl venv)."""
    import verl.trainer.ppo.core_algos as ca
    import verl.utils.torch_functional as verl_F

    c = dict(clean(case), seed=entry["seed"])
    fam, fn = entry["family"], entry["fn"]
    if fam == "advantage":
        return _verl_advantage(ca, fn, c)
    if fam == "policy_loss":
        return _verl_policy(ca, fn, c)
    if fam == "aggregation":
        loss_mat = (c["logp"] * c["advantages"]).clone().requires_grad_(True)
        out = ca.agg_loss(loss_mat, c["mask"], fn)
        out.backward()
        return {"loss": out.detach(), "grad": loss_mat.grad}
    if fam == "kl":
        logp = c["logp"].clone().requires_grad_(True)
        kl = ca.kl_penalty(logp, c["ref_logp"], fn)
        (kl * c["mask"]).sum().backward()
        return {"value": kl.detach(), "grad": logp.grad}
    if fam == "entropy":
        logits = c["logits"].clone().requires_grad_(True)
        h = verl_F.entropy_from_logits(logits)
        (h * c["mask"]).sum().backward()
        return {"value": h.detach(), "grad": logits.grad}
    vpreds = c["values"].clone().requires_grad_(True)
    loss, _ = ca.compute_value_loss(vpreds, c["returns"], c["old_values"], c["mask"], PARAMS["value_clip"])
    loss.backward()
    return {"loss": loss.detach(), "grad": vpreds.grad}


# ------------------------------------------------------------------------------------------ rlvr side

def _contiguous(case: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(order, inverse): rows reordered so each group is contiguous (rlvr's layout), and back."""
    order = torch.argsort(case["index"], stable=True)
    return order, torch.argsort(order)


def _rlvr_advantage(fn: str, c: dict) -> dict:
    from rlvr.algos.advantages import ADVANTAGES, AdvantageInputs, gae_returns

    order, inverse = _contiguous(c)
    pick = lambda key: c[key][order]  # noqa: E731
    name = {"grpo_vectorized": "grpo", "rloo_vectorized": "rloo", "reinforce_plus_plus": "reinforce_pp",
            "reinforce_plus_plus_baseline": "reinforce_pp_baseline", "gdpo_components": "gdpo",
            "tir_optimal_token_baseline": "optimal_token_baseline_multi_turn", "gpg_f_norm": "gpg"}.get(fn, fn)
    inp = AdvantageInputs(rewards=pick("rewards"), group_size=c["G"], response_mask=pick("mask"),
                          values=pick("values"), baseline_rewards=c["baselines"], old_logp=pick("old_logp"),
                          sum_pi_squared=pick("sum_pi_squared"),
                          reward_components=pick("components") if fn == "gdpo_components" else None,
                          reward_weights=torch.tensor([1.0, 0.5]) if fn == "gdpo_components" else None)
    kw = {"gamma": PARAMS["gamma"], "lam": PARAMS["lam"]} if fn == "gae" else {}
    kw = {"gamma": PARAMS["gamma"]} if fn == "reinforce_plus_plus" else kw
    kw = {"f_norm": PARAMS["f_norm"]} if fn == "gpg_f_norm" else kw
    adv, _ = ADVANTAGES[name](inp, **kw)
    out = {"adv": adv[inverse]}
    if fn == "gae":
        out["returns"] = gae_returns(inp, **kw)[inverse]
    return out


def _rlvr_policy(fn: str, c: dict) -> dict:
    from functools import partial

    from rlvr.algos.aggregate import AGGREGATIONS, global_counts
    from rlvr.algos.objectives import OBJECTIVES

    p = PARAMS
    lo, hi = p["clip_low"], p["clip_high"]
    objective = {
        "vanilla": partial(OBJECTIVES["ppo_clip"], clip_low=lo, clip_high=hi, dual_clip=p["dual"]),
        "gspo": partial(OBJECTIVES["gspo"], clip_low=p["gspo_low"], clip_high=p["gspo_high"]),
        "sapo": partial(OBJECTIVES["sapo"], tau_pos=p["tau_pos"], tau_neg=p["tau_neg"]),
        "cispo": partial(OBJECTIVES["cispo"], clip_low=1.0, clip_high=p["cispo_high"]),
        "gpg": OBJECTIVES["reinforce"],
        "clip_cov": partial(OBJECTIVES["clip_cov"], clip_low=lo, clip_high=hi, cov_ratio=p["cov_ratio"],
                            cov_lb=p["cov_lb"], cov_ub=p["cov_ub"]),
        "kl_cov": partial(OBJECTIVES["kl_cov"], cov_ratio=p["cov_ratio"], cov_kl_coef=p["cov_kl_coef"]),
        "geo_mean": partial(OBJECTIVES["gmpo"], clip_low=lo, clip_high=hi),
        "dro": partial(OBJECTIVES["dro"], dro_beta=p["dro_beta"]),
        "dppo_tv": partial(OBJECTIVES["dppo_tv"], clip_low=lo, clip_high=hi, ratio_cap=p["ratio_cap"]),
        "dppo_kl": partial(OBJECTIVES["dppo_kl"], clip_low=lo, clip_high=hi, ratio_cap=p["ratio_cap"]),
        "dppo_tv_defaults": OBJECTIVES["dppo_tv"],
        "dppo_kl_defaults": OBJECTIVES["dppo_kl"],
        "dppo_tv_cap3": partial(OBJECTIVES["dppo_tv"], ratio_cap=3.0),
        "dppo_kl_cap3": partial(OBJECTIVES["dppo_kl"], ratio_cap=3.0),
    }[fn]
    agg = AGGREGATIONS["seq_mean_token_mean" if fn in ("sapo", "geo_mean") else "token_mean"]
    logp = c["logp"].clone().requires_grad_(True)
    torch.manual_seed(c["seed"])
    loss_tok, _ = objective(logp, c["old_logp"], c["advantages"], c["mask"])
    num_tokens, num_seqs = global_counts([c["mask"]])
    loss = agg(loss_tok, c["mask"], num_tokens=num_tokens, num_seqs=num_seqs)
    loss.backward()
    return {"loss": loss.detach(), "grad": logp.grad.detach()}


def rlvr_outputs(entry: dict, case: dict) -> dict:
    """rlvr's outputs for one entry, on the case as built (junk included)."""
    from rlvr.algos import aggregate, entropy, kl, value

    c = dict(case, seed=entry["seed"])
    fam, fn = entry["family"], entry["fn"]
    if fam == "advantage":
        try:
            return _rlvr_advantage(fn, c)
        except ValueError as err:  # rlvr rejects the input
            return {"error": f"ValueError: {str(err).splitlines()[0][:80]}"}
    if fam == "policy_loss":
        return _rlvr_policy(fn, c)
    mask = c["mask"]
    if fam == "aggregation":
        loss_mat = torch.where(mask > 0, c["logp"] * c["advantages"], torch.zeros_like(mask)).requires_grad_(True)
        num_tokens, num_seqs = aggregate.global_counts([mask])
        name = fn.replace("-", "_")
        out = aggregate.AGGREGATIONS[name](loss_mat, mask, num_tokens=num_tokens, num_seqs=num_seqs,
                                           norm_length=float(mask.shape[1]))
        out.backward()
        return {"loss": out.detach(), "grad": loss_mat.grad}
    if fam == "kl":
        logp = c["logp"].clone().requires_grad_(True)
        est = kl.KL_ESTIMATORS[{"k1+": "k1_st", "k3+": "k3_st"}.get(fn, fn)]
        value_tok = est(logp, c["ref_logp"])
        torch.where(mask > 0, value_tok, torch.zeros_like(value_tok)).sum().backward()
        return {"value": value_tok.detach(), "grad": logp.grad}
    if fam == "entropy":
        logits = c["logits"].clone().requires_grad_(True)
        h = entropy.token_entropy(logits)
        (h * mask).sum().backward()
        return {"value": h.detach(), "grad": logits.grad}
    vpreds = c["values"].clone().requires_grad_(True)
    loss_tok, _ = value.value_loss(vpreds, c["old_values"], c["returns"], mask, value_clip=PARAMS["value_clip"])
    num_tokens, _ = aggregate.global_counts([mask])
    loss = aggregate.token_mean(loss_tok, mask, num_tokens=num_tokens)
    loss.backward()
    return {"loss": loss.detach(), "grad": vpreds.grad}


# ------------------------------------------------------------------------------------------ comparison

def compare(entry: dict, case: dict, ours: dict, theirs: dict) -> tuple[str, str]:
    """('match' | 'deviation' | 'mismatch', detail) for one entry."""
    keep = case["mask"] > 0
    worst = 0.0
    reason, bound = DEVIATIONS.get((entry["fn"], entry["case"])) or DEVIATIONS.get((entry["fn"], "*")) or ("", 0.0)
    if "error" in theirs or "error" in ours:
        if "error" in theirs and "error" in ours:
            return "match", "both reject the input"
        if bound == math.inf:
            return "deviation", reason
        return "mismatch", f"{'verl' if 'error' in theirs else 'rlvr'} raised {theirs.get('error') or ours['error']}"
    for key, ref in theirs.items():
        mine = ours[key].to(ref.dtype)
        if ref.dim() >= 2 and ref.shape[:2] == keep.shape:  # per-token: valid positions only
            sel = keep if ref.dim() == 2 else keep[..., None].expand_as(ref)
            padded = entry["family"] not in ("kl", "entropy")  # those two are masked by the caller
            if padded and key in ("adv", "returns", "grad") and not torch.all(mine[~sel] == 0):
                worst = math.inf
            a, b = mine[sel], ref[sel]
        else:
            a, b = mine.reshape(-1), ref.reshape(-1)
        tol = 1e-8 if ref.dtype == torch.float64 else 1e-6  # float64: verl's 1e-8 epsilons show
        scale = max(1.0, float(b.abs().max())) if b.numel() and torch.isfinite(b).all() else 1.0
        err = float((a - b).abs().max()) / scale if a.numel() else 0.0
        worst = max(worst, err if math.isfinite(err) else math.inf)
        if not (err <= tol):
            if err <= bound or bound == math.inf:
                return "deviation", f"{reason} (max rel err {err:.1e})" if bound < math.inf else reason
            return "mismatch", f"{key}: max rel err {err:.3g}"
    if worst == math.inf:
        return "mismatch", "rlvr not 0 on padding"
    return "match", f"{worst:.1e}"


def digest(cases: dict) -> float:
    """A checksum of the generated inputs: the fixture replays only if they regenerate exactly."""
    total = 0.0
    for case in cases.values():
        for value in case.values():
            if isinstance(value, torch.Tensor) and value.is_floating_point():
                total += float(torch.nan_to_num(value.double(), posinf=0.0).abs().sum())
    return total


def _verl_side(inp: str, out: str) -> None:
    payload = torch.load(inp, weights_only=False)
    results = []
    for e in payload["entries"]:
        try:
            results.append(verl_outputs(e, payload["cases"][(e["case"], e["seed"])]))
        except (ValueError, AssertionError, IndexError, RuntimeError) as err:  # verl rejects the input
            results.append({"error": f"{type(err).__name__}: {str(err).splitlines()[0][:80]}"})
    torch.save(results, out)


def _setup(venv: Path) -> None:
    """A plain venv with verl 0.9.1 (--no-deps) and the packages its core_algos import needs."""
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    subprocess.run(pip + VERL_IMPORTS, check=True)
    subprocess.run(pip + ["--no-deps", VERL], check=True)


def run(venv: Path, fixture: Path) -> list[tuple[dict, str, str]]:
    items = entries()
    cases = {(e["case"], e["seed"]): _case(e["case"], e["seed"]) for e in items}
    with tempfile.TemporaryDirectory() as tmp:
        inp, out = os.path.join(tmp, "in.pt"), os.path.join(tmp, "out.pt")
        torch.save({"entries": items, "cases": cases}, inp)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        subprocess.run([str(venv / "bin" / "python"), __file__, "--verl-side", inp, out], check=True, env=env,
                       cwd=tmp)
        theirs = torch.load(out, weights_only=False)
    fixture.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"entries": items, "verl": theirs, "digest": digest(cases)}, fixture)
    return [(e, *compare(e, cases[(e["case"], e["seed"])], rlvr_outputs(e, cases[(e["case"], e["seed"])]), t))
            for e, t in zip(items, theirs)]


def table(results: list[tuple[dict, str, str]]) -> str:
    lines = []
    for family in dict.fromkeys(e["family"] for e, _, _ in results):
        lines += [f"\n{family}", "| verl function | cases | match | documented deviation | mismatch |",
                  "|---|---|---|---|---|"]
        rows = [(e, s, d) for e, s, d in results if e["family"] == family]
        for fn in dict.fromkeys(e["fn"] for e, _, _ in rows):
            mine = [(e, s, d) for e, s, d in rows if e["fn"] == fn]
            n = {k: sum(s == k for _, s, _ in mine) for k in ("match", "deviation", "mismatch")}
            lines.append(f"| {fn} | {len(mine)} | {n['match']} | {n['deviation']} | {n['mismatch']} |")
    grouped: dict[tuple[str, str], list[str]] = {}
    for e, status, detail in results:
        if status != "match":
            reason = detail.split(" (max rel err")[0]
            grouped.setdefault((f"{status}: {e['fn']}", reason), []).append(e["case"])
    lines.append("\nnot matching (function: cases -> reason):")
    lines += [f"- {fn}: {', '.join(cases) if len(cases) < len(CASES) else 'all cases'} -> {reason}"
              for (fn, reason), cases in sorted(grouped.items())]
    total = {k: sum(s == k for _, s, _ in results) for k in ("match", "deviation", "mismatch")}
    lines.append(f"\ntotal: {len(results)} comparisons, {total['match']} match, {total['deviation']} documented "
                 f"deviation, {total['mismatch']} mismatch")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--venv", type=Path, default=ROOT / ".venv-verl", help="virtual environment holding verl")
    ap.add_argument("--setup", action="store_true", help="create --venv with verl 0.9.1 first")
    ap.add_argument("--fixture", type=Path, default=FIXTURE)
    ap.add_argument("--verl-side", nargs=2, metavar=("IN", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.verl_side:
        return _verl_side(*args.verl_side)
    if args.setup:
        _setup(args.venv)
    print(table(run(args.venv, args.fixture)))


if __name__ == "__main__":
    main()
