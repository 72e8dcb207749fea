import json

import pytest
import torch
from safetensors.torch import save_file

from rlvr.models.diffusion_lm import (
    DiffusionConfig,
    dream_key,
    llada_key,
    load_diffusion_lm,
    load_diffusion_model,
    tiny_diffusion_lm,
)
from rlvr.sft.diffusion import diffusion_sft, encode_windows, masked_diffusion_loss
from rlvr.types import Example

CONFIG = DiffusionConfig(vocab_size=30, mask_token_id=29, eos_token_id=2, pad_token_id=0, hidden_size=32,
                         num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=48, tie_word_embeddings=False)
IDS = torch.tensor([[0, 0, 5, 6, 29, 29, 7], [3, 4, 5, 6, 29, 8, 29]])
ATTN = torch.tensor([[0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]])


def test_bidirectional_and_padding_invariant():
    model = tiny_diffusion_lm(CONFIG, seed=0)
    with torch.no_grad():
        base = model(IDS, ATTN)
        changed = IDS.clone()
        changed[:, -1] = 9
        assert not torch.allclose(model(changed, ATTN)[:, 2], base[:, 2])  # a later token changes earlier logits
        unpadded = model(IDS[:1, 2:])
    assert torch.allclose(unpadded, base[:1, 2:], atol=1e-5)


def test_our_format_round_trip(tmp_path):
    model = tiny_diffusion_lm(CONFIG, seed=1)
    model.save_pretrained(tmp_path)
    again = load_diffusion_model(tmp_path)
    with torch.no_grad():
        assert torch.equal(model(IDS, ATTN), again(IDS, ATTN))


def test_llada_format_checkpoint_loads(tmp_path):
    model = tiny_diffusion_lm(CONFIG, seed=2)
    state = {llada_key(k): v.clone() for k, v in model.state_dict().items()}
    assert "model.transformer.blocks.1.attn_out.weight" in state and "model.transformer.wte.weight" in state
    assert "model.transformer.blocks.0.ff_proj.weight" in state and "model.transformer.ff_out.weight" in state
    half = len(state) // 2
    names = sorted(state)
    save_file({k: state[k] for k in names[:half]}, str(tmp_path / "model-00001-of-00002.safetensors"))
    save_file({k: state[k] for k in names[half:]}, str(tmp_path / "model-00002-of-00002.safetensors"))
    index = {"weight_map": {k: f"model-0000{1 + (i >= half)}-of-00002.safetensors" for i, k in enumerate(names)}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "llada", "d_model": 32, "n_heads": 4, "n_kv_heads": 2, "n_layers": 2, "mlp_hidden_size": 48,
        "vocab_size": 30, "embedding_size": 30, "rope_theta": 10000.0, "rms_norm_eps": 1e-5, "weight_tying": False,
        "include_bias": False, "mask_token_id": 29, "eos_token_id": 2, "pad_token_id": 0}))
    loaded = load_diffusion_model(tmp_path)
    with torch.no_grad():
        assert torch.allclose(loaded(IDS, ATTN), model(IDS, ATTN))


def test_dream_format_checkpoint_loads_with_shifted_logits(tmp_path):
    shifted = DiffusionConfig(**{**CONFIG.__dict__, "qkv_bias": True, "shift_logits": True})
    model = tiny_diffusion_lm(shifted, seed=3)
    save_file({dream_key(k): v.clone() for k, v in model.state_dict().items()}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "Dream", "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
        "num_hidden_layers": 2, "intermediate_size": 48, "vocab_size": 30, "rope_theta": 10000.0,
        "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "mask_token_id": 29, "eos_token_id": 2,
        "pad_token_id": 0}))
    loaded = load_diffusion_model(tmp_path)
    assert loaded.config.shift_logits and loaded.config.qkv_bias
    with torch.no_grad():
        out = loaded(IDS, ATTN)
        raw = loaded.lm_head(loaded.norm(_hidden(loaded, IDS, ATTN)))
    assert torch.allclose(out[:, 1:], raw[:, :-1], atol=1e-6) and torch.allclose(out[:, 0], raw[:, 0])


def _hidden(model, ids, attn):
    return model.hidden_states(ids, attn)


class _Reverse:
    """Toy task: reverse three letters."""

    def sample(self, n, rng):
        out = []
        for _ in range(n):
            word = "".join(rng.choice("abcd") for _ in range(3))
            out.append(Example(prompt=word + ":", answer=word[::-1]))
        return out

    def solution(self, example):
        return example.answer


def test_masked_diffusion_sft_loss_decreases():
    torch.manual_seed(0)
    model, tok = load_diffusion_lm(None, seed=0, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
    windows = encode_windows(tok, ["ab"], 5)
    assert windows.tolist()[0][2:] == [tok.eos_token_id] * 3  # EOS then EOS padding, all targets
    losses = diffusion_sft(model, tok, _Reverse(), steps=60, batch_size=16, lr=3e-3, gen_length=5,
                           warmup_steps=5, echo=lambda *_: None)
    assert sum(losses[-10:]) / 10 < 0.6 * sum(losses[:10]) / 10


def test_sft_loss_is_the_one_over_t_elbo():
    model = tiny_diffusion_lm(CONFIG, seed=0)
    torch.nn.init.zeros_(model.lm_head.weight)  # uniform over 30 ids -> CE = log 30 on every masked position
    gen = torch.Generator().manual_seed(0)
    loss = masked_diffusion_loss(model, IDS[:, :3], ATTN[:, :3], IDS[:, 3:] % 20, mask_id=29, generator=gen)
    # E[Σ_masked CE / t] / L = log V exactly in expectation; per row it is (#masked / (t L)) log V.
    assert 0.2 < float(loss.detach()) / float(torch.log(torch.tensor(30.0))) < 5.0


def test_diffusion_sft_cosine_schedule_decays_the_learning_rate_to_zero():
    # sft.schedule=cosine: same warmup, then the LR falls to 0 at the last step, so the last step
    # leaves the weights unchanged; the constant schedule still moves them.
    from unittest import mock

    import rlvr.builder.build as build_mod

    seen = {}
    real = build_mod.build_optimizer

    def spy(*args, **kwargs):
        optimizer, scheduler = real(*args, **kwargs)
        seen.setdefault(kwargs.get("schedule", "constant"), []).append(scheduler)
        return optimizer, scheduler

    for schedule in ("constant", "cosine"):
        model, tok = load_diffusion_lm(None, seed=0, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)
        with mock.patch.object(build_mod, "build_optimizer", spy):
            diffusion_sft(model, tok, _Reverse(), steps=6, batch_size=4, lr=1e-3, gen_length=5, warmup_steps=2,
                          schedule=schedule, echo=lambda *_: None)
    assert seen["constant"][0].get_last_lr()[0] == pytest.approx(1e-3)
    assert seen["cosine"][0].get_last_lr()[0] == pytest.approx(0.0, abs=1e-12)



def test_loading_the_shipped_warm_start_prints_no_transformers_warning():
    # A subprocess: transformers' own log handler writes to the real stderr, past pytest's capture.
    import subprocess
    import sys

    code = ("from rlvr.models.diffusion_lm import load_diffusion_lm; "
            "m, t = load_diffusion_lm('rlvr:countdown-dllm-warmstart', seed=0); "
            "assert t.mask_token_id == m.mask_token_id")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "instantiate a model of type" not in done.stderr + done.stdout
