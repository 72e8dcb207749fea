"""Block diffusion: the block-causal mask, the x_t ⊕ x_0 training forward against its loop, cached
against uncached sampling, the estimators against exact enumeration (L = 4 in two blocks of 2,
vocabulary 4 + mask), the Fast-dLLM v2 loader on a locally built stand-in, and config errors."""

import dataclasses
import itertools
import json

import pytest
import torch
from _tiny import MASK, PROMPT, all_sequences, enumerable_model
from safetensors.torch import save_file

from rlvr.config import load_config
from rlvr.engines.torch_block_diffusion import generate_block_diffusion
from rlvr.errors import ConfigError
from rlvr.models.block_diffusion import (
    BlockCorruptor,
    as_block_model,
    block_diffusion_loss,
    checkpoint_block_size,
    load_diffusion_or_block_lm,
)
from rlvr.models.diffusion_lm import (
    DiffusionConfig,
    diffusion_tokenizer,
    dream_key,
    load_diffusion_model,
    tiny_diffusion_lm,
)
from rlvr.models.likelihood import ar_order, bgpo, elbo_mc, mean_field, row_hash, spg, trace

CONFIG = DiffusionConfig(vocab_size=12, mask_token_id=11, eos_token_id=10, pad_token_id=0, hidden_size=32,
                         num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=48, tie_word_embeddings=False)
PROMPTS = torch.tensor([[0, 0, 5, 6], [3, 4, 5, 6]])
PMASK = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
SEQS = torch.tensor([[0, 1, 2, 3], [1, 1, 3, 0], [2, 0, 1, 1], [3, 3, 3, 3]])


def block_model(shift: bool = False, block: int = 3, seed: int = 0):
    config = dataclasses.replace(CONFIG, shift_logits=shift, qkv_bias=shift)
    return as_block_model(tiny_diffusion_lm(config, seed=seed), block).eval()


@pytest.mark.parametrize("shift", [False, True])
def test_block_causal_mask_sees_its_block_and_earlier_ones_only(shift):
    model = block_model(shift)
    window = torch.randint(1, 10, (2, 9), generator=torch.Generator().manual_seed(0))
    ids = torch.cat([PROMPTS, window], 1)
    attn = torch.cat([PMASK, torch.ones_like(window)], 1)
    with torch.no_grad():
        base = model(ids, attn, prefix_len=4)
        later = ids.clone()
        later[:, 4 + 6:] = 9  # the last block changed
        out = model(later, attn, prefix_len=4)
        # blocks 1-2 and the prompt do not see block 3 (with shift, block 3's first token reads block 2)
        assert torch.allclose(out[:, :10], base[:, :10], atol=1e-6)
        inside = ids.clone()
        inside[:, 4 + 5] = 9  # the second block's last token: its block-mates see it
        assert not torch.allclose(model(inside, attn, prefix_len=4)[:, 4 + 4], base[:, 4 + 4], atol=1e-4)
        unpadded = model(ids[:1, 2:], attn[:1, 2:], prefix_len=2)
    # left padding changes nothing (but the first prompt logit of a shifted model, which reads a pad column)
    assert torch.allclose(unpadded[:, 1:], base[:1, 3:], atol=1e-5)


@pytest.mark.parametrize("shift", [False, True])
def test_vectorised_x_t_x_0_forward_equals_one_forward_per_block(shift):
    # Each noisy block of the one-pass forward must equal a forward of (prompt, clean earlier blocks, it).
    model = block_model(shift)
    g = torch.Generator().manual_seed(1)
    clean = torch.randint(1, 10, (2, 9), generator=g)
    noisy = torch.where(torch.rand(2, 9, generator=g) < 0.5, torch.full_like(clean, 11), clean)
    attn = torch.cat([PMASK, torch.ones_like(clean)], 1)
    with torch.no_grad():
        wide = model(torch.cat([PROMPTS, noisy], 1), attn, prefix_len=4, clean_ids=clean)[:, 4:]
        for b in range(3):
            lo, hi = 3 * b, 3 * b + 3
            ids = torch.cat([PROMPTS, clean[:, :lo], noisy[:, lo:hi]], 1)
            alone = model(ids, attn[:, :4 + hi], prefix_len=4)[:, 4 + lo:]
            assert torch.allclose(wide[:, lo:hi], alone, atol=1e-5), b


