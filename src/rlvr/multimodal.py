"""Images beside token rows: `VisionRows`, the processor's image tensors of each batch row.

A vision-language model's forward takes, beside the token ids, tensors the processor made from
the row's images (Idefics3/SmolVLM: `pixel_values` (1, n_images, 3, H, W) and
`pixel_attention_mask`; LLaVA: `pixel_values` (n_images, 3, H, W)). They are kept per row, as verl
does (`extract_multi_modal_inputs` concatenates per-sample tensors on dim 0), so that every
operation on rows (select a minibatch, split into micro-batches, stack rounds) applies to them
as it does to the ids: `VisionRows[rows]`, `VisionRows.cat`. The G rows of one prompt share
one set of tensors (nothing is copied per completion).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch


class VisionRows:
    """B rows, each a {name: tensor} of its images' processor outputs (dim 0 stacks rows)."""

    def __init__(self, rows: list[Mapping[str, torch.Tensor]]):
        self.rows = list(rows)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: slice | torch.Tensor | list[int]) -> VisionRows:
        if isinstance(index, slice):
            return VisionRows(self.rows[index])
        if isinstance(index, torch.Tensor) and index.dtype == torch.bool:
            index = index.nonzero().flatten()
        return VisionRows([self.rows[int(i)] for i in index])

    def to(self, device: torch.device) -> VisionRows:
        return VisionRows([{k: v.to(device) for k, v in row.items()} for row in self.rows])

    @staticmethod
    def cat(parts: list[VisionRows]) -> VisionRows:
        return VisionRows([row for part in parts for row in part.rows])

    def forward_kwargs(self, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
        """The model's image keywords for these rows: each name's tensors concatenated on dim 0;
        floating tensors (pixel values) cast to `dtype` (the weights') when given."""
        if not self.rows:
            return {}
        out = {}
        for name in self.rows[0]:
            value = torch.cat([row[name] for row in self.rows])
            out[name] = value.to(dtype) if dtype is not None and value.is_floating_point() else value
        return out
