"""A character-level tokenizer built in code, as a `transformers` fast tokenizer.

One id per printable ASCII character plus four specials, so any procedural task (Countdown,
arithmetic, Sudoku, small code) is covered without downloading a vocabulary. It is a real
`PreTrainedTokenizerFast`: it saves with the model and reloads with `AutoTokenizer`.
"""

from __future__ import annotations

import string

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")
CHARACTERS = "".join(c for c in string.printable if c not in "\r\x0b\x0c")


def char_tokenizer(characters: str = CHARACTERS) -> PreTrainedTokenizerFast:
    """Tokenizer with ids 0..3 = <pad>, <bos>, <eos>, <unk>, then one id per character."""
    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    for ch in characters:
        vocab.setdefault(ch, len(vocab))
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    # Each character is its own pre-token; Fuse joins them back without separators.
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
        padding_side="left",
    )
