"""Samplers that reallocate a fixed rollout budget between prompts: GVM-RAFT and CoBA-RL.

Both draw `candidates × P` candidates, estimate each one's success rate p̂ from its Beta
posterior (the MoPPS table: no pre-sampling) and share the step's `P` group slots among them;
a candidate given 0 slots is not rolled out, one given `b` is rolled out `b·G` times (`b`
groups of the same prompt: the loop's advantages normalise over groups of `G`). The total is
conserved: `Σ n_rollouts = budget`.

GVM-RAFT (arXiv:2505.02391) minimises the variance of the gradient
estimate under the budget: with a per-prompt variance σᵢ²/nᵢ the optimum is nᵢ ∝ σᵢ. Deviations:
1. σᵢ = sqrt((1 − p̂ᵢ)/p̂ᵢ), the rejection-sampling term; the per-prompt gradient norm is taken
   as 1 (no extra backward per prompt).
2. p̂ comes from the posterior of past groups instead of a pre-sampling stage; at most
   `max_groups` slots per prompt keep a never-solved prompt from taking the whole step.

CoBA-RL (arXiv:2602.03048) values prompt i with budget b as V(p̂ᵢ)·(1 − (1 − qᵢ)^b), where qᵢ is
the chance a group of G is informative, 1 − p̂ᵢ^G − (1 − p̂ᵢ)^G, and V(p) ∝ p^(a−1)(1 − p)^(c−1)
is a Beta-shaped curve whose mode follows the batch failure rate F̄ (an EMA): a policy that fails
often values easy prompts, one that succeeds values hard ones. Slots go one at a time to the
largest marginal gain (heap greedy, optimal for diminishing gains). Deviation: the mode is F̄
itself with concentration `concentration` (a = 1 + κF̄, c = 1 + κ(1 − F̄)); the paper's mapping
from the failure rate to the shape is not reproduced.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable

from rlvr.sampling.base import GroupFeedback, Request, source_of
from rlvr.sampling.selection import PosteriorSampler


def greedy_allocation(gain: Callable[[int, int], float], n_items: int, total: int, *,
                      cap: int | None = None) -> list[int]:
    """Budgets (n_items,) summing to `total`: each unit goes to the item with the largest marginal
    `gain(i, b)` of its (b+1)-th unit (ties: the lower index); items at `cap` take no more."""
    budgets = [0] * n_items
    heap = [(-gain(i, 0), i) for i in range(n_items)]
    heapq.heapify(heap)
    for _ in range(total):
        if not heap:  # every item at its cap
            break
        _, i = heapq.heappop(heap)
        budgets[i] += 1
        if cap is None or budgets[i] < cap:
            heapq.heappush(heap, (-gain(i, budgets[i]), i))
    return budgets


def proportional_allocation(weights: list[float], total: int, *, cap: int | None = None) -> list[int]:
    """Integer budgets ∝ `weights` summing to `total` (largest remainder, ties: the lower index),
    none above `cap`; all-zero weights share evenly."""
    n = len(weights)
    budgets, free = [0] * n, list(range(n))
    left = total
    while left and free:
        w = [weights[i] for i in free]
        if sum(w) <= 0:
            w = [1.0] * len(free)
        exact = [left * x / sum(w) for x in w]
        share = [math.floor(e) for e in exact]
        order = sorted(range(len(free)), key=lambda j: (-(exact[j] - share[j]), j))
        for j in order[:left - sum(share)]:
            share[j] += 1
        for j, i in enumerate(free):
            budgets[i] += share[j]
        left = 0
        if cap is not None:
            left = sum(max(b - cap, 0) for b in budgets)
            budgets = [min(b, cap) for b in budgets]
            free = [i for i in free if budgets[i] < cap and weights[i] > 0] or [i for i in free if budgets[i] < cap]
    return budgets


def gvm_sigma(p: float) -> float:
    """GVM's per-prompt standard deviation of a rejection-sampling estimate: sqrt((1 − p)/p)."""
    return math.sqrt((1 - p) / p)


