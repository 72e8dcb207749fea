"""Masked-diffusion SFT: the 1/t-weighted ELBO on the response window (LLaDA SFT recipe).

Choices:
1. Response-only masking: the prompt is never corrupted and never a target.
2. The response is the solution + EOS, then EOS padding up to the fixed window `gen_length`, and
   every position of the window, padding included, is a target: the model learns to "generate"
   padding, which is how a fixed-length sampler ends answers early (LLaDA; d1 SFT does the same).
3. Per row t = (1 − ε)u + ε, u ~ U(0, 1), ε = 1e-3 (t clamped away from 0); each window position
   is masked independently with probability t; loss = Σ_masked CE / t, divided by the window
   length (LLaDA divides by the answer length incl. EOS padding, which here is the window), then
   averaged over rows.
4. Dream-style shifted logits need nothing here: `DiffusionLM` aligns logits to positions.
"""

from __future__ import annotations

import random

import torch
import torch.nn.functional as F


def encode_windows(tokenizer, completions: list[str], gen_length: int) -> torch.Tensor:
    """Completions + EOS padded with EOS to `gen_length`: (B, gen_length) long. Raises if too long."""
    eos = tokenizer.eos_token_id
    rows = []
    for text in completions:
        ids = tokenizer(text, add_special_tokens=False).input_ids + [eos]
        if len(ids) > gen_length:
            raise ValueError(f"completion {text!r} needs {len(ids)} tokens with EOS, over gen_length={gen_length}")
        rows.append(ids + [eos] * (gen_length - len(ids)))
    return torch.tensor(rows, dtype=torch.long)


def masked_diffusion_loss(model, prompt_ids, prompt_mask, window_ids, *, mask_id: int, eps: float = 1e-3,
                          generator: torch.Generator | None = None) -> torch.Tensor:
    """Scalar ELBO loss. prompt_ids/prompt_mask (B, Tp) left-padded; window_ids (B, L)."""
    batch, length = window_ids.shape
    t = (1 - eps) * torch.rand(batch, 1, generator=generator) + eps  # (B, 1)
    masked = torch.rand(batch, length, generator=generator) < t  # (B, L)
    noisy = torch.where(masked, torch.full_like(window_ids, mask_id), window_ids)
    ids = torch.cat([prompt_ids, noisy], dim=1)
    attention = torch.cat([prompt_mask, torch.ones_like(window_ids)], dim=1)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    logits = model(ids, attention, positions)[:, prompt_ids.shape[1]:].float()  # (B, L, V)
    ce = F.cross_entropy(logits.transpose(1, 2), window_ids, reduction="none")  # (B, L)
    return ((ce * masked / t).sum(-1) / length).mean()


def diffusion_sft(model, tokenizer, task, *, steps: int, batch_size: int, lr: float, gen_length: int,
                  seed: int = 0, warmup_steps: int = 20, schedule: str = "constant", echo=print,
                  loss_fn=masked_diffusion_loss) -> list[float]:
    """Train `model` on `task.solution` windows; returns the loss per step. Plain arguments, no
    config: the trainer's builder reads the config and calls this. `loss_fn`: the ELBO loss with
    `masked_diffusion_loss`'s signature (block models: `block_diffusion.block_diffusion_loss`)."""
    from rlvr.builder.build import build_optimizer
    from rlvr.codec import encode_prompts

    rng = random.Random(seed)
    generator = torch.Generator().manual_seed(seed)
    optimizer, scheduler = build_optimizer(model.parameters(), lr=lr, warmup_steps=warmup_steps, total_steps=steps,
                                           schedule=schedule)
    model.train()
    losses = []
    for step in range(1, steps + 1):
        examples = task.sample(batch_size, rng)
        prompt_ids, prompt_mask = encode_prompts(tokenizer, [e.prompt for e in examples])
        windows = encode_windows(tokenizer, [task.solution(e) for e in examples], gen_length)
        loss = loss_fn(model, prompt_ids, prompt_mask, windows, mask_id=model.config.mask_token_id,
                                     generator=generator)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
        if step % 100 == 0 or step == steps:
            echo(f"diffusion sft step {step}/{steps} loss={loss.item():.4f}")
    return losses


__all__ = ["diffusion_sft", "encode_windows", "masked_diffusion_loss"]
