"""SPEC-RL on the causal torch engine (`engines.speculative`): with ℓ = 1 the drafted, verified and
continued completions are distributed as the current policy (every outcome of a 2-token window
on a 5-token vocabulary, against its exact probability); an unchanged policy keeps every draft
whole; a hand-built rejection draws its first token from the residual; the config refuses the
engines and tasks it does not cover in one line."""

from __future__ import annotations

import functools
import math

import pytest
import torch

from rlvr.engines.speculative import Draft, SpeculativeRollouts, completion_logdists, verify
from rlvr.engines.torch_ar import generate
from rlvr.models.causal_lm import tiny_llama

V, EOS, PAD, MAX_NEW = 5, 1, 0, 2
PROMPT = [2, 3, 4]


def _model(seed: int):
    """A tiny Llama whose output layer is scaled up: a random init's near-uniform next-token
    distributions would make any two seeds' policies agree almost everywhere."""
    model = tiny_llama(V, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32, max_seq_len=16, seed=seed)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(4.0)
    return model


def _spec(model, **kwargs) -> SpeculativeRollouts:
    sample = functools.partial(generate, model, eos_id=EOS, pad_id=PAD, engine="eager")
    return SpeculativeRollouts(model, sample, max_new_tokens=MAX_NEW, eos_id=EOS, pad_id=PAD, temperature=1.0,
                               **kwargs)


def _prompts(rows: int):
    ids = torch.tensor([PROMPT] * rows)
    return ids, torch.ones_like(ids)


def _outcome_probs(model) -> dict[tuple[int, ...], float]:
    """Exact probability of every completion of at most MAX_NEW tokens (EOS ends one)."""
    ids, mask = _prompts(1)
    first = completion_logdists(model, ids, mask, torch.zeros((1, 1), dtype=torch.long), torch.ones(1, 1), 1.0)
    out = {(EOS,): math.exp(first[0, 0, EOS])}
    for a in range(V):
        if a == EOS:
            continue
        second = completion_logdists(model, ids, mask, torch.tensor([[a, 0]]), torch.ones(1, 2), 1.0)
        for b in range(V):
            out[(a, b)] = math.exp(first[0, 0, a] + second[0, 1, b])
    return out


def _frequencies(out) -> dict[tuple[int, ...], float]:
    counts: dict[tuple[int, ...], float] = {}
    for row, n in zip(out.completion_ids.tolist(), out.lengths.long().tolist()):
        counts[tuple(row[:n])] = counts.get(tuple(row[:n]), 0) + 1 / len(out)
    return counts


@pytest.mark.parametrize("rule", ["residual", "fresh"])
def test_drafted_verified_and_continued_completions_are_drawn_from_the_current_policy(rule):
    """The residual rule matches every outcome's probability; SPEC-RL's fresh first token misses
    at least one by more than 8 standard errors on these policies (the bias the exact test measures)."""
    rows = 4000
    old, new = _model(0), _model(2)
    spec = _spec(old, capacity=rows, rule=rule)
    keys = list(range(rows))  # one independent draft per row, drawn from the old policy
    ids, mask = _prompts(rows)
    spec(keys, ids, mask, torch.arange(rows))
    spec.model, spec.generate = new, functools.partial(generate, new, eos_id=EOS, pad_id=PAD, engine="eager")
    out, metrics = spec(keys, ids, mask, torch.arange(rows) + rows)
    assert metrics["rollout/spec_drafted_frac"] == 1.0
    assert 0.1 < metrics["rollout/spec_accept_frac"] < 0.95  # the two policies differ: some drafts are cut
    exact, seen = _outcome_probs(new), _frequencies(out)
    assert set(seen) <= set(exact) and sum(exact.values()) == pytest.approx(1.0, abs=1e-5)
    # each frequency's distance from its probability in binomial standard errors, over all 21 outcomes
    worst = max(abs(seen.get(y, 0.0) - p) / math.sqrt(p * (1 - p) / rows) for y, p in exact.items())
    if rule == "fresh":
        assert worst > 8
        return
    assert worst < 4.5
    # the recorded log-probs are the current policy's, whichever part of the row they came from
    for row in range(0, rows, 197):
        n = int(out.lengths[row])
        y = tuple(out.completion_ids[row, :n].tolist())
        assert float(out.logprobs[row, :n].sum()) == pytest.approx(math.log(exact[y]), abs=1e-4)


