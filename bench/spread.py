"""The `--workload spread` of bench/vs_trl.py: an RL-shaped batch at 120M parameters.

A random Qwen2 with Qwen2.5-0.5B's layer shape (width 896, MLP 4864, 14 heads, 2 KV heads; 8 of its 24
layers by default) over the 512-token BPE tokenizer trained on the project's task text
(tests/models/_archs.py), prompted with the GSM8K fixture's questions through the tokenizer's chat
template (a system prompt and the question: 100 tokens on average), groups of 8, and completions whose
lengths spread from a few tokens to the 128-token cap within each group.

How the spread is made (an EOS bias, written into the weights so both trainers sample the same
distribution from the same directory): a random model almost never samples EOS (about 1 in 512 a
token), so every completion would run to the cap. Here residual dimension 0 carries a constant c
(column 0 of the tied embedding is c for every token, and row 0 of every layer's output projections
is 0, so no layer writes to it; c = 100 outweighs what the layers write elsewhere); after the final
RMSNorm that dimension is ≈ √H whatever the token, and the LM head (untied here: +0.46M parameters)
reads it for EOS alone, with weight gap/√H, so EOS's logit sits `eos_gap` above the others'. Every
token then stops with probability ≈ e^gap / (e^gap + V − 1): a geometric length, 2.6% a token at the
default gap 2.6 (mean ≈ 38 tokens; about a third of the completions under 16 tokens, a few at 128),
independently in each row, so each group of 8 spreads. The other logits stay nearly uniform: the
dimension-0 constant dominates the residual stream, which makes the model's outputs nearly the same
at every position; the compute is the model's, which is all a speed bench reads.
"""

from __future__ import annotations

import torch

from rlvr.models.tiny_archs import EOS, QWEN2_05B, bpe_tokenizer, model_config

TINY_SHAPE = dict(hidden_size=128, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=512)
"""The shape of rlvr's default tiny model (`model.hidden_size` 128, 4 layers), with room for the chat prompts."""

SYSTEM_PROMPT = "Solve the problem step by step, then give the final answer as \\boxed{N}."


def spread_model(directory: str, *, layers: int = 8, dtype: str = "float32", eos_gap: float = 2.6,
                 constant: float = 100.0, tiny: bool = False) -> str:
    """Save the spread workload's model and tokenizer to `directory` (see the module docstring).
    `tiny`: the shape of rlvr's default tiny model (`TINY_SHAPE`) instead of Qwen2.5-0.5B's, `layers` ignored."""
    from transformers import AutoModelForCausalLM

    tokenizer = bpe_tokenizer()
    shape = TINY_SHAPE if tiny else {**QWEN2_05B, "num_hidden_layers": layers}
    config = model_config("qwen2", len(tokenizer), **{**shape, "tie_word_embeddings": False})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config)
    hidden = config.hidden_size
    with torch.no_grad():
        model.get_input_embeddings().weight[:, 0] = constant        # every token carries c in dimension 0
        head = model.get_output_embeddings().weight
        head[:, 0] = 0.0                                            # ... which the head reads for EOS only
        head[EOS, 0] = eos_gap / hidden ** 0.5
        for layer in model.model.layers:                            # nothing writes residual dimension 0
            layer.self_attn.o_proj.weight[0] = 0.0
            layer.mlp.down_proj.weight[0] = 0.0
    model.to(getattr(torch, dtype)).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def spread_overrides(heldout: int = 4) -> list[str]:
    """rlvr config overrides for the workload's task: the GSM8K fixture through the chat template."""
    return ["task.name=math_file", f"task.heldout_size={heldout}", "task.math_file.path=data/gsm8k_fixture.jsonl",
            "task.math_file.prompt_key=question", "task.math_file.answer_key=answer",
            f"task.math_file.system_prompt={SYSTEM_PROMPT}", "task.math_file.max_prompt_length=400"]
