"""Vision-language models: a tiny Idefics3 built in code and any Hugging Face image-text-to-text
checkpoint, loaded as (model, `VisionPrompts`).

The tiny model is Idefics3 (SmolVLM's architecture: a SigLIP vision encoder, a pixel-shuffle
connector, a Llama text model), chosen because both `transformers` (`AutoModelForImageTextToText`,
`AutoProcessor`, no torchvision needed) and vLLM's CPU build load it; the Qwen-VL processors need
torchvision there. Its text model takes plain 1-D positions, so the sampler and the trainer
compute positions as for text. Families whose text model needs M-RoPE positions (Qwen2/2.5/3-VL)
or per-token type ids (Gemma 3) are refused by name at load (`SUPPORTED_FAMILIES`).

`VisionPrompts` is what the run's parts hold in place of a tokenizer: every tokenizer attribute
the loop reads (ids, decode, pad/EOS) is the processor's tokenizer's, and `encode_examples` turns
examples with images into prompt rows plus their `VisionRows`.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from rlvr.batch import left_pad
from rlvr.errors import ConfigError
from rlvr.models.tokenizer import CHARACTERS, SPECIALS
from rlvr.multimodal import VisionRows

IMAGE_TOKEN = "<image>"
"""The placeholder a prompt holds for each of its images (the processor expands it)."""
IDEFICS3_SPECIALS = ("<fake_token_around_image>", IMAGE_TOKEN, "<global-img>", "<end_of_utterance>")
SUPPORTED_FAMILIES = ("idefics3", "smolvlm", "llava")
"""`model_type`s whose text model runs on 1-D positions with no per-token extras."""


def is_vlm_dir(directory: Path) -> bool:
    """Whether `directory`'s config.json describes a vision-language model (it has a `vision_config`)."""
    try:
        config = json.loads((Path(directory) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and "vision_config" in config


def tiny_vlm_tokenizer():
    """The character tokenizer (`rlvr.models.tokenizer`) with Idefics3's image specials after the
    four usual ones: ids 4..7 = <fake_token_around_image>, <image>, <global-img>, <end_of_utterance>."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate((*SPECIALS, *IDEFICS3_SPECIALS))}
    for ch in CHARACTERS:
        vocab.setdefault(ch, len(vocab))
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>",
                                   unk_token="<unk>", padding_side="left", extra_special_tokens=list(IDEFICS3_SPECIALS))


def tiny_vlm(*, seed: int, image_size: int = 64, patch_size: int = 8, scale_factor: int = 2, hidden_size: int = 128,
             num_layers: int = 4, num_heads: int = 4, intermediate_size: int = 384, vision_layers: int = 3,
             max_seq_len: int = 256):
    """(Idefics3ForConditionalGeneration, Idefics3Processor) built from configs, no download. An
    `image_size`² image becomes (image_size / patch_size)² / scale_factor² image tokens (16 by default)."""
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration, Idefics3Processor
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    tokenizer = tiny_vlm_tokenizer()
    edge = {"longest_edge": image_size}
    images = Idefics3ImageProcessorPil(do_image_splitting=False, size=edge, max_image_size=edge)
    tokens = (image_size // patch_size) ** 2 // scale_factor ** 2
    processor = Idefics3Processor(image_processor=images, tokenizer=tokenizer, image_seq_len=tokens)
    text = dict(model_type="llama", vocab_size=len(tokenizer), hidden_size=hidden_size,
                intermediate_size=intermediate_size, num_hidden_layers=num_layers, num_attention_heads=num_heads,
                num_key_value_heads=num_heads, max_position_embeddings=max_seq_len, bos_token_id=1,
                eos_token_id=2, pad_token_id=0, tie_word_embeddings=True)
    vision = dict(hidden_size=hidden_size, intermediate_size=intermediate_size, num_hidden_layers=vision_layers,
                  num_attention_heads=num_heads, image_size=image_size, patch_size=patch_size)
    config = Idefics3Config(text_config=text, vision_config=vision, scale_factor=scale_factor, pad_token_id=0,
                            image_token_id=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN), tie_word_embeddings=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Idefics3ForConditionalGeneration(config)
    return model, processor


def load_vlm(path: str, directory: Path, *, dtype: str = "float32"):
    """(model, `VisionPrompts`) from a directory written by `save_pretrained` (model + processor)."""
    from safetensors import SafetensorError
    from transformers import AutoModelForImageTextToText, AutoProcessor

    weights = "auto" if dtype == "auto" else getattr(torch, dtype)
    try:
        model = AutoModelForImageTextToText.from_pretrained(directory, dtype=weights)
        processor = AutoProcessor.from_pretrained(directory)
    except (OSError, ValueError, KeyError, TypeError, SafetensorError, RuntimeError) as err:
        reason = (str(err).strip().splitlines() or [""])[0][:200]
        raise ConfigError(f"model.path: '{path}' is not a loadable Hugging Face image-text-to-text model "
                          f"({type(err).__name__}: {reason}); check its config.json and processor files") from None
    family = model.config.model_type
    if family not in SUPPORTED_FAMILIES or not hasattr(processor, "image_processor"):
        raise ConfigError(f"model.path: '{path}' is a {family} vision-language model; rlvr trains "
                          f"{', '.join(SUPPORTED_FAMILIES)} (1-D positions) so far")
    return model, VisionPrompts(processor)


def freeze_vision(model, *, train_vision: bool = False) -> None:
    """Freeze every parameter outside the language model (vision tower, connector) unless `train_vision`."""
    if train_vision:
        return
    for name, p in model.named_parameters():
        if "text_model." not in name and "language_model." not in name and "lm_head" not in name:
            p.requires_grad_(False)


def image_token_id(model) -> int:
    """The id of the image placeholder, which neither sampler nor trainer lets a completion hold."""
    config = getattr(model, "config", None)
    config = model.get_base_model().config if hasattr(model, "peft_config") else config
    value = getattr(config, "image_token_id", None)
    return value if value is not None else config.image_token_index


class VisionPrompts:
    """A processor in a tokenizer's place: tokenizer attributes are its tokenizer's; prompts with
    images are encoded by `encode_examples`."""

    def __init__(self, processor):
        self.processor = processor
        self.tokenizer = processor.tokenizer
        self.image_token = getattr(processor, "image_token", IMAGE_TOKEN)

    def __getattr__(self, name):  # only reached for names not set above: the tokenizer's
        return getattr(self.__dict__["tokenizer"], name)

    def __call__(self, *args, **kwargs):
        return self.tokenizer(*args, **kwargs)

    def __len__(self) -> int:
        return len(self.tokenizer)

    def save_pretrained(self, directory) -> None:
        self.processor.save_pretrained(directory)

    def encode_examples(self, examples) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """Examples (prompt text with one `<image>` per image in `meta["images"]`) -> left-padded
        (ids (B, Tp), mask (B, Tp)) with each image's placeholder expanded, and the engine keywords
        {"vision": VisionRows}. Rows repeating an example (a group) share its encoding."""
        cache: dict[int, tuple[list[int], dict]] = {}
        ids, rows = [], []
        for index, ex in enumerate(examples):
            key = id(ex)
            if key not in cache:
                cache[key] = self._encode_one(ex, index)
            ids.append(cache[key][0])
            rows.append(cache[key][1])
        prompt_ids, prompt_mask = left_pad(ids, self.tokenizer.pad_token_id)
        return prompt_ids, prompt_mask, {"vision": VisionRows(rows)}

    def check_row(self, ex, index: int) -> list:
        """`ex`'s images; a ValueError naming the row and field unless there is one placeholder per image."""
        images = list(ex.meta.get("images") or [])
        placeholders = ex.prompt.count(self.image_token)
        if not images or placeholders != len(images):
            raise ValueError(f"row {index}: prompt holds {placeholders} {self.image_token} placeholder(s) for "
                             f"{len(images)} image(s) in field 'images'; a vision-language model needs one per image")
        return images

    def _encode_one(self, ex, index: int) -> tuple[list[int], dict]:
        images = self.check_row(ex, index)
        out = self.processor(text=[ex.prompt], images=[images], return_tensors="pt")
        ids = out.pop("input_ids")[0].tolist()
        out.pop("attention_mask", None)
        bos = self.tokenizer.bos_token_id
        if bos is not None and ids[:1] != [bos]:
            ids = [bos, *ids]
        return ids, dict(out)
