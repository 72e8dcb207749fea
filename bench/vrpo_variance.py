"""VRPO's variance reduction, measured: the DPO margin, loss and gradient of ELBO estimates under
VRPO's sampling against a plain ELBO estimate, at the same number of forwards.

    python bench/vrpo_variance.py                  # n ∈ {1, 2, 4}, 200 seeds, 16 pairs (about 20 min, one thread)
    python bench/vrpo_variance.py --ns 2 --seeds 50

Setting: the packaged Countdown dLLM warm start (`rlvr:countdown-dllm-warmstart`) is the reference;
the policy is the same model after `--shift-steps` DPO steps (VRPO, lr 1e-4, β 0.1) on pairs made
from the verifier, so policy ≠ reference (at policy = reference VRPO's margin is exactly 0, which
says nothing). A fixed batch of held-out pairs is scored under 200 mask seeds by three estimators,
each with n forwards per completion for the policy and n for the reference:

- ``plain``: n ELBO draws, each with its own t ~ U and mask (no stratification), the reference's
  draws independent of the policy's;
- ``shared``: the same draws, the reference using the policy's t and masks (VRPO's common random
  numbers only);
- ``vrpo``: what `rlvr dpo` computes on a diffusion model: `elbo_mc` (n timesteps stratified over
  the draws, one mask each) with the policy's and the reference's masks shared (`begin_step`).

For each: the variance over seeds of the batch-mean margin β·[(B̂θ(y_w) − B̂ref(y_w)) − (B̂θ(y_l) −
B̂ref(y_l))], of the DPO loss, of the policy-gradient norm, and the gradient's total variance
tr Cov(∇θ loss). Ratios are plain / estimator (> 1: lower variance than plain), with a 95%
bootstrap interval over seeds (tr Cov: the point ratio). Means are reported too: all three are
unbiased for the same ELBO margin, so their means agree within noise.
"""

from __future__ import annotations

import argparse
import copy
import random

import torch

from rlvr.algos.preference import dpo_loss
from rlvr.builder import build
from rlvr.config import load_config
from rlvr.models.likelihood import elbo_draw
from rlvr.preference.dpo import pair_batch, sequence_logprobs
from rlvr.preference.run import split_pairs

ESTIMATORS = ("plain", "shared", "vrpo")
OVERRIDES = ["model.kind=diffusion", "model.path=rlvr:countdown-dllm-warmstart", "rollout.max_new_tokens=16",
             "rollout.diffusion_steps=16", "rollout.block_length=8", "estimator.name=elbo_mc",
             "estimator.antithetic=false", "trainer.threads=1", "preference.pairs=128", "preference.heldout_pairs=64"]
REFERENCE_SALT = 7_919  # the plain estimator's reference draws: a disjoint seed stream


def iid_elbo(policy, batch, *, n: int, mask_seed: int) -> torch.Tensor:
    """(2B,) mean of n ELBO draws with independent t and masks (no stratification)."""
    ctx = policy.corruption_context(batch.prompt_ids, batch.prompt_mask, batch.completion_ids, mask_seed)
    total = 0.0
    for j in range(n):
        ((mask, weight),) = elbo_draw(ctx, 0, 1, antithetic=False, salt=j + 1)  # n = 1: t ~ U{1..L} alone
        ell, _ = ctx.denoise(mask)
        total = total + weight.float() * torch.where(mask, ell, torch.zeros_like(ell)).sum(-1)
    return total / n


def estimates(kind: str, policy, reference, batch, *, n: int, seed: int):
    """(policy (2B,) with graph, reference (2B,)) sequence ELBO estimates under estimator `kind`."""
    if kind == "vrpo":
        policy.estimator_kwargs["n"] = reference.estimator_kwargs["n"] = n
        policy.begin_step(seed)
        reference.begin_step(seed)
        with torch.no_grad():
            ref = sequence_logprobs(reference, batch)
        return sequence_logprobs(policy, batch), ref
    ref_seed = seed if kind == "shared" else seed * REFERENCE_SALT + 1
    with torch.no_grad():
        ref = iid_elbo(reference, batch, n=n, mask_seed=ref_seed)
    return iid_elbo(policy, batch, n=n, mask_seed=seed), ref


