"""The padding-free forwards (`models.packing`): log-probs, entropy, logit statistics and gradients
equal the padded forward's (fp32, relative 1e-5) on several architectures, with LoRA and with
gradient checkpointing; the critic's values too; a model that cannot pack falls back with a notice."""

import pytest
import torch
import transformers

from rlvr.models import packing
from rlvr.models.causal_lm import enable_checkpointing
from rlvr.models.policy import CausalPolicy
from rlvr.models.value import ValueModel

VOCAB = 97
SIZES = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256)
ARCHS = {
    "llama": ("LlamaConfig", {}),
    "qwen2": ("Qwen2Config", {}),
    # a window shorter than the rows (4 < 21 tokens), GQA 4:2: the window counts positions, not columns
    "mistral_window": ("MistralConfig", dict(sliding_window=4)),
    # alternating sliding / full layers, head_dim apart from hidden/heads, query pre-attention scaling
    "gemma2": ("Gemma2Config", dict(sliding_window=4, head_dim=8, attn_logit_softcapping=None)),
}


def _model(arch: str, seed: int = 0):
    name, extra = ARCHS[arch]
    config = getattr(transformers, name)(**SIZES, **extra)
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    return transformers.AutoModelForCausalLM.from_config(config).float()


def _batch():
    """Two groups of three rows: left-padded prompts of 5 and 9 tokens, completions of 0-12 tokens
    (a 1-token row feeds nothing but its prompt; a 0-token row is skipped)."""
    gen = torch.Generator().manual_seed(1)
    width = 9
    ids, mask = torch.zeros(6, width, dtype=torch.long), torch.zeros(6, width, dtype=torch.long)
    for group, length in enumerate((5, 9)):
        prompt = torch.randint(3, VOCAB, (length,), generator=gen)
        ids[3 * group:3 * group + 3, width - length:] = prompt
        mask[3 * group:3 * group + 3, width - length:] = 1
    lengths = torch.tensor([1, 7, 12, 3, 12, 0])
    completion_mask = (torch.arange(12)[None] < lengths[:, None]).long()
    return ids, mask, torch.randint(3, VOCAB, (6, 12), generator=gen) * completion_mask, completion_mask


def _run(model, mode, stats=()):
    """(log-probs, entropy, stats) and the gradients of a loss over all three, masked."""
    policy = CausalPolicy(model, fast=False, packing=mode, checkpointing=True)
    prompt_ids, prompt_mask, completion_ids, mask = _batch()
    model.zero_grad()
    logp, entropy, extra = policy._outputs(prompt_ids, prompt_mask, completion_ids, True, mask, stats)
    loss = ((logp + 0.1 * entropy + sum(0.01 * v for v in extra.values())) * mask).sum()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return [logp.detach() * mask, entropy.detach() * mask, *(v.detach() * mask for v in extra.values())], grads


def _rel(a, b):
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-30))


def _assert_same(model, mode, stats=()):
    padded, padded_grads = _run(model, None, stats)
    ours, grads = _run(model, mode, stats)
    assert all(_rel(x, y) <= 1e-5 for x, y in zip(ours, padded)), [_rel(x, y) for x, y in zip(ours, padded)]
    assert padded_grads.keys() == grads.keys() and len(grads) > 0
    worst = max(_rel(grads[k], padded_grads[k]) for k in grads)
    assert worst <= 1e-5, worst


@pytest.mark.parametrize("arch", sorted(ARCHS))
@pytest.mark.parametrize("mode", ["packed", "shared"])
def test_packed_forward_equals_padded(arch, mode):
    model = _model(arch)
    assert packing.prepare(model, mode) is None
    _assert_same(model, mode)


def test_packed_logit_stats_equal_padded():
    model = _model("qwen2")
    assert packing.prepare(model, "shared") is None
    _assert_same(model, "shared", stats=("logsumexp", "sum_pi_squared"))


