"""Rollout engines: implementations of `rlvr.protocols.RolloutEngine` (token ids in, `Rollouts` out).

- `torch_ar.generate`: batched KV-cache sampler for any `transformers` causal LM (Llama-family
  models take the CPU fast path of `rlvr.kernels`).
- `speculative.SpeculativeRollouts`: SPEC-RL over `torch_ar.generate`: each row's previous completion
  verified under the current policy as a draft, sampling continued from the first rejection.
- `torch_diffusion.generate_diffusion`: the masked-diffusion denoising sampler (semi-autoregressive
  blocks, remasking rules, confidence threshold); puts each token's commit step on `Rollouts.trace`.
- `torch_block_diffusion.generate_block_diffusion`: the same commit rule for block diffusion models,
  block by block over a KV cache of the prompt and the finished blocks.

Engines may import `rlvr.models` and `rlvr.kernels`, never the trainer.
"""
