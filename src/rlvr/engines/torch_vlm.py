"""The torch sampler for vision-language models: prefill with the prompts' images, then decode.

`transformers` forward with its dynamic cache; the images are encoded once, in the prefill (the
decode steps read the cached keys and values). Token choice is `torch_ar.choose_tokens` (per-row
seeded Gumbel-max), after the image placeholder's logit is masked, as the trainer's
log-probs do (`models.vlm_policy`). 1-D positions (cumsum of the mask), as `SUPPORTED_FAMILIES`
in `models.vlm` require.
"""

from __future__ import annotations

import torch

from rlvr.batch import Rollouts
from rlvr.engines.torch_ar import choose_tokens
from rlvr.models.vlm_policy import mask_image_token
from rlvr.multimodal import VisionRows


@torch.no_grad()
def generate_vlm(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, seeds: torch.Tensor, *,
                 vision: VisionRows, image_id: int, max_new_tokens: int, eos_id: int, pad_id: int,
                 temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0, min_p: float = 0.0) -> Rollouts:
    """One completion per row of (B, Tp) prompts with their `vision` rows; seeds (B,) long."""
    if isinstance(temperature, torch.Tensor):
        raise ValueError("generate_vlm: one temperature per batch (rollout.greedy_in_group is off for VLMs)")
    was_training = model.training
    model.eval()
    try:
        return _sample(model, prompt_ids, prompt_mask, seeds, vision, image_id, max_new_tokens, eos_id, pad_id,
                       dict(temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p))
    finally:
        model.train(was_training)


def _sample(model, prompt_ids, prompt_mask, seeds, vision, image_id, max_new_tokens, eos_id, pad_id, options):
    embed = model.get_input_embeddings().weight
    host, device = prompt_ids.device, embed.device
    batch = prompt_ids.shape[0]
    attention = prompt_mask.to(device)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=prompt_ids.to(device), attention_mask=attention, position_ids=positions, use_cache=True,
                **vision.to(device).forward_kwargs(embed.dtype))
    cache, logits = out.past_key_values, out.logits[:, -1]
    next_pos = positions[:, -1:] + 1
    tokens = torch.full((batch, max_new_tokens), pad_id, dtype=torch.long)
    logprobs = torch.zeros((batch, max_new_tokens))
    done = torch.zeros(batch, dtype=torch.bool)
    length = torch.zeros(batch, dtype=torch.long)
    for step in range(max_new_tokens):
        tok, logp = choose_tokens(mask_image_token(logits.float(), image_id).cpu(), seeds, step, **options)
        tok = tok.masked_fill(done, pad_id)
        tokens[:, step] = tok
        logprobs[:, step] = logp.masked_fill(done, 0.0)
        length += (~done).long()
        done |= tok == eos_id
        if bool(done.all()) or step == max_new_tokens - 1:
            break
        attention = torch.cat([attention, attention.new_ones((batch, 1))], dim=-1)
        out = model(input_ids=tok[:, None].to(device), attention_mask=attention, position_ids=next_pos,
                    past_key_values=cache, use_cache=True)
        cache, logits = out.past_key_values, out.logits[:, -1]
        next_pos = next_pos + 1
    width = int(length.max()) if batch else 0
    mask = (torch.arange(width)[None, :] < length[:, None]).float()
    return Rollouts(prompt_ids.to(host), prompt_mask.to(host), tokens[:, :width], mask, logprobs[:, :width], ~done,
                    vision=vision)
