"""Rollout engines: implementations of `rlvr.protocols.RolloutEngine` (token ids in, `Rollouts` out).

- `torch_ar.generate`: batched KV-cache sampler for any `transformers` causal LM (Llama-family
  models take the CPU fast path of `rlvr.kernels`).
- `torch_diffusion.generate_diffusion`: the masked-diffusion denoising sampler (semi-autoregressive
  blocks, remasking rules, confidence threshold); puts each token's commit step on `Rollouts.trace`.

Engines may import `rlvr.models` and `rlvr.kernels`, never the trainer.
"""
