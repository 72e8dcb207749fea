"""PolicyModel for vision-language models: log-probs of completion tokens given prompts with images.

The same question `CausalPolicy` answers, with the batch's `VisionRows` in the forward: prompt
ids hold each image's expanded placeholders, the processor's tensors go in beside them, and only
the completion positions are scored, so image and prompt tokens never enter the loss. The image
placeholder id is masked out of the logits (set to -1e9) here as in the sampler
(`engines.torch_vlm`): a sampled placeholder would break the next forward, and masking it on one
side only would renormalise the other's log-probs by log(1 - p_image).
"""

from __future__ import annotations

import torch

from rlvr.models.policy import head_outputs, sequence_inputs


def mask_image_token(logits: torch.Tensor, image_id: int) -> torch.Tensor:
    """`logits` (..., V) with the image placeholder's logit at -1e9: probability 0 in float32, yet
    finite, so the entropy's p·log p stays 0 there (vLLM's `logit_bias` masks it the same way)."""
    return logits.index_fill(-1, torch.tensor([image_id], device=logits.device), MASKED_LOGIT)


MASKED_LOGIT = -1e9


class VisionPolicy:
    """Wraps an image-text-to-text model (plain `transformers` forward); temperature as the sampler's."""

    exact_logprobs = True

    def __init__(self, model, *, image_id: int, temperature: float = 1.0):
        self.model = model
        self.image_id = image_id
        self.temperature = temperature if temperature > 0 else 1.0
        self.forwards = 0
        model.register_forward_hook(self._count_forward)

    def _count_forward(self, module, args, output) -> None:
        self.forwards += 1

    def parameters(self):
        return self.model.parameters()

    def begin_step(self, seed: int) -> None:
        """Exact log-probs draw no random masks: nothing to seed."""

    def batch_logprobs(self, batch, *, with_entropy: bool = False):
        logp, entropy, _ = self.batch_token_stats(batch, with_entropy=with_entropy)
        return logp, entropy

    def batch_token_stats(self, batch, *, with_entropy: bool = False, stats: tuple[str, ...] = ()):
        """(log-probs (B, Tc), entropy (B, Tc) or None, {stat: (B, Tc)}) of `batch.completion_ids`
        given its prompts and `batch.vision`; 0 on completion padding."""
        embed = self.model.get_input_embeddings().weight
        batch = batch.to(embed.device)
        ids, attention, positions = sequence_inputs(batch.prompt_ids, batch.prompt_mask, batch.completion_ids)
        width = batch.completion_ids.shape[1]
        out = self.model(input_ids=ids, attention_mask=attention, position_ids=positions, use_cache=False,
                         logits_to_keep=width + 1, **batch.vision.forward_kwargs(embed.dtype))
        logits = mask_image_token(out.logits[:, :-1].float() / self.temperature, self.image_id)  # (B, Tc, V)
        logp, entropy, extra = head_outputs(logits, batch.completion_ids, with_entropy=with_entropy, stats=stats)
        keep = (batch.completion_mask != 0).float().flip(-1).cummax(-1).values.flip(-1)  # up to each row's last token
        entropy = None if entropy is None else entropy * keep
        return logp * keep, entropy, {k: v * keep for k, v in extra.items()}
