"""The samplers' decision rules on hand vectors, budget conservation, the DAPO filter, RNG
isolation and exact resume of every sampler's state from a scripted run."""

from __future__ import annotations

import copy
import itertools
import math
import random

import pytest
import torch

from rlvr.config import keywords
from rlvr.sampling import SAMPLERS
from rlvr.sampling.base import GroupFeedback, ZeroVariance
from rlvr.sampling.budgets import (
    CoBA,
    coba_gain,
    coba_value,
    greedy_allocation,
    gvm_sigma,
    informative_chance,
    proportional_allocation,
)
from rlvr.sampling.selection import VADE, aged, most_informative
from rlvr.sampling.sources import mean_abs_advantage, source_mix, ucb_scores
from rlvr.types import Example

G = 4


class Buckets:
    """A synthetic sourced task: source s holds prompts s/0..s/99 with success rate RATES[s]."""

    sources = ("easy", "half", "hard")
    RATES = {"easy": 1.0, "half": 0.5, "hard": 0.0}

    def _draw(self, source, rng):
        return Example(prompt=f"{source}/{rng.randrange(100)}", answer="", meta={"source": source})

    def sample(self, n, rng):
        return [self._draw(rng.choice(self.sources), rng) for _ in range(n)]

    def sample_source(self, source, n, rng):
        return [self._draw(source, rng) for _ in range(n)]


def rate(prompt_id: str) -> float:
    """Per-prompt success rate of `Buckets`: the bucket's, spread by the prompt number for the half bucket."""
    source, i = prompt_id.split("/")
    return Buckets.RATES[source] if source != "half" else int(i) / 100


def scripted(step, requests, rng):
    """Bernoulli verdicts at each prompt's known rate; binary rewards."""
    out = []
    for req in requests:
        c = tuple(float(rng.random() < rate(req.prompt_id)) for _ in range(req.n_rollouts))
        out.append(GroupFeedback(req.prompt_id, req.source, step, step - 1, c, c, (False,) * len(c),
                                 7 * len(c), True))
    return out


def make(name, draws, seed=0):
    cls = SAMPLERS[name]
    seeded = {"seed": seed} if "seed" in keywords(cls) else {}  # uniform draws with the run's RNG only
    return cls(task=Buckets(), rng=draws, group_size=G, **seeded)


# --- hand vectors -----------------------------------------------------------------------------

def test_vade_aging_and_information_ranking():
    # 3 steps unseen at time_decay 0.5 keep 1/8 of the evidence above the prior Beta(1, 1):
    # α = 1 + (9 − 1)/8 = 2, β = 1 + (17 − 1)/8 = 3.
    assert aged(9.0, 17.0, 3, time_decay=0.5) == pytest.approx((2.0, 3.0), abs=1e-12)
    assert aged(9.0, 17.0, 0, time_decay=0.5) == (9.0, 17.0)
    # p(1 − p): 0.5 → 0.25, 0.4 and 0.6 → 0.24 (tie: the earlier), 0.9 → 0.09, 0.0 → 0
    assert most_informative([0.9, 0.6, 0.5, 0.0, 0.4], 2) == [1, 2]
    assert most_informative([0.9, 0.6, 0.5, 0.0, 0.4], 3) == [1, 2, 4]


def test_vade_observation_updates_the_aged_posterior():
    v = VADE(task=Buckets(), rng=random.Random(0), group_size=G, seed=0, decay=1.0, time_decay=0.5)

    def fb(step, s):
        return GroupFeedback("half/1", "half", step, step, (0.0,) * 4, (1.0,) * s + (0.0,) * (4 - s),
                             (False,) * 4, 0, True)

    v.observe(1, [fb(1, 3)])  # (1 + 3, 1 + 1) = (4, 2)
    assert v.table.rows["half/1"] == [4.0, 2.0, 1]
    v.observe(3, [fb(3, 0)])  # aged 2 steps: (1 + 3/4, 1 + 1/4) = (1.75, 1.25), then + (0, 4)
    assert v.table.rows["half/1"] == pytest.approx([1.75, 5.25, 3])


def test_dump_learnability_ucb_and_mix():
    assert mean_abs_advantage((1.0, 0.0, 0.0, 0.0)) == pytest.approx(0.375)  # |r − 0.25|: 0.75, 0.25×3 → 1.5/4
    assert mean_abs_advantage((1.0, 1.0, float("nan"))) == 0.0
    # N = 4: bonus sqrt(2 ln 4 / n); n = 1 → 1.6651, n = 3 → 0.9613
    scores = ucb_scores([0.5, 0.1], [1, 3], 1.0)
    assert scores == pytest.approx([0.5 + math.sqrt(2 * math.log(4)), 0.1 + math.sqrt(2 * math.log(4) / 3)])
    assert ucb_scores([0.2, 0.0], [2, 0], 1.0)[1] == math.inf
    assert source_mix([1.0, math.inf, math.inf], 0.1) == [0.0, 0.5, 0.5]
    # softmax((1, 0)/0.5) = (e², 1)/(e² + 1)
    assert source_mix([1.0, 0.0], 0.5) == pytest.approx([math.e ** 2 / (math.e ** 2 + 1), 1 / (math.e ** 2 + 1)])


