"""The tensor batches that cross the loop's seams: `Rollouts` (engine -> trainer) and
`TrainBatch` (trainer -> update step), with the padding helpers that stack and slice them.

Shapes: B rows (B = P·G, grouped contiguously by prompt), Tp prompt and Tc completion tokens.
Prompts are left-padded, completions right-padded.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch

from rlvr.multimodal import VisionRows


@dataclass
class Rollouts:
    """B sampled completions, as an engine returns them."""

    prompt_ids: torch.Tensor       # (B, Tp) long
    prompt_mask: torch.Tensor      # (B, Tp) long, 1 on real prompt tokens
    completion_ids: torch.Tensor   # (B, Tc) long, pad after the end
    completion_mask: torch.Tensor  # (B, Tc) float, 1 on generated tokens (EOS included)
    logprobs: torch.Tensor         # (B, Tc) float, behaviour log-probs, 0 on padding
    truncated: torch.Tensor        # (B,) bool, True when max_new_tokens ended the sample
    trace: torch.Tensor | None = None  # (B, Tc) long: diffusion samplers' step at which each token was committed
    forwards: int = 0              # model forwards the engine took for this batch (a cost measure)
    # (B, Tc) long: the policy version that sampled each token, where weights can change during a call
    # (a server engine's partial rollouts); None: all from the engine's `policy_version`
    versions: torch.Tensor | None = None
    vision: VisionRows | None = None  # B rows of the prompts' image tensors (vision-language models)

    def __len__(self) -> int:
        return self.completion_ids.shape[0]

    @property
    def lengths(self) -> torch.Tensor:
        return self.completion_mask.sum(-1)

    def select(self, rows: torch.Tensor | slice) -> Rollouts:
        """The rows `rows` (an index tensor or a slice), in that order."""
        trace = None if self.trace is None else self.trace[rows]
        versions = None if self.versions is None else self.versions[rows]
        vision = None if self.vision is None else self.vision[rows]
        return Rollouts(self.prompt_ids[rows], self.prompt_mask[rows], self.completion_ids[rows],
                        self.completion_mask[rows], self.logprobs[rows], self.truncated[rows], trace, self.forwards,
                        versions=versions, vision=vision)


def left_pad(sequences: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token lists -> (ids (B, T), mask (B, T)) padded on the left."""
    width = max(len(s) for s in sequences)
    ids = torch.tensor([[pad_id] * (width - len(s)) + list(s) for s in sequences], dtype=torch.long)
    mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in sequences], dtype=torch.long)
    return ids.view(len(sequences), width), mask.view(len(sequences), width)


def _pad_to(x: torch.Tensor, width: int, value, *, left: bool) -> torch.Tensor:
    extra = width - x.shape[1]
    if extra == 0:
        return x
    pad = torch.full((x.shape[0], extra), value, dtype=x.dtype)
    return torch.cat([pad, x] if left else [x, pad], dim=1)


def concat_rollouts(parts: list[Rollouts], pad_id: int) -> Rollouts:
    """Stack rollouts of different widths: prompts re-padded on the left, completions on the right."""
    if len(parts) == 1:
        return parts[0]
    tp = max(p.prompt_ids.shape[1] for p in parts)
    tc = max(p.completion_ids.shape[1] for p in parts)
    traced = all(p.trace is not None for p in parts)
    versioned = all(p.versions is not None for p in parts)
    return Rollouts(
        prompt_ids=torch.cat([_pad_to(p.prompt_ids, tp, pad_id, left=True) for p in parts]),
        prompt_mask=torch.cat([_pad_to(p.prompt_mask, tp, 0, left=True) for p in parts]),
        completion_ids=torch.cat([_pad_to(p.completion_ids, tc, pad_id, left=False) for p in parts]),
        completion_mask=torch.cat([_pad_to(p.completion_mask, tc, 0.0, left=False) for p in parts]),
        logprobs=torch.cat([_pad_to(p.logprobs, tc, 0.0, left=False) for p in parts]),
        truncated=torch.cat([p.truncated for p in parts]),
        trace=torch.cat([_pad_to(p.trace, tc, 0, left=False) for p in parts]) if traced else None,
        forwards=sum(p.forwards for p in parts),
        versions=torch.cat([_pad_to(p.versions, tc, -1, left=False) for p in parts]) if versioned else None,
        vision=VisionRows.cat([p.vision for p in parts]) if parts[0].vision is not None else None,
    )


