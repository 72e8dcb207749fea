"""PBPO's claim: token-local ratios give lower gradient variance than block-product ratios.

    python bench/dllm_pbpo.py                 # seeds 0 1 2, drift scales 0.01 0.03 0.1
    python bench/dllm_pbpo.py --seeds 0 --prompts 4

From the PBPO recipe's warm start: sample P prompts × G completions, score them, take group
z-scored advantages, record the old prefix-block token values, then move the weights (each
parameter plus `scale` × its own std × N(0, 1), a stand-in for the drift of repeated updates) and
take each row's gradient of its token-mean clipped surrogate under the two weightings, both on
the same prefix-block values: token-local (`ppo_clip`, PBPO) and block-product
(`block_product_ppo`, one ratio per block of `estimator.block_length` tokens). Reported: the
spread of the per-row gradients, mean_i ||g_i − ḡ||² over rows with a nonzero advantage, and
the ratio block / token, mean ± 95% CI over seeds.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics

import torch
from _sweep import REPO

from rlvr.algos.dllm_objectives import block_product_ppo
from rlvr.algos.objectives import ppo_clip
from rlvr.builder import build
from rlvr.codec import decode_completions, encode_prompts
from rlvr.config import load_config
from rlvr.trainer.scoring import score

RECIPE = REPO / "recipes" / "dllm_pbpo_countdown.yaml"


def _row_grad_spread(policy, params, batch, old, adv, objective) -> float:
    grads = []
    prompt_ids, prompt_mask, ids, mask = batch
    for i in torch.nonzero(adv[:, 0] != 0).flatten().tolist():
        rows = slice(i, i + 1)
        logp, _ = policy.token_logprobs(prompt_ids[rows], prompt_mask[rows], ids[rows])
        loss, _ = objective(logp, old[rows], adv[rows], mask[rows])
        loss = loss.sum() / mask[rows].sum()
        grads.append(torch.cat([g.flatten() for g in torch.autograd.grad(loss, params)]))
    stacked = torch.stack(grads)
    return float(((stacked - stacked.mean(0)) ** 2).sum(-1).mean())


def measure(seed: int, scales: list[float], prompts: int) -> dict[float, tuple[float, float]]:
    cfg = load_config(RECIPE, [f"seed={seed}"])
    torch.manual_seed(seed)
    model, tokenizer = build.build_model(cfg)
    task, engine = build.build_task(cfg, tokenizer), build.build_engine(cfg, model, tokenizer)
    policy, reward = build.build_policy(cfg, model), build.build_reward(cfg, task)
    group = cfg.rollout.group_size
    examples = [ex for ex in task.sample(prompts, random.Random(seed)) for _ in range(group)]
    prompt_ids, prompt_mask = encode_prompts(tokenizer, [ex.prompt for ex in examples])
    seeds = torch.arange(len(examples)) + 1000 * seed
    out = engine(prompt_ids, prompt_mask, seeds, temperature=cfg.rollout.temperature)
    rewards, _, _ = score(reward, task, examples, decode_completions(tokenizer, out))
    r = torch.nan_to_num(rewards, nan=0.0).view(-1, group)
    adv = ((r - r.mean(-1, keepdim=True)) / (r.std(-1, keepdim=True) + 1e-4)).flatten()[:, None] * out.completion_mask
    batch = (prompt_ids, prompt_mask, out.completion_ids, out.completion_mask)
    policy.begin_step(seed)
    with torch.no_grad():
        old, _ = policy.token_logprobs(prompt_ids, prompt_mask, out.completion_ids)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    params = [p for p in model.parameters() if p.requires_grad]
    block, clip = cfg.estimator.block_length, (cfg.algo.clip_low, cfg.algo.clip_high)
    token = lambda *a: ppo_clip(*a, clip_low=clip[0], clip_high=clip[1])  # noqa: E731
    product = lambda *a: block_product_ppo(*a, block_length=block, clip_low=clip[0], clip_high=clip[1])  # noqa: E731
    result = {}
    for scale in scales:
        gen = torch.Generator().manual_seed(seed * 7919 + int(scale * 1e6))
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(start[name] + scale * start[name].std() * torch.randn(p.shape, generator=gen))
        result[scale] = (_row_grad_spread(policy, params, batch, old, adv, token),
                         _row_grad_spread(policy, params, batch, old, adv, product))
    return result


def _ci(xs: list[float]) -> str:
    mean = statistics.mean(xs)
    if len(xs) < 2:
        return f"{mean:.3g}"
    t = {2: 12.706, 3: 4.303, 4: 3.182, 5: 2.776}.get(len(xs), 1.96)
    return f"{mean:.3g} ± {t * statistics.stdev(xs) / math.sqrt(len(xs)):.2g}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--scales", type=float, nargs="+", default=[0.01, 0.03, 0.1])
    p.add_argument("--prompts", type=int, default=8)
    args = p.parse_args()
    torch.set_num_threads(1)
    runs = [measure(s, args.scales, args.prompts) for s in args.seeds]
    print("| drift scale | token-local spread | block-product spread | block / token |\n|---|---|---|---|")
    for scale in args.scales:
        tok, prod = [r[scale][0] for r in runs], [r[scale][1] for r in runs]
        print(f"| {scale} | {_ci(tok)} | {_ci(prod)} | {_ci([b / t for b, t in zip(prod, tok)])} |")


if __name__ == "__main__":
    main()