@pytest.mark.parametrize("shift,threshold,remasking", [(False, None, "low_confidence"), (True, None, "margin"),
                                                       (False, 0.2, "low_confidence"), (True, 0.3, "entropy")])
def test_cached_sampling_gives_the_uncached_tokens_with_fewer_columns(shift, threshold, remasking):
    model = block_model(shift).double()  # float64: the two paths' rounding cannot flip a choice
    columns = []
    model.embed_tokens.register_forward_hook(lambda m, args, out: columns.append(args[0].numel()))
    kw = dict(gen_length=9, steps=6, mask_id=11, eos_id=10, threshold=threshold, remasking=remasking,
              temperature=torch.tensor([1.0, 0.0]))
    seeds = torch.tensor([3, 4])
    cached = generate_block_diffusion(model, PROMPTS, PMASK, seeds, **kw)
    cached_cols, columns[:] = sum(columns), []
    plain = generate_block_diffusion(model, PROMPTS, PMASK, seeds, use_cache=False, **kw)
    assert torch.equal(cached.completion_ids, plain.completion_ids)
    assert torch.equal(cached.trace, plain.trace)
    assert torch.allclose(cached.logprobs, plain.logprobs, atol=1e-9)
    assert not bool((cached.completion_ids == 11).any())
    # one prompt prefill + one append per finished block but the last; each forward reads one block
    assert cached.forwards == plain.forwards + 1 + 2
    assert cached_cols < sum(columns)
    if threshold is None:  # 2 steps per block: 2 × 3 forwards of (B, 3) + prompt (B, 4) + 2 appends (B, 3)
        assert cached_cols == 2 * (6 * 3 + 4 + 2 * 3)
        assert sum(columns) == 2 * 2 * (7 + 10 + 13)


# ---------------------------------------------------------------------------- exact enumeration


def enumerable_block_model():
    return as_block_model(enumerable_model(), 2).eval()  # L = 4: two blocks of two


def block_context(model, ys, seed=0):
    prompt = PROMPT.expand(ys.shape[0], -1)
    pmask = torch.ones_like(prompt)
    return BlockCorruptor(model=model, prompt_ids=prompt, prompt_mask=pmask, completion_ids=ys,
                          valid=torch.ones_like(ys, dtype=torch.bool), keys=row_hash(prompt, pmask, ys, seed),
                          mask_id=MASK)


@torch.no_grad()
def block_order_logps(model, ys):
    """(B, 2, 2): for each block and each of its 2 orders, Σ log p(y_σk | y_σ<k, clean earlier blocks)."""
    ctx = block_context(model, ys)
    out = torch.zeros(ys.shape[0], 2, 2)
    for b in range(2):
        for o, order in enumerate(itertools.permutations((2 * b, 2 * b + 1))):
            for k, pos in enumerate(order):
                hidden = torch.zeros(4, dtype=torch.bool)
                hidden[2 * b:] = True  # this block and the later one (which the block mask hides anyway)
                hidden[list(order[:k])] = False
                ell, _ = ctx.denoise(hidden[None, :].expand_as(ys))
                out[:, b, o] += ell[:, pos]
    return out


def exact_block_loglik(model, ys):
    per = block_order_logps(model, ys)
    return (per.logsumexp(-1) - torch.log(torch.tensor(2.0))).sum(-1)


def exact_block_elbo(model, ys):
    return block_order_logps(model, ys).mean(-1).sum(-1)


def _draws(fn, model, ys, seeds, **kw):
    seeds = list(seeds)
    rows = ys.repeat(len(seeds), 1)
    ctx = block_context(model, rows)
    ctx.keys = torch.cat([block_context(model, ys, s).keys for s in seeds])
    with torch.no_grad():
        return fn(ctx, **kw)[0].sum(-1).view(len(seeds), len(ys))


def test_exact_block_likelihood_is_a_distribution_and_the_block_elbo_is_below_it():
    model = enumerable_block_model()
    ys = all_sequences(4)  # 256 sequences
    loglik, elbo = exact_block_loglik(model, ys), exact_block_elbo(model, ys)
    assert abs(float(loglik.exp().sum()) - 1.0) < 1e-4
    assert bool((elbo <= loglik + 1e-6).all())
    assert float((loglik - elbo).max()) > 1e-3


