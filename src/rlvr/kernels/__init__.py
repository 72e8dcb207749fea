"""The CPU fast path of Llama-family models: the same math as `LlamaForCausalLM.forward` (tests/perf
check samples, log-probs and gradients against it), arranged for rlvr's scale, where a step costs
more in framework overhead and redundant work than in FLOPs.

- `weights`: `supports(model)` and `LlamaWeights`, the model's parameters fused (q|k|v, gate|up)
  and the layer pieces built on them.
- `decoder`: the KV-cache `Decoder` of the sampler (eager ATen ops or the C++ engine), and
  `shared_weights` for row-parallel workers.
- `training`: `completion_hidden`, the packed training forward (eager, or one C++ op per layer).
- `native`: builds `csrc/` on first use and reports fallbacks; `ops`: the Python side of the
  `torch.ops.rlvr` training ops (fake kernels, autograd).

Anything this package does not model (non-default RoPE, sliding windows, MLP biases, dropout in
training, PEFT wrappers, other architectures, weights other than float32 on CPU) makes `supports()`
return False, and callers use the plain `transformers` forward. Nothing here imports `rlvr.models`,
`rlvr.engines` or `rlvr.trainer`: callers hand in the model.
"""
