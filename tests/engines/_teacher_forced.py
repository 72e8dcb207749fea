"""The reference the vLLM server tests compare with: a plain `transformers` forward."""

from __future__ import annotations

import torch


@torch.no_grad()
def teacher_forced(model, out, temperature: float = 1.0) -> torch.Tensor:
    """log-softmax(logits / T) of each completion token of `out` (a `Rollouts`) under `model`, (B, Tc), 0 on padding."""
    rows = []
    for i in range(len(out)):
        prompt = out.prompt_ids[i][out.prompt_mask[i].bool()]
        n = int(out.completion_mask[i].sum())
        ids = torch.cat([prompt, out.completion_ids[i, :n]])[None]
        logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1].float() / temperature
        logp = logits.log_softmax(-1).gather(-1, ids[0, len(prompt):, None]).squeeze(-1)
        rows.append(torch.cat([logp, torch.zeros(out.completion_ids.shape[1] - n)]))
    return torch.stack(rows)
