"""Critic for PPO/GAE: a copy of the policy's transformer body with a scalar value head.

V_t is read at the state *before* completion token t (the position that predicts it), so
values line up with the (B, Tc) completion tensors the rest of the loop uses.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from rlvr.models import packing
from rlvr.models.policy import sequence_inputs


class ValueModel(nn.Module):
    def __init__(self, causal_lm):
        super().__init__()
        self.body = copy.deepcopy(causal_lm.base_model)
        # float32 on the body's device whatever the body's dtype: a bf16 body's hidden states are
        # cast up, so the value regression keeps full precision.
        self.head = nn.Linear(causal_lm.config.hidden_size, 1, device=next(self.body.parameters()).device)
        nn.init.zeros_(self.head.weight)  # start at V = bias = 0: no prior on returns
        nn.init.zeros_(self.head.bias)

    packing: str | None = None
    """`packed` / `shared`: the padding-free forward (`models.packing`; set by the builder with
    `use_packing` after the policy's model passed the probe), None: the padded one."""

    def use_packing(self, mode: str) -> None:
        packing.use_packed_attention(self.body)
        self.packing = mode

    def forward(self, prompt_ids, prompt_mask, completion_ids, completion_mask=None) -> torch.Tensor:
        """(B, Tc) state values before each completion token (the module's forward, so that a
        critic sharded with FSDP2 gathers its root's weights, the embeddings and the head, for it).
        With `packing`, positions after a row's last 1 of `completion_mask` are 0, not computed."""
        if self.packing:
            tc = completion_ids.shape[1]
            lengths = (torch.full(completion_ids.shape[:1], tc) if completion_mask is None
                       else torch.where(completion_mask != 0, torch.arange(tc) + 1, 0).max(-1).values)
            hidden, index = packing.packed_hidden(self.body, prompt_ids, prompt_mask, completion_ids, lengths,
                                                  share=self.packing == "shared")
            values = self.head(hidden.float()).squeeze(-1)
            return values.new_zeros(completion_ids.numel()).index_copy(0, index, values).view(completion_ids.shape)
        ids, attention, positions = sequence_inputs(prompt_ids, prompt_mask, completion_ids)
        hidden = self.body(input_ids=ids, attention_mask=attention, position_ids=positions,
                           use_cache=False).last_hidden_state
        start = prompt_ids.shape[1] - 1
        return self.head(hidden[:, start:start + completion_ids.shape[1]].float()).squeeze(-1)
