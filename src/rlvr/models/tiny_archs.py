"""Tiny random Hugging Face causal LMs of several architectures, with a locally trained BPE
tokenizer that has a chat template, saved to a directory that `model.path=` can load.

Nothing is downloaded: each model is built from its `transformers` config class, and the
tokenizer is trained by the `tokenizers` library on the project's own task text (Countdown
prompts and answers, the GSM8K fixture, the code fixture, which ship with the packaged recipes).
`python -m rlvr.models.tiny_archs qwen2 DIR` builds the model the `gsm8k_tiny_qwen2` recipe trains;
the architecture tests and `bench/gpu_check.py` build theirs here too.

Only config fields that exist in every transformers 5.x are used (no version-specific API).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

DATA = Path(__file__).resolve().parents[1] / "recipes" / "data"
"""The fixtures the packaged recipes read (`rlvr/recipes/data`)."""
SPECIALS = ["<pad>", "<bos>", "<|im_end|>", "<unk>", "<|im_start|>"]
PAD, BOS, EOS = 0, 1, 2

CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
"""ChatML, as Qwen2 uses: no BOS in the template (the prompt encoder adds the tokenizer's)."""

# (config class name, its size fields). Every model: 2 layers, width 32, 256 positions.
ARCHS = {
    "llama": ("LlamaConfig", dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                                  num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=True)),
    "qwen2": ("Qwen2Config", dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=True)),
    "qwen3": ("Qwen3Config", dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=2, head_dim=8, max_position_embeddings=256,
                                  tie_word_embeddings=True)),
    "mistral": ("MistralConfig", dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                      sliding_window=None, tie_word_embeddings=False)),
    "gemma": ("GemmaConfig", dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                                  num_key_value_heads=1, head_dim=16, max_position_embeddings=256)),
    "phi3": ("Phi3Config", dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                                num_key_value_heads=2, max_position_embeddings=256,
                                original_max_position_embeddings=256)),
    "gpt2": ("GPT2Config", dict(n_embd=32, n_layer=2, n_head=2, n_positions=256)),
}

QWEN2_05B = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2, max_position_embeddings=4096, tie_word_embeddings=True)
"""Qwen2.5-0.5B's shape (its real vocabulary is 151,936; here the local tokenizer's)."""


def task_text(lines: int = 400, seed: int = 0) -> list[str]:
    """About `lines` lines of the project's own task text: Countdown prompts with their answers,
    the GSM8K fixture's questions and solutions and the code fixture's prompts."""
    from rlvr.tasks.countdown import Countdown

    text = []
    for name in ("gsm8k_fixture.jsonl", "code_fixture.jsonl"):
        for line in (DATA / name).read_text().splitlines():
            row = json.loads(line)
            text += [str(v) for v in row.values() if isinstance(v, str)]
    task = Countdown(heldout_size=10, seed=seed)
    rng = random.Random(seed)
    while len(text) < lines:
        for ex in task.sample(16, rng):
            text.append(ex.prompt + ex.answer)
    return text[:lines]


def bpe_tokenizer(vocab_size: int = 512, *, template: str = CHAT_TEMPLATE) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on `task_text()`; ids 0..4 are the specials."""
    backend = Tokenizer(models.BPE(unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(task_text(), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", bos_token="<bos>",
                                        eos_token="<|im_end|>", unk_token="<unk>", padding_side="left")
    tokenizer.chat_template = template
    return tokenizer


def model_config(arch: str, vocab_size: int, **overrides):
    """The `transformers` config of a tiny `arch` model over `vocab_size` tokens."""
    name, size = ARCHS[arch]
    ids = dict(pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS)
    return getattr(transformers, name)(vocab_size=vocab_size, **{**size, **overrides}, **ids)


def build_model_dir(directory: str | Path, arch: str = "qwen2", *, dtype: torch.dtype = torch.float32,
                    seed: int = 0, template: str = CHAT_TEMPLATE, tokenizer=None, **overrides) -> Path:
    """Save a random `arch` model (in `dtype`) and the BPE tokenizer to `directory`; return it."""
    from transformers import AutoModelForCausalLM

    directory = Path(directory)
    tokenizer = tokenizer or bpe_tokenizer(template=template)
    config = model_config(arch, len(tokenizer), **overrides)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config)
    model.to(dtype).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def parameter_count(directory: str | Path) -> int:
    from safetensors import safe_open

    total = 0
    for file in Path(directory).glob("*.safetensors"):
        with safe_open(str(file), "pt") as f:
            total += sum(_prod(f.get_slice(k).get_shape()) for k in f.keys())
    return total


def _prod(shape) -> int:
    out = 1
    for n in shape:
        out *= n
    return out


def main(argv: list[str] | None = None) -> None:
    """`python -m rlvr.models.tiny_archs ARCH DIR [--dtype D] [--shape tiny|qwen2-0.5b] [--layers N]`:
    build one model directory and print its parameter count."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m rlvr.models.tiny_archs", description=main.__doc__)
    p.add_argument("arch", choices=sorted(ARCHS))
    p.add_argument("out")
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    p.add_argument("--shape", default="tiny", choices=["tiny", "qwen2-0.5b"])
    p.add_argument("--layers", type=int, default=0, help="override the number of layers (0 = the shape's)")
    args = p.parse_args(argv)
    size = dict(QWEN2_05B) if args.shape == "qwen2-0.5b" else {}
    if args.layers:
        size["num_hidden_layers"] = args.layers
    out = build_model_dir(args.out, args.arch, dtype=getattr(torch, args.dtype), **size)
    print(f"{out} {parameter_count(out) / 1e6:.1f}M parameters")


if __name__ == "__main__":
    main()
