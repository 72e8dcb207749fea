"""DiffusionLM.forward (complex RoPE on pair-adjacent q/k rows, explicit small-sequence attention,
fused RMSNorm) against a straightforward reference of the same math, logits and gradients."""

import pytest
import torch
import torch.nn.functional as F

from rlvr.models import diffusion_lm
from rlvr.models.diffusion_lm import DiffusionConfig, DiffusionLM

LOGIT_ATOL = 1e-5
# max |g - g_ref| / max |g_ref|, per parameter (float32 sums in another order: up to ~1e-5 seen, CPU-dependent)
GRAD_RTOL = 3e-5

IDS = torch.tensor([[0, 0, 0, 5, 6, 29, 29, 7, 11], [3, 4, 5, 6, 29, 8, 29, 1, 2], [0, 9, 8, 7, 29, 29, 29, 29, 3]])
ATTN = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1, 1], [1] * 9, [0, 1, 1, 1, 1, 1, 1, 1, 1]])  # left padding


def random_model(*, qkv_bias: bool, shift_logits: bool, num_kv_heads: int | None, seed: int = 0) -> DiffusionLM:
    """Tiny model with O(1) activations (the default 0.02 init would hide most errors)."""
    config = DiffusionConfig(vocab_size=30, mask_token_id=29, eos_token_id=2, pad_token_id=0, hidden_size=32,
                             num_layers=2, num_heads=4, num_kv_heads=num_kv_heads, intermediate_size=48,
                             tie_word_embeddings=False, qkv_bias=qkv_bias, shift_logits=shift_logits)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = DiffusionLM(config)
        for p in model.parameters():
            if p.dim() > 1:
                torch.nn.init.normal_(p, std=0.3)
            else:  # norm weights and q/k/v biases
                torch.nn.init.uniform_(p, 0.5, 1.5)
    return model


def _rms(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def _rope(x, positions, theta):
    """Rotate-half RoPE, x (B, H, S, D)."""
    d = x.shape[-1]
    inv_freq = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    angles = positions[:, None, :, None].float() * inv_freq
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    return x * cos + torch.cat([-x[..., d // 2:], x[..., :d // 2]], -1) * sin


def reference_logits(model: DiffusionLM, ids, attn):
    """The model's math written out plainly from its parameters (looked up by name)."""
    c, (b, s) = model.config, ids.shape
    kv, d = c.num_kv_heads or c.num_heads, c.head_dim
    positions = (attn.cumsum(-1) - 1).clamp(min=0)
    x = F.embedding(ids, model.embed_tokens.weight)
    for i in range(c.num_layers):
        layer = model.get_submodule(f"layers.{i}")
        att = layer.self_attn
        h = _rms(x, layer.input_layernorm.weight, c.rms_norm_eps)
        q = F.linear(h, att.q_proj.weight, att.q_proj.bias).view(b, s, c.num_heads, d).transpose(1, 2)
        k = F.linear(h, att.k_proj.weight, att.k_proj.bias).view(b, s, kv, d).transpose(1, 2)
        v = F.linear(h, att.v_proj.weight, att.v_proj.bias).view(b, s, kv, d).transpose(1, 2)
        q, k = _rope(q, positions, c.rope_theta), _rope(k, positions, c.rope_theta)
        k, v = k.repeat_interleave(c.num_heads // kv, 1), v.repeat_interleave(c.num_heads // kv, 1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn.bool()[:, None, None, :])
        x = x + F.linear(out.transpose(1, 2).reshape(b, s, -1), att.o_proj.weight)
        h = _rms(x, layer.post_attention_layernorm.weight, c.rms_norm_eps)
        mlp = layer.mlp
        x = x + F.linear(F.silu(F.linear(h, mlp.gate_proj.weight)) * F.linear(h, mlp.up_proj.weight),
                         mlp.down_proj.weight)
    logits = F.linear(_rms(x, model.norm.weight, c.rms_norm_eps), model.lm_head.weight)
    if c.shift_logits:
        logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
    return logits


def _logits_and_grads(model, forward):
    params = list(model.parameters())
    logits = forward()
    probe = torch.randn(logits.shape, generator=torch.Generator().manual_seed(0))  # a generic loss
    return logits.detach(), torch.autograd.grad((logits * probe).sum(), params)


@pytest.mark.parametrize("num_kv_heads", [None, 2])
@pytest.mark.parametrize("shift_logits", [False, True])
@pytest.mark.parametrize("qkv_bias", [False, True])
@pytest.mark.parametrize("explicit_attention", [True, False])
@pytest.mark.parametrize("padded", [True, False])
def test_forward_and_gradients_match_reference(monkeypatch, qkv_bias, shift_logits, num_kv_heads, explicit_attention,
                                               padded):
    if not explicit_attention:  # the long-sequence path (fused SDPA) on the same tiny inputs
        monkeypatch.setattr(diffusion_lm, "_EXPLICIT_ATTENTION_MAX_KEYS", 0)
    attn = ATTN if padded else torch.ones_like(ATTN)  # unpadded: the forward drops the key mask
    model = random_model(qkv_bias=qkv_bias, shift_logits=shift_logits, num_kv_heads=num_kv_heads)
    logits, grads = _logits_and_grads(model, lambda: model(IDS, attn))
    ref_logits, ref_grads = _logits_and_grads(model, lambda: reference_logits(model, IDS, attn))
    assert ref_logits.abs().max() > 1.0  # the comparison is not between near-zeros
    assert (logits - ref_logits).abs().max() <= LOGIT_ATOL
    for (name, _), g, ref in zip(model.named_parameters(), grads, ref_grads):
        assert ref.abs().max() > 0, name
        assert (g - ref).abs().max() <= GRAD_RTOL * ref.abs().max(), name


def test_reference_is_sensitive_to_rope_and_padding():
    """Guards the reference itself: dropping RoPE or the key mask must change the logits."""
    model = random_model(qkv_bias=False, shift_logits=False, num_kv_heads=2)
    with torch.no_grad():
        base = model(IDS, ATTN)
        assert (model(IDS, ATTN, torch.zeros_like(IDS)) - base).abs().max() > 1e-2
        assert (model(IDS, torch.ones_like(ATTN)) - base)[0].abs().max() > 1e-2


def test_state_dict_holds_only_the_parameters():
    """Run-time reorderings add no buffers: saved/loaded checkpoints keep the same keys."""
    model = random_model(qkv_bias=True, shift_logits=False, num_kv_heads=2)
    assert set(model.state_dict()) == {name for name, _ in model.named_parameters(remove_duplicate=False)}


def test_sampling_forward_matches_the_autograd_one():
    """Without autograd the forward updates buffers in place; same logits, and the input untouched."""
    model = random_model(qkv_bias=True, shift_logits=False, num_kv_heads=2)
    ids = IDS.clone()
    with torch.no_grad():
        sampled = model(ids, ATTN)
    assert torch.equal(ids, IDS)
    torch.testing.assert_close(sampled, model(IDS, ATTN).detach(), rtol=0, atol=1e-6)