def draw(kind: str, policy, reference, batch, *, n: int, seed: int, beta: float):
    """One seed: (margin, loss, grad norm, flat gradient)."""
    pol, ref = estimates(kind, policy, reference, batch, n=n, seed=seed)
    b = len(batch) // 2
    loss, metrics = dpo_loss(pol[:b], ref[:b], pol[b:], ref[b:], beta=beta)
    params = [p for p in policy.model.parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, params)
    flat = torch.cat([g.reshape(-1) for g in grads])
    return metrics["margin"], float(loss.detach()), float(flat.norm()), flat


def setup(*, pairs: int = 16, shift_steps: int = 10, seed: int = 0, beta: float = 0.1):
    """(policy, reference, held-out batch): the warm start as the reference, the policy shifted by
    `shift_steps` VRPO steps (n = 2) on verifier pairs."""
    torch.manual_seed(seed)
    config = load_config(None, [*OVERRIDES, f"seed={seed}", "estimator.n=2"])
    model, tokenizer = build.build_model(config)
    task = build.build_task(config, tokenizer)
    train, heldout = split_pairs(config, task)
    reference_model = copy.deepcopy(model).eval().requires_grad_(False)
    policy, reference = build.build_policy(config, model), build.build_policy(config, reference_model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    rng = random.Random(seed)
    for step in range(shift_steps):
        batch = pair_batch(tokenizer, rng.sample(train, 16))
        pol, ref = estimates("vrpo", policy, reference, batch, n=2, seed=10_000 + step)
        loss, _ = dpo_loss(pol[:16], ref[:16], pol[16:], ref[16:], beta=beta)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return policy, reference, pair_batch(tokenizer, heldout[:pairs])


def measure(policy, reference, batch, *, n: int, seeds: int, beta: float = 0.1) -> dict:
    """{kind: {"margin": (S,), "loss": (S,), "grad_norm": (S,), "grad_tr_cov": float}}."""
    out = {}
    for kind in ESTIMATORS:
        rows, total, sq = [], 0.0, 0.0
        for s in range(seeds):
            margin, loss, gnorm, flat = draw(kind, policy, reference, batch, n=n, seed=s, beta=beta)
            rows.append((margin, loss, gnorm))
            total, sq = total + flat, sq + float(flat.pow(2).sum())
        values = torch.tensor(rows, dtype=torch.float64)
        tr_cov = sq / seeds - float((total / seeds).double().pow(2).sum())
        out[kind] = {"margin": values[:, 0], "loss": values[:, 1], "grad_norm": values[:, 2], "grad_tr_cov": tr_cov}
    return out


def variance_ratio(plain: torch.Tensor, other: torch.Tensor, *, boot: int = 2000, seed: int = 0):
    """(Var plain / Var other, 95% bootstrap interval over seeds)."""
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, len(plain), (boot, len(plain)), generator=g)
    ratios = plain[idx].var(-1) / other[idx].var(-1).clamp(min=1e-30)
    lo, hi = ratios.quantile(torch.tensor([0.025, 0.975], dtype=ratios.dtype)).tolist()
    return float(plain.var() / other.var().clamp(min=1e-30)), lo, hi


def _mean_ci(x: torch.Tensor) -> str:
    return f"{float(x.mean()):.4f} ± {1.96 * float(x.std()) / len(x) ** 0.5:.4f}"


def table(results: dict) -> str:
    lines = ["| n | estimator | mean margin | Var margin | ratio margin | ratio loss | ratio grad norm | "
             "ratio tr Cov(grad) |", "|---|---|---|---|---|---|---|---|"]
    for n, res in results.items():
        plain = res["plain"]
        for kind in ESTIMATORS:
            r = res[kind]
            cells = [f"{n}", kind, _mean_ci(r["margin"]), f"{float(r['margin'].var()):.3g}"]
            for key in ("margin", "loss", "grad_norm"):
                ratio, lo, hi = variance_ratio(plain[key], r[key])
                cells.append(f"{ratio:.2f} [{lo:.2f}, {hi:.2f}]")
            cells.append(f"{plain['grad_tr_cov'] / max(r['grad_tr_cov'], 1e-30):.2f}")
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ns", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--seeds", type=int, default=200)
    parser.add_argument("--pairs", type=int, default=16)
    parser.add_argument("--shift-steps", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(1)
    policy, reference, batch = setup(pairs=args.pairs, shift_steps=args.shift_steps)
    results = {n: measure(policy, reference, batch, n=n, seeds=args.seeds) for n in args.ns}
    print(table(results))


if __name__ == "__main__":
    main()
