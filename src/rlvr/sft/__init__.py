"""Supervised training (`rlvr sft`): the warm starts of causal LMs (`supervised`), of agent
policies on demonstrations, and of masked-diffusion LMs (`diffusion`)."""