def test_gvm_proportional_allocation_vectors():
    assert gvm_sigma(0.2) == pytest.approx(2.0)  # sqrt(0.8/0.2)
    assert gvm_sigma(0.5) == pytest.approx(1.0)
    assert proportional_allocation([1.0, 3.0, 0.0, 0.0], 4) == [1, 3, 0, 0]
    assert proportional_allocation([1.0, 1.0, 1.0], 4) == [2, 1, 1]  # remainders tie: the lower index
    # the cap moves what is over it to the others, by weight
    assert proportional_allocation([10.0, 1.0, 1.0], 6, cap=2) == [2, 2, 2]
    assert proportional_allocation([0.0, 0.0], 3) == [2, 1]


def test_coba_value_and_gain_vectors():
    assert informative_chance(0.5, 4) == pytest.approx(1 - 2 / 16)
    # failure rate 0.75, κ = 4: a = 4, c = 2 → V(p) = p³(1 − p), mode 0.75
    assert coba_value(0.5, 0.75, 4.0) == pytest.approx(0.0625)
    assert coba_value(0.75, 0.75, 4.0) > coba_value(0.5, 0.75, 4.0) > coba_value(0.25, 0.75, 4.0)
    # miss = 1 − q = 0.125 at p = 0.5, G = 4: first group 0.0625·0.875, second 0.0625·0.125·0.875
    assert coba_gain(0.5, 0, failure_rate=0.75, concentration=4.0, group_size=4) == pytest.approx(0.0625 * 0.875)
    assert coba_gain(0.5, 1, failure_rate=0.75, concentration=4.0, group_size=4) == pytest.approx(
        0.0625 * 0.125 * 0.875)


def test_heap_greedy_equals_brute_force_on_concave_gains():
    values = [0.9, 0.5, 0.3, 0.7, 0.2, 0.6]
    ps = [0.3, 0.8, 0.05, 0.5, 0.6, 0.15]

    def gain(i, b):
        return coba_gain(ps[i], b, failure_rate=0.4, concentration=3.0, group_size=4) * values[i]

    def total(budgets):
        return sum(gain(i, k) for i, b in enumerate(budgets) for k in range(b))

    got = greedy_allocation(gain, 6, 7, cap=3)
    best = max((b for b in itertools.product(range(4), repeat=6) if sum(b) == 7), key=total)
    assert sum(got) == 7 and total(got) == pytest.approx(total(best))


def test_budget_samplers_conserve_the_budget_in_whole_groups():
    doubled = {}
    for name in ("gvm", "coba"):
        # one candidate per slot: the slots are shared among the prompts it would roll out anyway
        s = SAMPLERS[name](task=Buckets(), rng=random.Random(1), group_size=G, seed=0, candidates=1.0)
        rng = random.Random(2)
        doubled[name] = 0
        for step in range(1, 30):
            reqs = s.propose(step, 5, 5 * G)
            assert sum(r.n_rollouts for r in reqs) == 5 * G
            assert all(r.n_rollouts % G == 0 and 0 < r.n_rollouts <= 2 * G for r in reqs)
            doubled[name] += sum(r.n_rollouts == 2 * G for r in reqs)
            s.observe(step, scripted(step, reqs, rng))
    assert doubled["gvm"] > 0 and doubled["coba"] > 0, doubled


def test_coba_failure_average_moves_the_peak():
    c = CoBA(task=Buckets(), rng=random.Random(0), group_size=G, seed=0, ema=0.5)
    fail = [GroupFeedback("hard/1", "hard", 1, 0, (0.0,) * 4, (0.0,) * 4, (False,) * 4, 0, False)]
    c.observe(1, fail)  # F̄ = 0.5·0.5 + 0.5·1
    assert c.failure_rate == pytest.approx(0.75)


# --- the filter -------------------------------------------------------------------------------

def test_zero_variance_filter_keeps_varied_groups_and_refills_to_its_cap():
    f = ZeroVariance(max_rounds=3)
    rewards = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    assert f.keep(rewards, rewards, 4).tolist() == [False, True, False]
    assert f.refill(kept_groups=1, wanted_groups=3, rounds_done=1)
    assert not f.refill(kept_groups=3, wanted_groups=3, rounds_done=1)
    assert not f.refill(kept_groups=1, wanted_groups=3, rounds_done=3)


# --- curricula on a known pool ----------------------------------------------------------------

def bucket_counts(sampler, feedback_rng, *, steps: int, warmup: int, n: int) -> dict[str, int]:
    """Prompts drawn from each bucket after `warmup` of `steps` steps of `n` prompts with scripted verdicts."""
    drawn = {k: 0 for k in Buckets.sources}
    for step in range(1, steps + 1):
        reqs = sampler.propose(step, n, n * G)
        for r in reqs if step > warmup else ():
            drawn[r.source] += 1
        sampler.observe(step, scripted(step, reqs, feedback_rng))
    return drawn