def test_elbo_mc_is_unbiased_for_the_exact_block_elbo_plain_and_antithetic():
    model = enumerable_block_model()
    exact = exact_block_elbo(model, SEQS)
    for antithetic in (False, True):
        draws = _draws(elbo_mc, model, SEQS, range(400), n=1, antithetic=antithetic)
        mean, se = draws.mean(0), draws.std(0) / 400 ** 0.5
        assert bool(((mean - exact).abs() <= 4 * se + 1e-4).all()), (antithetic, mean, exact, se)
    spg_elbo = _draws(spg, model, SEQS, range(200), n=1, bound="elbo")
    mean, se = spg_elbo.mean(0), spg_elbo.std(0) / 200 ** 0.5
    assert bool(((mean - exact).abs() <= 4 * se + 1e-4).all())


def test_ar_order_mean_field_and_trace_are_exact_on_the_block_model():
    model = enumerable_block_model()
    ctx = block_context(model, SEQS)
    logp, _ = ar_order(ctx)
    assert torch.allclose(logp.sum(-1), block_order_logps(model, SEQS)[:, :, 0].sum(-1), atol=1e-5)
    with torch.no_grad():
        mf, _ = mean_field(ctx, p_mask_prompt=0.0)
        # by hand: block 2 all masked with block 1 clean: a plain block-causal forward of [prompt, y_1, y_2, M, M]
        ids = torch.cat([PROMPT.expand(4, -1), SEQS[:, :2], torch.full((4, 2), MASK)], 1)
        logits = model(ids, prefix_len=2)[:, 4:]
        logits[..., MASK] = float("-inf")
        by_hand = logits.log_softmax(-1).gather(-1, SEQS[:, 2:, None]).squeeze(-1)
        # a trace that commits one token per step, left to right, replays to the same values as ar_order
        replay, _ = trace(ctx, trace=torch.arange(4).expand(4, -1))
    assert torch.allclose(mf[:, 2:], by_hand, atol=1e-5)
    assert torch.allclose(replay, logp, atol=1e-5)


def test_bgpo_on_the_block_model_matches_elbo_mc_in_value_and_gradient():
    model = enumerable_block_model()
    adv = torch.tensor([1.0, -0.5, 2.0, -1.0])
    results = []
    for fn in (elbo_mc, bgpo):
        model.zero_grad()
        values, _ = fn(block_context(model, SEQS, seed=5), n=3)
        loss = -(adv[:, None] * values).sum()
        loss.backward()
        results.append((float(loss.detach()), torch.cat([p.grad.flatten() for p in model.parameters()])))
    assert abs(results[0][0] - results[1][0]) < 1e-4
    assert torch.allclose(results[0][1], results[1][1], atol=1e-5)


def test_block_sft_loss_is_the_per_block_elbo_in_closed_form_for_uniform_logits():
    # Zero head: CE = log V on every masked token, so the loss is Σ_masked log V / t_block / L; its
    # expectation over t and the masks is exactly log V (E[1[masked]/t] = 1 per token).
    model = block_model(block=3)
    torch.nn.init.zeros_(model.lm_head.weight)
    window = torch.randint(1, 10, (64, 9), generator=torch.Generator().manual_seed(0))
    prompt, pmask = PROMPTS.repeat(32, 1), PMASK.repeat(32, 1)
    with torch.no_grad():
        losses = [float(block_diffusion_loss(model, prompt, pmask, window, mask_id=11,
                                             generator=torch.Generator().manual_seed(s))) for s in range(40)]
    mean = sum(losses) / len(losses)
    assert abs(mean - torch.log(torch.tensor(12.0)).item()) < 0.1


# ---------------------------------------------------------------------------- loading and config


