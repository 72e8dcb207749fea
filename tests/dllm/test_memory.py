"""Peak autograd memory: bgpo flat in the number of MC draws, elbo_mc growing.

Measured as the peak bytes of tensors held for backward (saved-tensor hooks count a tensor when
autograd saves it and release it when its graph is freed), through forward + backward.
"""

import torch

from rlvr.models.diffusion_lm import DiffusionConfig, tiny_diffusion_lm
from rlvr.models.likelihood import Corruptor, bgpo, elbo_mc, row_hash


class _Meter:
    def __init__(self):
        self.live = self.peak = 0

    def pack(self, t):
        meter, size = self, t.numel() * t.element_size()

        class Held:
            def __init__(self):
                self.t = t
                meter.live += size
                meter.peak = max(meter.peak, meter.live)

            def __del__(self):
                meter.live -= size

        return Held()

    @staticmethod
    def unpack(held):
        return held.t


def peak_backward_bytes(fn, n: int) -> int:
    config = DiffusionConfig(vocab_size=40, mask_token_id=39, eos_token_id=2, pad_token_id=0, hidden_size=32,
                             num_layers=2, num_heads=2, intermediate_size=64)
    model = tiny_diffusion_lm(config, seed=0)
    gen = torch.Generator().manual_seed(0)
    prompt, completion = torch.randint(3, 39, (4, 6), generator=gen), torch.randint(3, 39, (4, 16), generator=gen)
    pmask = torch.ones_like(prompt)
    ctx = Corruptor(model, prompt, pmask, completion, torch.ones_like(completion, dtype=torch.bool),
                    row_hash(prompt, pmask, completion, 0), mask_id=39)
    meter = _Meter()
    with torch.autograd.graph.saved_tensors_hooks(meter.pack, meter.unpack):
        values, _ = fn(ctx, n=n)
        values.sum().backward()
    return meter.peak


def test_bgpo_memory_is_flat_in_n_while_elbo_mc_grows():
    bgpo_peak = {n: peak_backward_bytes(bgpo, n) for n in (1, 4, 16)}
    elbo_peak = {n: peak_backward_bytes(elbo_mc, n) for n in (1, 4, 16)}
    print("peak saved-for-backward bytes", {"bgpo": bgpo_peak, "elbo_mc": elbo_peak})
    assert bgpo_peak[16] <= 1.05 * bgpo_peak[1]
    assert elbo_peak[4] > 3.5 * elbo_peak[1] and elbo_peak[16] > 14 * elbo_peak[1]
    assert abs(bgpo_peak[1] - elbo_peak[1]) <= 0.05 * elbo_peak[1]
