"""Model definitions and the policies over them (`rlvr.protocols.PolicyModel`).

- `causal_lm`: load any local Hugging Face causal LM, or build the tiny default Llama.
- `diffusion_lm`: the masked-diffusion transformer and its LLaDA/Dream-format loader.
- `policy.CausalPolicy`: exact per-token log-probs; `diffusion_policy.DiffusionPolicy`: a named
  likelihood estimator from `likelihood`.
- `value.ValueModel`: the critic for PPO/GAE; `tokenizer`: the character tokenizer built in code.

Models never import the engines or the trainer.
"""
