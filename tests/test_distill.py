"""On-policy distillation: the reverse-KL surrogate by hand, its gradient, and its config checks."""

import pytest
import torch

from rlvr.algos.distill import reverse_kl_distill
from rlvr.config import load_config
from rlvr.errors import ConfigError


def test_reverse_kl_distill_hand_vector_and_gradient():
    logp = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    ref = torch.tensor([[-1.5, -1.0, -0.5]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss, metrics = reverse_kl_distill(logp, logp.detach(), torch.zeros(1, 3), mask, ref_logp=ref)
    # on-policy ρ = 1: loss = sg(logp − ref) = (0.5, −1.0), the masked token 0
    assert torch.allclose(loss, torch.tensor([[0.5, -1.0, 0.0]]))
    assert torch.allclose(metrics["teacher_kl"], torch.tensor([[0.5, -1.0, 0.0]]))
    loss.sum().backward()
    # gradient (logp − ref) ∇logp: push down tokens the student over-weights, up those it under-weights
    assert torch.allclose(logp.grad, torch.tensor([[0.5, -1.0, 0.0]]))


def test_reverse_kl_distill_gradient_is_the_token_level_reverse_kl_gradient():
    # one position, categorical student softmax(θ) and teacher q: E_{y~π}[(log π_y − log q_y) ∇ log π_y] = ∇ KL(π||q)
    theta = torch.tensor([0.2, -0.4, 0.9], requires_grad=True)
    q = torch.tensor([0.5, 0.3, 0.2])
    logpi = theta.log_softmax(-1)
    exact, = torch.autograd.grad((logpi.exp() * (logpi - q.log())).sum(), theta)
    total = torch.zeros(3)
    for y in range(3):  # the expectation over the sampled token, each weighted by π(y)
        lp = theta.log_softmax(-1)[y].view(1, 1)
        ref = q.log()[y].view(1, 1)
        loss, _ = reverse_kl_distill(lp, lp.detach(), torch.zeros(1, 1), torch.ones(1, 1), ref_logp=ref)
        g, = torch.autograd.grad(loss.sum(), theta)
        total += float(logpi[y].exp()) * g
    assert torch.allclose(total, exact, atol=1e-6)


def test_the_distillation_recipe_names_a_teacher():
    assert load_config("recipes/dllm_topd_countdown.yaml").model.teacher_path == "rlvr:countdown-dllm-warmstart"
    with pytest.raises(ConfigError, match="model.teacher_path"):
        load_config(None, ["algo.objective=reverse_kl_distill"])


def test_a_teacher_with_another_tokenizer_is_refused_in_one_line(tmp_path):
    from rlvr.builder.build import teacher_model
    from rlvr.models.causal_lm import tiny_llama
    from rlvr.models.tokenizer import char_tokenizer

    student_tok = char_tokenizer()
    for name, tok in (("same", char_tokenizer()), ("other", char_tokenizer("abc0123456789"))):
        tiny_llama(len(tok), hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32, max_seq_len=32,
                   seed=0).save_pretrained(tmp_path / name)
        tok.save_pretrained(tmp_path / name)
    config = load_config(None, [f"model.teacher_path={tmp_path / 'same'}"])
    assert teacher_model(config, student_tok).config.vocab_size == len(student_tok)
    config = load_config(None, [f"model.teacher_path={tmp_path / 'other'}"])
    with pytest.raises(ConfigError, match=r"^model.teacher_path: .* has another tokenizer than the student \(17 vs "
                                          r"101 tokens"):
        teacher_model(config, student_tok)