def test_an_unchanged_policy_keeps_every_draft_whole():
    model = _model(0)
    spec = _spec(model)
    ids, mask = _prompts(64)
    first, _ = spec(list(range(64)), ids, mask, torch.arange(64))
    again, metrics = spec(list(range(64)), ids, mask, torch.arange(64) + 1000)  # other seeds: other uniforms
    assert metrics["rollout/spec_accept_frac"] == 1.0 and metrics["rollout/spec_new_tokens"] == 0.0
    assert torch.equal(again.completion_ids, first.completion_ids)
    assert torch.allclose(again.logprobs, first.logprobs, atol=1e-5)
    assert torch.equal(again.truncated, first.truncated)


def test_a_rejected_token_is_replaced_from_the_residual():
    """Draft (a, b): at position 0 the drafting distribution is the current one (ratio 1, always
    kept); at position 1 it put all its mass on b, which the current policy finds less likely, so b
    is kept with probability p(b) and otherwise replaced from (p − q)⁺ ∝ p without b."""
    model, rows, a, b = _model(0), 4000, 2, 3
    ids, mask = _prompts(rows)
    new = completion_logdists(model, ids[:1], mask[:1], torch.tensor([[a, b]]), torch.ones(1, 2), 1.0)[0]
    one_hot = torch.full((V,), -1e9).index_fill(0, torch.tensor([b]), 0.0)
    draft = Draft(torch.tensor([a, b]), torch.stack([new[0], one_hot]))
    v = verify(model, ids, mask, torch.arange(rows), [draft] * rows, temperature=1.0, lenience=1.0,
               rule="residual", eos_id=EOS, pad_id=PAD, max_new_tokens=MAX_NEW)
    p = new[1].exp()
    kept = v.accepted == 2
    assert (v.accepted >= 1).all()
    assert abs(float(kept.float().mean()) - float(p[b])) < 4.5 * math.sqrt(p[b] * (1 - p[b]) / rows)
    replaced = torch.stack([v.ids[i] for i in range(rows) if not kept[i]])
    assert (replaced[:, 0] == a).all() and (replaced[:, 1] != b).all()
    residual = p.clone()
    residual[b] = 0
    residual /= residual.sum()
    for token in range(V):
        share = float((replaced[:, 1] == token).float().mean())
        assert abs(share - float(residual[token])) < 4.5 * math.sqrt(residual[token] * (1 - residual[token])
                                                                     / len(replaced)) + 1e-4
    # the log-prob recorded for the new token is the current policy's, not the residual's
    i = int((~kept).nonzero()[0])
    assert float(v.logp[i][1]) == pytest.approx(float(new[1, int(v.ids[i][1])]), abs=1e-6)


def test_lenience_keeps_more_of_a_stale_draft():
    old, new = _model(0), _model(2)
    spec = _spec(old, capacity=2000)
    ids, mask = _prompts(2000)
    spec(list(range(2000)), ids, mask, torch.arange(2000))
    cached = [spec.cache.get(k) for k in range(2000)]
    fracs = []
    for lenience in (1.0, 3.0):
        v = verify(new, ids, mask, torch.arange(2000) + 5000, cached, temperature=1.0, lenience=lenience,
                   rule="residual", eos_id=EOS, pad_id=PAD, max_new_tokens=MAX_NEW)
        fracs.append(float(v.accepted.sum()) / v.draft_tokens)
    assert fracs[1] > fracs[0] + 0.05


def test_the_cache_keeps_the_most_recent_completions():
    model = _model(0)
    spec = _spec(model, capacity=3)
    ids, mask = _prompts(5)
    spec(list("abcde"), ids, mask, torch.arange(5))
    assert list(spec.cache.drafts) == ["c", "d", "e"]


@pytest.mark.parametrize("override, field", [
    ("rollout.engine=vllm", "rollout.speculative"),
    ("model.kind=diffusion", "rollout.speculative"),
    ("task.name=agent_guess", "rollout.speculative"),
    ("rollout.top_p=0.9", "rollout.speculative"),
    ("rollout.micro_group_size=4", "rollout.micro_group_size"),
    ("trainer.max_staleness=1", "rollout.speculative"),
    ("rollout.spec_lenience=0.5", "rollout.spec_lenience"),
    ("rollout.spec_first_token=greedy", "rollout.spec_first_token"),
])
def test_config_errors_name_the_field_in_one_line(override, field):
    from rlvr.config import load_config
    from rlvr.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        load_config(None, ["rollout.speculative=true", override])
    message = str(err.value)
    assert message.startswith(f"{field}:") and "\n" not in message, message


def test_a_finite_train_set_is_not_for_source_curricula():
    from rlvr.config import load_config
    from rlvr.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^task.train_size: sampler dump"):
        load_config(None, ["task.train_size=8", "sampler.name=dump"])