def test_fast_dllm_v2_format_stand_in_loads_as_a_block_model(tmp_path):
    shifted = dataclasses.replace(CONFIG, qkv_bias=True, shift_logits=True)
    reference = as_block_model(tiny_diffusion_lm(shifted, seed=3), 3).eval()
    state = {dream_key(k): v.clone() for k, v in reference.state_dict().items()}
    assert "model.layers.1.self_attn.q_proj.bias" in state and "lm_head.weight" in state
    save_file(state, str(tmp_path / "model.safetensors"))
    raw = {"model_type": "Fast_dLLM_Qwen", "architectures": ["Fast_dLLM_QwenForCausalLM"], "bd_size": 3,
           "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
           "intermediate_size": 48, "vocab_size": 12, "rope_theta": 10000.0, "rms_norm_eps": 1e-5,
           "tie_word_embeddings": False, "use_sliding_window": False, "eos_token_id": 10, "pad_token_id": 0}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    assert checkpoint_block_size(tmp_path) == 3
    assert load_diffusion_model(tmp_path).config.mask_token_id == 151665  # the released generate()'s default
    (tmp_path / "config.json").write_text(json.dumps({**raw, "mask_token_id": 11}))
    diffusion_tokenizer().save_pretrained(tmp_path)
    loaded, _ = load_diffusion_or_block_lm(str(tmp_path), seed=0)
    assert loaded.config.block_size == 3 and loaded.config.shift_logits and loaded.config.qkv_bias
    ids = torch.cat([PROMPTS, torch.randint(1, 11, (2, 6))], 1)
    attn = torch.cat([PMASK, torch.ones(2, 6, dtype=torch.long)], 1)
    with torch.no_grad():
        assert torch.allclose(loaded.eval()(ids, attn, prefix_len=4), reference(ids, attn, prefix_len=4), atol=1e-6)
    with pytest.raises(ConfigError, match="model.block_size"):
        load_diffusion_or_block_lm(str(tmp_path), seed=0, block_size=4)
    (tmp_path / "config.json").write_text(json.dumps({**raw, "use_sliding_window": True}))
    with pytest.raises(ValueError, match="use_sliding_window"):
        load_diffusion_model(tmp_path)


def test_our_block_checkpoint_round_trips_with_its_block_size(tmp_path):
    model = block_model(block=3, seed=4)
    model.save_pretrained(tmp_path)
    diffusion_tokenizer().save_pretrained(tmp_path)
    assert checkpoint_block_size(tmp_path) == 3
    again, _ = load_diffusion_or_block_lm(str(tmp_path), seed=0)
    ids = torch.cat([PROMPTS, torch.randint(1, 11, (2, 6))], 1)
    with torch.no_grad():
        assert torch.equal(again.eval()(ids, prefix_len=4), model(ids, prefix_len=4))


@pytest.mark.parametrize("overrides,field", [
    (["model.kind=causal", "model.block_size=4"], "model.block_size"),
    (["model.kind=diffusion", "model.block_size=5", "rollout.max_new_tokens=16"], "model.block_size"),
    (["model.kind=diffusion", "model.block_size=4", "rollout.max_new_tokens=16", "rollout.block_length=8"],
     "rollout.block_length"),
])
def test_block_size_config_errors_name_the_field(overrides, field):
    with pytest.raises(ConfigError, match=field):
        load_config(None, overrides)


@pytest.mark.slow
def test_block_recipe_runs_one_step_off_under_the_async_loop(tmp_path, capsys):
    # Staleness 0 reproducing the synchronous run is tests/trainer/test_async.py (block_diffusion case);
    # here η = 1: the recipe trains batches one policy version old, bounded and finite.
    from pathlib import Path

    from rlvr.cli import main

    recipe = Path(__file__).resolve().parents[2] / "recipes/dllm_block_countdown.yaml"
    code = main(["train", str(recipe), "trainer.steps=4", "trainer.max_staleness=1", "trainer.eval_every=0",
                 "trainer.threads=2", "rollout.prompts_per_step=2", "rollout.group_size=4", "trainer.save_every=0",
                 f"trainer.out_dir={tmp_path}", "trainer.name=eta1"])
    assert code == 0, capsys.readouterr().err
    lines = [json.loads(line) for line in (tmp_path / "eta1" / "metrics.jsonl").read_text().splitlines()]
    steps = [line for line in lines if line["step"] > 0]
    assert len(steps) == 4 and all(line["async/staleness"] in (0, 1) for line in steps)
    assert any(line["async/staleness"] == 1 for line in steps)
    assert all(torch.isfinite(torch.tensor(line["loss/policy"])) for line in steps)
    assert json.loads((tmp_path / "eta1" / "run.json").read_text())["status"] == "finished"
