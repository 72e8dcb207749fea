"""GRPO on Countdown in one readable file: the whole algorithm, start to finish.

Read this first. It is the loop of `rlvr.trainer.sync` without the run directory, resume,
registries or metrics plumbing, using the library's math (advantages, PPO-clip objective,
aggregation) and components (tokenizer, tiny Llama, KV-cache sampler, Countdown verifier).

    python examples/grpo_minimal.py --steps 200            # from the shipped warm start
    python examples/grpo_minimal.py --from-scratch --steps 50   # no warm start (smoke test)

One step of GRPO:
  1. sample P prompts, G completions each (B = P·G) from the current policy;
  2. score every completion with the verifier (1.0 right, 0.1 well-formed, 0.0 otherwise);
  3. advantage A_i = (R_i − mean_group) / (std_group + eps), copied to every token of i;
  4. loss = PPO-clip surrogate per token, averaged per sequence then over sequences;
  5. one AdamW step (with gradient clipping).
"""

from __future__ import annotations

import argparse
import random
import time

import torch

from rlvr.algos.advantages import AdvantageInputs, grpo
from rlvr.algos.aggregate import seq_mean_token_mean
from rlvr.algos.objectives import ppo_clip
from rlvr.batch import left_pad
from rlvr.engines.torch_ar import generate
from rlvr.models.causal_lm import load_causal_lm
from rlvr.models.policy import CausalPolicy
from rlvr.tasks.countdown import Countdown

WARM_START = "rlvr:countdown-warmstart"


# ---------------------------------------------------------------------------------------------
# Text <-> tensors
# ---------------------------------------------------------------------------------------------
def encode(tokenizer, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts -> BOS + characters, left-padded so every prompt ends at the same column."""
    ids = [[tokenizer.bos_token_id] + tokenizer(p, add_special_tokens=False).input_ids for p in prompts]
    return left_pad(ids, tokenizer.pad_token_id)  # (B, Tp), (B, Tp)


def decode(tokenizer, completion_ids: torch.Tensor, lengths: torch.Tensor) -> list[str]:
    return [tokenizer.decode(row[:n], skip_special_tokens=True)
            for row, n in zip(completion_ids.tolist(), lengths.long().tolist())]


# ---------------------------------------------------------------------------------------------
# Evaluation: greedy decoding on the fixed held-out set
# ---------------------------------------------------------------------------------------------
def heldout_accuracy(model, tokenizer, task: Countdown, max_new_tokens: int) -> float:
    examples = task.heldout()
    ids, mask = encode(tokenizer, [e.prompt for e in examples])
    out = generate(model, ids, mask, torch.zeros(len(examples), dtype=torch.long), max_new_tokens=max_new_tokens,
                   eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id, temperature=0.0)
    texts = decode(tokenizer, out.completion_ids, out.lengths)
    return sum(task.is_correct(t, e) for t, e in zip(texts, examples)) / len(examples)


# ---------------------------------------------------------------------------------------------
# One GRPO step
# ---------------------------------------------------------------------------------------------
def grpo_step(model, tokenizer, task, optimizer, rng: random.Random, step: int, args) -> dict[str, float]:
    P, G = args.prompts, args.group
    # 1. Rollouts: each prompt repeated G times; row p*G+j is completion j of prompt p.
    examples = task.sample(P, rng)
    group = [e for e in examples for _ in range(G)]
    prompt_ids, prompt_mask = encode(tokenizer, [e.prompt for e in group])
    seeds = torch.arange(len(group)) + step * len(group) + args.seed * 10_000_000
    out = generate(model, prompt_ids, prompt_mask, seeds, max_new_tokens=args.max_new_tokens,
                   eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id, temperature=args.temperature)
    mask = out.completion_mask  # (B, Tc): 1 on generated tokens, EOS included

    # 2. Verifier: a pure function of (prompt, completion, example fields).
    texts = decode(tokenizer, out.completion_ids, out.lengths)
    rewards = torch.tensor([task.reward(e.prompt, t, answer=e.answer, meta=e.meta) for e, t in zip(group, texts)])

    # 3. Group-normalised advantages, broadcast to tokens: (B, Tc).
    advantages, _ = grpo(AdvantageInputs(rewards=rewards, group_size=G, response_mask=mask))

    # 4. Policy loss. One update per batch, so the "old" policy is the current one (ratio = 1 in
    #    value, but its gradient is the policy gradient -A ∇log π).
    policy = CausalPolicy(model, temperature=args.temperature)
    logp, _ = policy.token_logprobs(prompt_ids, prompt_mask, out.completion_ids)  # (B, Tc)
    loss_tok, tok_metrics = ppo_clip(logp, logp.detach(), advantages, mask, clip_low=0.2, clip_high=0.28)
    num_seqs = float((mask.sum(-1) > 0).sum())
    loss = seq_mean_token_mean(loss_tok, mask, num_tokens=float(mask.sum()), num_seqs=num_seqs)

    # 5. Optimizer step.
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    correct = sum(task.is_correct(t, e) for t, e in zip(texts, group)) / len(group)
    return {"loss": loss.item(), "reward": rewards.mean().item(), "accuracy": correct,
            "length": out.lengths.float().mean().item()}


# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> dict[str, float]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--prompts", type=int, default=8, help="P: prompts per step")
    p.add_argument("--group", type=int, default=8, help="G: completions per prompt")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--from-scratch", action="store_true", help="random tiny model instead of the warm start")
    args = p.parse_args(argv)

    torch.manual_seed(args.seed)
    size = dict(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128, max_seq_len=64)
    model, tokenizer = load_causal_lm(None if args.from_scratch else WARM_START, seed=args.seed, **size)
    task = Countdown(ordered=True)  # the shipped warm start was trained on ordered prompts
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.99))
    warmup = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: min(1.0, (i + 1) / args.warmup))
    rng = random.Random(args.seed)

    start_acc = heldout_accuracy(model, tokenizer, task, args.max_new_tokens)
    print(f"step 0: held-out greedy accuracy {start_acc:.3f}")
    t0, last = time.perf_counter(), {}
    for step in range(1, args.steps + 1):
        last = grpo_step(model, tokenizer, task, optimizer, rng, step, args)
        warmup.step()
        if step % args.eval_every == 0 or step == args.steps:
            acc = heldout_accuracy(model, tokenizer, task, args.max_new_tokens)
            last["heldout_accuracy"] = acc
            print(f"step {step}: reward {last['reward']:.3f}  sample accuracy {last['accuracy']:.3f}  "
                  f"held-out {acc:.3f}  ({time.perf_counter() - t0:.0f}s)")
    return {"start_heldout_accuracy": start_acc, **last}


if __name__ == "__main__":
    main()