@pytest.mark.parametrize("arch", ["qwen2", "mistral_window"])
def test_packed_forward_with_lora_and_checkpointing(arch):
    from rlvr.models.lora import apply_lora

    model = _model(arch)
    enable_checkpointing(model)
    model = apply_lora(model, r=4, alpha=8, dropout=0.0, target_modules="all-linear")
    for p in model.parameters():  # LoRA's B starts at 0: move it so its A gets a gradient
        if p.requires_grad:
            p.data.normal_(0, 0.1)
    assert packing.prepare(model, "shared") is None
    _assert_same(model, "shared")


def test_shared_layout_computes_each_prompt_once():
    prompt_ids, prompt_mask, completion_ids, mask = _batch()
    lengths = mask.sum(-1)
    ids, _, layout, pick, index = packing.pack_layout(prompt_ids, prompt_mask, completion_ids, lengths, share=True)
    # 5 + 9 prompt tokens once, then fed completion tokens 6 + 11 + 2 + 11 (a row of n feeds n - 1)
    assert layout.prompt_lens.tolist() == [5, 9] or layout.prompt_lens.tolist() == [9, 5]
    assert ids.shape[1] == 14 + 30 and len(pick) == len(index) == int(lengths.sum())
    _, _, unshared, _, _ = packing.pack_layout(prompt_ids, prompt_mask, completion_ids, lengths, share=False)
    assert unshared.prompt_lens.tolist() == [5, 5, 5, 9, 9, 9]


def test_critic_values_packed_equal_padded():
    model = _model("qwen2")
    assert packing.prepare(model, "shared") is None
    prompt_ids, prompt_mask, completion_ids, mask = _batch()
    outs = []
    for mode in (None, "shared"):
        torch.manual_seed(0)
        critic = ValueModel(model)
        torch.nn.init.normal_(critic.head.weight, std=0.5)
        if mode:
            critic.use_packing(mode)
        values = critic(prompt_ids, prompt_mask, completion_ids, mask) * mask
        values.sum().backward()
        outs.append((values.detach(), critic.body.embed_tokens.weight.grad.clone()))
    assert _rel(outs[1][0], outs[0][0]) <= 1e-5 and _rel(outs[1][1], outs[0][1]) <= 1e-5


def test_model_that_cannot_pack_keeps_the_padded_forward(capsys):
    from rlvr.builder.build import packing_mode

    config = transformers.FalconConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4)
    config._attn_implementation = "sdpa"
    model = transformers.AutoModelForCausalLM.from_config(config)
    assert packing_mode("auto", model, sharded=False) is None
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "FalconForCausalLM cannot pack rows exactly" in err[0] and "padded forward" in err[0]
    assert model.config._attn_implementation == "sdpa"  # the model is left as it was


def test_probe_catches_a_leaking_attention():
    model = _model("qwen2")
    assert packing.prepare(model, "packed") is None
    real = packing.layout_attention
    try:  # every token sees every earlier packed token: the rows leak into each other
        def leaky(query, key, value, layout, **kw):
            n = query.shape[2]
            out = torch.nn.functional.scaled_dot_product_attention(query, key, value, is_causal=True, enable_gqa=True)
            return out.transpose(1, 2)[:, :n]
        packing.layout_attention = leaky
        assert "differ" in packing.probe(model, share=False)
    finally:
        packing.layout_attention = real


def test_packing_mode_keeps_llama_fast_path_and_padded_choice():
    from rlvr.builder.build import packing_mode
    from rlvr.models.causal_lm import tiny_llama

    assert packing_mode("auto", tiny_llama(40, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                                           max_seq_len=32, seed=0), sharded=False) is None
    assert packing_mode("auto", _model("qwen2"), sharded=False) is None  # fp32 CPU Qwen2: the fast path too
    assert packing_mode("padded", _model("mistral_window"), sharded=False) is None
    model = _model("mistral_window")
    assert packing_mode("auto", model, sharded=False) == "shared"
    assert model.config._attn_implementation == "sdpa"  # an exported or pickled model carries nothing of rlvr's
    assert packing_mode("packed", _model("mistral_window"), sharded=True) is None  # FSDP: the root's forward
