"""SPEC-RL's verification: the acceptance rule on hand vectors, and on a tabular policy over all
27 sequences of 3 tokens the distribution of verified-and-continued drafts, exactly (by
enumeration) and by sampling through `accepted_prefix`: drawn from the current policy with the
residual first token, biased with a fresh one."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from rlvr.sampling.speculative import accepted_prefix, first_token_probs

V, L = 3, 3


def test_accepted_prefix_hand_vector():
    # ratios π_new/π_old per token: row 0: 1, 0.5, 2 ; u = 0.9, 0.4, 0.99 -> 0.9 < 1 ok, 0.4 < 0.5 ok, 0.99 < 1 ok -> 3
    # row 1: 0.5, 1, 1 ; u = 0.6 -> rejected at 0 -> 0.  row 2: masked after 2 tokens, ratio 0.25 at t=1, u = 0.3 -> 1
    new = torch.log(torch.tensor([[0.2, 0.1, 0.4], [0.1, 0.5, 0.5], [0.3, 0.1, 0.5]]))
    old = torch.log(torch.tensor([[0.2, 0.2, 0.2], [0.2, 0.5, 0.5], [0.3, 0.4, 0.5]]))
    mask = torch.tensor([[1, 1, 1], [1, 1, 1], [1, 1, 0]])
    u = torch.tensor([[0.9, 0.4, 0.99], [0.6, 0.1, 0.1], [0.5, 0.3, 0.0]])
    n, m = accepted_prefix(new, old, mask, u)
    assert n.tolist() == [3, 0, 1]
    assert m["speculative/accepted_frac"] == pytest.approx(4 / 8)
    assert m["speculative/full_accept_frac"] == pytest.approx(1 / 3)
    # lenience ℓ = 2 doubles every ratio: row 1's 0.5 -> 1 (accepted), row 2's 0.25 -> 0.5 (0.3 < 0.5, accepted)
    assert accepted_prefix(new, old, mask, u, lenience=2.0)[0].tolist() == [3, 3, 2]
    # the deterministic limit: a draft from the current policy itself is always kept whole
    assert accepted_prefix(new, new, mask, torch.full_like(u, 0.999999))[0].tolist() == [3, 3, 2]


def _tables(seed: int) -> torch.Tensor:
    """(V^0 + V^1 + V^2 contexts, V) next-token distributions, indexed by the prefix tuple."""
    g = torch.Generator().manual_seed(seed)
    return {prefix: torch.softmax(2 * torch.randn(V, generator=g), -1)
            for t in range(L) for prefix in itertools.product(range(V), repeat=t)}


def _seq_prob(table, y) -> float:
    return math.prod(float(table[tuple(y[:t])][y[t]]) for t in range(L))


def _exact_output(p, q, rule: str) -> dict[tuple, float]:
    """The distribution of the verified-and-continued completion, by enumeration."""
    out = dict.fromkeys(itertools.product(range(V), repeat=L), 0.0)
    for y in out:
        reach = _seq_prob(q, y)  # the draft y
        for k in range(L + 1):
            if k == L:
                out[y] += reach  # all accepted
                break
            ratio = min(1.0, float(p[y[:k]][y[k]] / q[y[:k]][y[k]]))
            first = first_token_probs(p[y[:k]][None], q[y[:k]][None], rule=rule)[0]
            for a in range(V):
                for rest in itertools.product(range(V), repeat=L - k - 1):
                    z = (*y[:k], a, *rest)
                    out[z] += reach * (1 - ratio) * float(first[a]) * math.prod(
                        float(p[z[:t]][z[t]]) for t in range(k + 1, L))
            reach *= ratio
    return out


def _tv(a: dict, b: dict) -> float:
    return 0.5 * sum(abs(a[k] - b[k]) for k in a)


def test_residual_first_token_is_exactly_on_policy_and_fresh_is_not():
    p, q = _tables(0), _tables(1)
    target = {y: _seq_prob(p, y) for y in itertools.product(range(V), repeat=L)}
    assert _tv(_exact_output(p, q, "residual"), target) < 1e-6
    # SPEC-RL's reading at ℓ = 1 is biased: total variation 0.032 from π_new on these tables, exactly
    assert _tv(_exact_output(p, q, "fresh"), target) == pytest.approx(0.0319, abs=5e-4)


@pytest.mark.slow
def test_sampled_drafts_through_accepted_prefix_match_the_current_policy():
    # 40k drafts from q, verified by accepted_prefix, continued with the residual rule then from p.
    p, q = _tables(0), _tables(1)
    g = torch.Generator().manual_seed(2)
    n_draws = 40_000

    def draw(table, prefixes):
        probs = torch.stack([table[tuple(x)] for x in prefixes])
        return torch.multinomial(probs, 1, generator=g).squeeze(-1).tolist()

    drafts = [[] for _ in range(n_draws)]
    for _ in range(L):
        for row, tok in zip(drafts, draw(q, drafts)):
            row.append(tok)
    new = torch.log(torch.tensor([[float(p[tuple(y[:t])][y[t]]) for t in range(L)] for y in drafts]))
    old = torch.log(torch.tensor([[float(q[tuple(y[:t])][y[t]]) for t in range(L)] for y in drafts]))
    n, m = accepted_prefix(new, old, torch.ones(n_draws, L), torch.rand(n_draws, L, generator=g))
    out = []
    for y, k in zip(drafts, n.tolist()):
        z = list(y[:k])
        if k < L:
            first = first_token_probs(p[tuple(z)][None], q[tuple(z)][None], rule="residual")[0]
            z.append(int(torch.multinomial(first, 1, generator=g)))
        while len(z) < L:
            z.append(draw(p, [z])[0])
        out.append(tuple(z))
    empirical = {y: out.count(y) / n_draws for y in itertools.product(range(V), repeat=L)}
    target = {y: _seq_prob(p, y) for y in empirical}
    assert _tv(empirical, target) < 0.03  # sampling noise at 40k draws over 27 cells is ~0.01
    assert 0.2 < m["speculative/accepted_frac"] < 0.9  # the tokens the draft saved


def test_unknown_first_token_rule():
    with pytest.raises(ValueError, match="expected one of"):
        first_token_probs(torch.ones(1, 2) / 2, torch.ones(1, 2) / 2, rule="greedy")