def informative_chance(p: float, group_size: int) -> float:
    """Probability that a group of `group_size` binary verdicts at rate `p` is not all equal."""
    return 1 - p ** group_size - (1 - p) ** group_size


def coba_value(p: float, failure_rate: float, concentration: float) -> float:
    """CoBA's Beta-shaped value of a prompt at success rate `p`, its mode at the failure rate."""
    a, c = 1 + concentration * failure_rate, 1 + concentration * (1 - failure_rate)
    return p ** (a - 1) * (1 - p) ** (c - 1)


def coba_gain(p: float, b: int, *, failure_rate: float, concentration: float, group_size: int) -> float:
    """Marginal value of the (b+1)-th group of a prompt: V(p)·[(1 − q)^b − (1 − q)^(b+1)]."""
    miss = 1 - informative_chance(p, group_size)
    return coba_value(p, failure_rate, concentration) * (miss ** b - miss ** (b + 1))


class Allocating(PosteriorSampler):
    """The budget samplers' proposal: candidates in a random order, slots from `allocate`."""

    last_groups = 0.0  # the most groups one prompt got in the latest proposal (a metric)

    def allocate(self, rates: list[float], slots: int) -> list[int]:
        raise NotImplementedError

    def propose(self, step: int, n_prompts: int, budget: int) -> list[Request]:
        cands = self.draw_candidates(n_prompts)
        self.rng.shuffle(cands)  # equal estimates (unseen prompts) get slots in a random order
        slots = self.allocate([self.table.mean(ex.prompt) for ex in cands], n_prompts)
        self.last_groups = float(max(slots))
        return [Request(ex, b * self.group_size, source_of(ex)) for ex, b in zip(cands, slots) if b]

    def metrics(self) -> dict[str, float]:
        return {**super().metrics(), "sampler/max_groups_per_prompt": self.last_groups}


class GVM(Allocating):
    """Group slots ∝ sqrt((1 − p̂)/p̂) over the candidates, at most `max_groups` each."""

    stream = "gvm"

    def __init__(self, *, candidates: float = 2.0, decay: float = 0.5, max_groups: int = 2, **common):
        super().__init__(candidates=candidates, decay=decay, **common)
        self.max_groups = max_groups

    def allocate(self, rates: list[float], slots: int) -> list[int]:
        return proportional_allocation([gvm_sigma(p) for p in rates], slots, cap=self.max_groups)


class CoBA(Allocating):
    """Heap-greedy group slots on CoBA's saturating value, its peak following the failure EMA."""

    stream = "coba"

    def __init__(self, *, candidates: float = 2.0, decay: float = 0.5, max_groups: int = 2,
                 concentration: float = 4.0, ema: float = 0.9, **common):
        super().__init__(candidates=candidates, decay=decay, **common)
        self.max_groups, self.concentration, self.ema = max_groups, concentration, ema
        self.failure_rate = 0.5  # F̄ before any feedback: the peak in the middle

    def allocate(self, rates: list[float], slots: int) -> list[int]:
        def gain(i: int, b: int) -> float:
            return coba_gain(rates[i], b, failure_rate=self.failure_rate, concentration=self.concentration,
                             group_size=self.group_size)
        return greedy_allocation(gain, len(rates), slots, cap=self.max_groups)

    def observe(self, step: int, feedback: list[GroupFeedback]) -> None:
        super().observe(step, feedback)
        n = sum(f.n_rollouts for f in feedback)
        if n:
            batch_failure = 1 - sum(f.successes for f in feedback) / n
            self.failure_rate = self.ema * self.failure_rate + (1 - self.ema) * batch_failure

    def metrics(self) -> dict[str, float]:
        return {**super().metrics(), "sampler/failure_ema": self.failure_rate}

    def state_dict(self) -> dict:
        return {**super().state_dict(), "failure_rate": self.failure_rate}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.failure_rate = state["failure_rate"]