@dataclass
class TrainBatch:
    """Rows of completions with everything the loss needs. All (B, Tc) except the prompts.

    Estimator inputs travel here too: `trace` for the diffusion `trace` estimator; the `spg`
    estimator reads `advantages`."""

    prompt_ids: torch.Tensor         # (B, Tp)
    prompt_mask: torch.Tensor        # (B, Tp)
    completion_ids: torch.Tensor     # (B, Tc)
    completion_mask: torch.Tensor    # (B, Tc) float, 1 = trained token
    advantages: torch.Tensor         # (B, Tc)
    old_logp: torch.Tensor | None = None   # (B, Tc) policy before this update; None = on-policy (ρ ≡ 1)
    ref_logp: torch.Tensor | None = None   # (B, Tc) frozen reference, when a KL term is on
    rollout_logp: torch.Tensor | None = None  # (B, Tc) the sampler's behaviour log-probs (gap metric)
    loss_weights: torch.Tensor | None = None  # (B, Tc) detached per-token weights (rollout correction)
    trace: torch.Tensor | None = None      # (B, Tc) the diffusion sampler's commit steps
    expert: torch.Tensor | None = None     # (B,) bool: off-policy expert rows (their rollout_logp is the expert's)
    sample_weight: torch.Tensor | None = None  # (B,) detached per-row loss weights (the on-policy/expert mix)
    ref_logsumexp: torch.Tensor | None = None  # (B, Tc) the reference's logsumexp of its logits (ShiQ)
    token_rewards: torch.Tensor | None = None  # (B, Tc) each row's reward on its last token, NaN = unscorable (ShiQ)
    old_draws: torch.Tensor | None = None  # (B, n) the old policy's per-draw likelihood estimates (BGPO)
    vision: VisionRows | None = None       # B rows of the prompts' image tensors (vision-language models)

    def __len__(self) -> int:
        return self.completion_ids.shape[0]

    def to(self, device: torch.device) -> TrainBatch:
        """The batch on `device` (itself when already there)."""
        if self.completion_ids.device == device:
            return self
        return replace(self, **{f.name: None if getattr(self, f.name) is None else getattr(self, f.name).to(device)
                                for f in fields(self)})

    def select(self, rows: slice | torch.Tensor) -> TrainBatch:
        return replace(self, **{f.name: None if getattr(self, f.name) is None else getattr(self, f.name)[rows]
                                for f in fields(self)})


_PROMPT_FIELDS = ("prompt_ids", "prompt_mask")


def concat_train_batches(parts: list[TrainBatch], pad_id: int) -> TrainBatch:
    """Stack batches row-wise: prompts re-padded on the left, completions on the right. A field
    must be set in every part or in none (ValueError otherwise)."""
    tp = max(p.prompt_ids.shape[1] for p in parts)
    tc = max(p.completion_ids.shape[1] for p in parts)
    values = {}
    for f in fields(TrainBatch):
        got = [getattr(p, f.name) for p in parts]
        if all(g is None for g in got):
            values[f.name] = None
            continue
        if any(g is None for g in got):
            raise ValueError(f"concat_train_batches: field {f.name!r} is set in some parts only")
        if f.name == "vision":
            values[f.name] = VisionRows.cat(got)
        elif got[0].dim() == 1 or f.name == "old_draws":  # per row, or per row and draw: no token axis
            values[f.name] = torch.cat(got)
        elif f.name in _PROMPT_FIELDS:
            pad = pad_id if f.name == "prompt_ids" else 0
            values[f.name] = torch.cat([_pad_to(g, tp, pad, left=True) for g in got])
        else:
            values[f.name] = torch.cat([_pad_to(g, tc, pad_id if f.name == "completion_ids" else 0, left=False)
                                        for g in got])
    return TrainBatch(**values)
