"""Chat SFT: `messages` rows through the chat template, the loss mask on assistant tokens only
(role headers, user turns and the generation prompt untrained), the masked loss equal to a direct
forward's mean NLL over those tokens, and `rlvr sft sft.data=...` end to end."""

from __future__ import annotations

import json

import pytest
import torch

from rlvr.models.causal_lm import tiny_llama
from rlvr.models.policy import CausalPolicy
from rlvr.models.tokenizer import char_tokenizer
from rlvr.sft.chat import chat_rollouts, chat_tokens
from rlvr.sft.supervised import masked_sft_loss

TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}|{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")
CHAT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "1 2>3:"},
        {"role": "assistant", "content": "1+2"}, {"role": "user", "content": "and 2 2>4:"},
        {"role": "assistant", "content": "2*2"}]


def _tokenizer():
    tokenizer = char_tokenizer()
    tokenizer.chat_template = TEMPLATE
    return tokenizer


def _spans(tokenizer, ids, mask) -> list[str]:
    """The masked tokens as the runs of text they form."""
    spans, current = [], []
    for token, m in zip(ids, mask):
        if m:
            current.append(token)
        elif current:
            spans.append(tokenizer.decode(current))
            current = []
    return spans + ([tokenizer.decode(current)] if current else [])


def test_only_assistant_tokens_are_in_the_mask():
    tokenizer = _tokenizer()
    ids, mask = chat_tokens(tokenizer, CHAT)
    assert tokenizer.decode(ids) == "<system>be brief|<user>1 2>3:|<assistant>1+2|<user>and 2 2>4:|<assistant>2*2|"
    # each assistant turn with its end-of-turn marker; no header, no user or system text
    assert _spans(tokenizer, ids, mask) == ["1+2|", "2*2|"]
    assert sum(mask) == 8


def test_rollouts_split_before_the_first_assistant_token_and_mask_the_turns_between():
    tokenizer = _tokenizer()
    short = [{"role": "user", "content": "9>9:"}, {"role": "assistant", "content": "9"}]
    r = chat_rollouts(tokenizer, [CHAT, short])
    prompts = [tokenizer.decode(row[m.bool()]) for row, m in zip(r.prompt_ids, r.prompt_mask)]
    assert prompts == ["<system>be brief|<user>1 2>3:|<assistant>", "<user>9>9:|<assistant>"]
    assert tokenizer.decode(r.completion_ids[1][:2]) == "9|" and r.completion_mask[1].tolist()[:3] == [1, 1, 0]
    assert _spans(tokenizer, r.completion_ids[0].tolist(), r.completion_mask[0].tolist()) == ["1+2|", "2*2|"]


def test_the_masked_loss_is_the_mean_nll_of_the_assistant_tokens():
    tokenizer = _tokenizer()
    model = tiny_llama(len(tokenizer), hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                       max_seq_len=96, seed=0)
    ids, mask = chat_tokens(tokenizer, CHAT)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0, :-1]
        nll = -torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]
        expected = float((nll * torch.tensor(mask[1:])).sum() / sum(mask))
        got = float(masked_sft_loss(CausalPolicy(model, fast=False), chat_rollouts(tokenizer, [CHAT])))
    assert got == pytest.approx(expected, abs=1e-5)


def test_rlvr_sft_on_chat_rows(tmp_path, capsys):
    from rlvr.cli import main

    tokenizer = _tokenizer()
    base = tmp_path / "base"
    tiny_llama(len(tokenizer), hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, max_seq_len=96,
               seed=0).save_pretrained(base)
    tokenizer.save_pretrained(base)
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps({"messages": CHAT[1:3 + 2 * (i % 2)]}) + "\n" for i in range(6)))
    common = [f"sft.data={data}", "sft.steps=3", "sft.batch_size=2", "trainer.threads=1"]
    args = ["sft", f"model.path={base}", *common]
    assert main([*args, "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "config.json").is_file() and "sft step 3/3" in capsys.readouterr().out

    data.write_text(json.dumps({"messages": [{"role": "user", "content": "q"}]}) + "\n")
    assert main([*args, "--out", str(tmp_path / "out2")]) == 2
    assert "chat.jsonl:1: no assistant message to train on" in capsys.readouterr().err
    plain = tmp_path / "plain"  # the same model, its tokenizer without a template
    tiny_llama(len(tokenizer), hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, max_seq_len=96,
               seed=0).save_pretrained(plain)
    char_tokenizer().save_pretrained(plain)
    data.write_text(json.dumps({"messages": CHAT}) + "\n")
    assert main(["sft", f"model.path={plain}", *common, "--out", str(tmp_path / "out3")]) == 2
    assert "sft.data: the model's tokenizer has no chat template" in capsys.readouterr().err