def test_dump_favours_the_learnable_source_and_keeps_a_floor():
    # always solved, never solved, and a bucket spread over (0, 1): the last gives |A| > 0
    s = make("dump", random.Random(3))
    drawn = bucket_counts(s, random.Random(4), steps=60, warmup=20, n=8)
    assert drawn["half"] > 0.5 * sum(drawn.values()), drawn
    assert s.counts["easy"] > 0 and s.counts["hard"] > 0  # the bonus keeps re-testing the dead ones


# --- RNG isolation and exact resume ------------------------------------------------------------

def _run(sampler, draws, feedback_rng, steps, start=1):
    proposals = []
    for step in range(start, start + steps):
        reqs = sampler.propose(step, 6, 6 * G)
        proposals.append([(r.prompt_id, r.n_rollouts, r.source) for r in reqs])
        sampler.observe(step, scripted(step, reqs, feedback_rng))
    return proposals


@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_resumed_sampler_proposes_what_the_uninterrupted_one_proposes(name):
    draws, fb = random.Random(11), random.Random(12)
    straight = make(name, draws, seed=5)
    whole = _run(straight, draws, fb, 20)

    draws, fb = random.Random(11), random.Random(12)
    first = make(name, draws, seed=5)
    head = _run(first, draws, fb, 10)
    saved = copy.deepcopy((first.state_dict(), draws.getstate(), fb.getstate()))
    state, draw_state, fb_state = saved
    draws2, fb2 = random.Random(), random.Random()  # a fresh process: nothing shared with the first
    draws2.setstate(draw_state)
    fb2.setstate(fb_state)
    resumed = make(name, draws2, seed=999)  # the seed must not matter: the state carries the generator
    resumed.load_state_dict(state)
    tail = _run(resumed, draws2, fb2, 10, start=11)
    assert head + tail == whole
    assert resumed.state_dict() == straight.state_dict()


@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_global_rng_calls_do_not_change_proposals(name):
    draws, fb = random.Random(21), random.Random(22)
    quiet = _run(make(name, draws), draws, fb, 5)
    draws, fb = random.Random(21), random.Random(22)
    s = make(name, draws)
    noisy = []
    for step in range(1, 6):
        random.seed(step)
        torch.manual_seed(step)
        noisy += _run(s, draws, fb, 1, start=step)
    assert noisy == quiet


# --- DOTS -------------------------------------------------------------------------------------

def test_dots_embedding_and_attention_vectors():
    from rlvr.sampling.predictive import embed, predicted_rates

    e = embed("abab", 1024)  # bigrams ab, ba, ab: counts 2 and 1 → norm sqrt(5)
    assert sorted(e[e > 0].tolist()) == pytest.approx([1 / math.sqrt(5), 2 / math.sqrt(5)])
    keys = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    rates = torch.tensor([0.9, 0.1], dtype=torch.float64)
    # query = key 0, τ = 1: weights softmax(1, 0) = (e, 1)/(e + 1)
    got = predicted_rates(torch.tensor([[1.0, 0.0]], dtype=torch.float64), keys, rates, 1.0)
    assert got.item() == pytest.approx((0.9 * math.e + 0.1) / (math.e + 1))
    # a small τ makes it the nearest key's rate
    assert predicted_rates(torch.tensor([[0.0, 1.0]], dtype=torch.float64), keys, rates, 0.01).item() == \
        pytest.approx(0.1)


def test_dots_prefers_prompts_that_look_like_half_solved_ones():
    drawn = bucket_counts(make("dots", random.Random(5)), random.Random(6), steps=40, warmup=10, n=6)
    # uniform draws would give each bucket a third; the 2 reference slots of 6 stay random
    assert drawn["half"] > 0.5 * sum(drawn.values()), drawn


def test_spearman_vectors_and_calibration_metric():
    from rlvr.sampling.selection import MoPPS, ranks, spearman

    assert ranks([0.5, 0.1, 0.5]) == [2.5, 1.0, 2.5]
    assert spearman([1, 2, 3], [30, 20, 10]) == pytest.approx(-1.0)
    # ranks (1, 2, 3, 4) against (1, 3, 2, 4): 1 − 6·Σd²/(n(n²−1)) = 1 − 6·2/60 = 0.8
    assert spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
    assert spearman([1, 1], [0, 1]) is None
    m = MoPPS(task=Buckets(), rng=random.Random(0), group_size=4, seed=0, decay=1.0)

    def fb(prompt, step, s):
        return GroupFeedback(prompt, "", step, 0, (0.0,) * 4, (1.0,) * s + (0.0,) * (4 - s), (False,) * 4, 0, True)

    m.observe(1, [fb("a", 1, 4), fb("b", 1, 0), fb("c", 1, 2)])
    assert "sampler/calibration_spearman" not in m.metrics()  # all predictions were the prior's 0.5
    m.observe(2, [fb("a", 2, 3), fb("b", 2, 1), fb("c", 2, 2)])  # means 5/6, 1/6, 1/2 rank as observed
    assert m.metrics()["sampler/calibration_spearman"] == pytest.approx(1.0)
