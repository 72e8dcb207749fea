"""A masked-diffusion LM small enough to enumerate: vocabulary {0, 1, 2, 3} + mask id 4."""

import itertools

import torch

from rlvr.models.diffusion_lm import DiffusionConfig, DiffusionLM
from rlvr.models.likelihood import Corruptor, row_hash

MASK, EOS, PAD = 4, 3, 0
PROMPT = torch.tensor([[1, 2]])


def enumerable_model(seed: int = 0, std: float = 0.6) -> DiffusionLM:
    config = DiffusionConfig(vocab_size=5, mask_token_id=MASK, eos_token_id=EOS, pad_token_id=PAD, hidden_size=16,
                             num_layers=1, num_heads=2, intermediate_size=32, tie_word_embeddings=False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = DiffusionLM(config)
        for p in model.parameters():
            if p.dim() > 1:
                torch.nn.init.normal_(p, std=std)
    return model.eval()


def context(model, ys: torch.Tensor, seed: int = 0) -> Corruptor:
    prompt = PROMPT.expand(ys.shape[0], -1)
    pmask = torch.ones_like(prompt)
    return Corruptor(model=model, prompt_ids=prompt, prompt_mask=pmask, completion_ids=ys,
                     valid=torch.ones_like(ys, dtype=torch.bool), keys=row_hash(prompt, pmask, ys, seed), mask_id=MASK)


@torch.no_grad()
def order_logps(model, ys: torch.Tensor) -> torch.Tensor:
    """(B, L!) Σ_k log p(y_σk | y_σ<k visible, rest masked) for every order σ."""
    ctx = context(model, ys)
    length = ys.shape[1]
    out = []
    for order in itertools.permutations(range(length)):
        total = torch.zeros(ys.shape[0])
        for k, pos in enumerate(order):
            hidden = torch.ones(length, dtype=torch.bool)
            hidden[list(order[:k])] = False
            ell, _ = ctx.denoise(hidden[None, :].expand_as(ys))
            total += ell[:, pos]
        out.append(total)
    return torch.stack(out, -1)


def exact_loglik(model, ys):
    """log π(y|c) of the random-order one-token-per-step sampler: log mean_σ Π_k p(...)."""
    per_order = order_logps(model, ys)
    return per_order.logsumexp(-1) - torch.log(torch.tensor(float(per_order.shape[-1])))


def exact_elbo(model, ys):
    """The any-order ELBO E_σ Σ_k log p(...) (= the discrete masked-diffusion ELBO)."""
    return order_logps(model, ys).mean(-1)


def all_sequences(length: int, vocab: int = 4) -> torch.Tensor:
    return torch.tensor(list(itertools.product(range(vocab), repeat=length)))


@torch.no_grad()
def exact_eubo(model, ys, beta: float) -> torch.Tensor:
    """SPG's per-token EUBO, exactly: Σ_i (1/β) log E_{m~U{1..L}, |M|=m}[(L/m) 1[i∈M] p_i(M)^β]."""
    ctx = context(model, ys)
    length = ys.shape[1]
    acc = torch.zeros(ys.shape, dtype=torch.float64)
    for m in range(1, length + 1):
        subsets = list(itertools.combinations(range(length), m))
        for subset in subsets:
            hidden = torch.zeros(length, dtype=torch.bool)
            hidden[list(subset)] = True
            ell, _ = ctx.denoise(hidden[None, :].expand_as(ys))
            weight = (1 / length) * (length / m) / len(subsets)
            acc += torch.where(hidden[None, :], weight * (beta * ell.double()).exp(), torch.zeros_like(acc))
    return (acc.log() / beta).sum(-1).float()
