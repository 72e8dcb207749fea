"""Per-prompt posterior samplers: MoPPS and VADE.

MoPPS (Model Predictive Prompt Selection, arXiv:2507.04632) keeps a Beta posterior over each
prompt's success rate, fed by the verifier's verdicts on that prompt's past groups at no extra
rollout cost. Each step draws `candidates × P` candidates from the task, samples a success rate
for each from its posterior (Thompson sampling) and rolls out the `P` whose sampled rate is
closest to the target (0.5: the rate at which a group is most likely to have varying rewards,
i.e. a non-zero GRPO advantage). A prompt never seen has the prior Beta(1, 1), so new prompts
are tried at random. The update discounts old evidence toward the prior (factor λ per
observation), since the policy that produced it has moved:
α ← λα + (1-λ)α₀ + s,  β ← λβ + (1-λ)β₀ + f.

VADE (Variance-Aware Dynamic sampling, arXiv:2511.18902) keeps the same posteriors and draws,
and ranks candidates by the information of a group at the drawn rate, p̃(1 − p̃), taking the top
`P`. Deviations:
1. Its two-scale prior decay is read as the per-observation λ above plus a per-step decay
   `time_decay ** (steps since last observed)` of the evidence toward the prior, so a prompt
   not seen for a while regains a wide posterior; the paper's exact form is not reproduced.
2. The score is p̃(1 − p̃) (the group-variance shape); its information-gain objective is not.
"""

from __future__ import annotations

import random

from rlvr.protocols import Task
from rlvr.sampling.base import GroupFeedback, Request, spread

PRIOR = (1.0, 1.0)  # Beta(α₀, β₀): uniform


def posterior_update(alpha: float, beta: float, successes: float, failures: float, *,
                     decay: float, prior: tuple[float, float] = PRIOR) -> tuple[float, float]:
    """MoPPS conjugate update with forgetting: (α, β) after observing `successes` and `failures`."""
    a0, b0 = prior
    return (decay * alpha + (1 - decay) * a0 + successes,
            decay * beta + (1 - decay) * b0 + failures)


def aged(alpha: float, beta: float, elapsed: int, *, time_decay: float,
         prior: tuple[float, float] = PRIOR) -> tuple[float, float]:
    """VADE's slow scale: evidence shrunk toward the prior by `time_decay ** elapsed` steps."""
    a0, b0 = prior
    keep = time_decay ** max(elapsed, 0)
    return a0 + keep * (alpha - a0), b0 + keep * (beta - b0)


def closest_to_target(rates: list[float], n: int, target: float) -> list[int]:
    """Indices of the `n` rates nearest `target` (ties: the earlier index), in candidate order."""
    ranked = sorted(range(len(rates)), key=lambda i: (abs(rates[i] - target), i))
    return sorted(ranked[:n])


def most_informative(rates: list[float], n: int) -> list[int]:
    """Indices of the `n` rates with the largest p(1 − p) (ties: the earlier index), in candidate order."""
    ranked = sorted(range(len(rates)), key=lambda i: (-rates[i] * (1 - rates[i]), i))
    return sorted(ranked[:n])


def ranks(values: list[float]) -> list[float]:
    """1-based ranks, ties sharing their average rank: [0.5, 0.1, 0.5] -> [2.5, 1.0, 2.5]."""
    order = sorted(range(len(values)), key=values.__getitem__)
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in order[i:j + 1]:
            out[k] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(x: list[float], y: list[float]) -> float | None:
    """Spearman's ρ (Pearson correlation of the tie-averaged ranks); None when either side is constant."""
    rx, ry = ranks(x), ranks(y)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx, syy = sum((a - mx) ** 2 for a in rx), sum((b - my) ** 2 for b in ry)
    return sxy / (sxx * syy) ** 0.5 if sxx > 0 and syy > 0 else None


def num_candidates(n: int, candidates: float) -> int:
    """Candidates drawn for `n` slots: `candidates × n`, never fewer than `n`."""
    return max(n, round(n * candidates))


class PosteriorTable:
    """prompt id -> [α, β, step last observed]: the Beta posteriors, as plain data."""

    def __init__(self, decay: float):
        self.decay = decay
        self.rows: dict[str, list[float]] = {}

    def get(self, prompt: str) -> tuple[float, float]:
        alpha, beta, _ = self.rows.get(prompt, (*PRIOR, 0))
        return alpha, beta

    def mean(self, prompt: str) -> float:
        alpha, beta = self.get(prompt)
        return alpha / (alpha + beta)

    def observe(self, feedback: list[GroupFeedback], prior=None) -> None:
        """Fold each record's verdicts into its prompt's posterior; `prior(prompt, step)` gives
        the (α, β) to update (default: the stored ones)."""
        for f in feedback:
            alpha, beta = prior(f.prompt_id, f.step) if prior else self.get(f.prompt_id)
            self.rows[f.prompt_id] = [*posterior_update(alpha, beta, f.successes, f.n_rollouts - f.successes,
                                                        decay=self.decay), f.step]

    def state_dict(self) -> dict:
        return {k: list(v) for k, v in self.rows.items()}

    def load_state_dict(self, state: dict) -> None:
        self.rows = {k: list(v) for k, v in state.items()}


class PosteriorSampler:
    """What the posterior samplers share: candidates drawn with the run's prompt RNG, the table,
    a private generator seeded from (`seed`, `stream`), and their state as plain data. A subclass
    takes its own knobs with their defaults and passes the rest (`**common`) on."""

    reads_feedback = True

    stream = "posterior"

    def __init__(self, *, task: Task, rng: random.Random, group_size: int, seed: int, candidates: float,
                 decay: float):
        self.task, self.draws, self.group_size, self.candidates = task, rng, group_size, candidates
        self.rng = random.Random(f"{seed}/{self.stream}")  # private: never shares the task's draws
        self.table = PosteriorTable(decay)
        self.predictions: tuple[int, list[float], list[float]] = (-1, [], [])  # step, predicted, observed

    def draw_candidates(self, n_prompts: int) -> list:
        return self.task.sample(num_candidates(n_prompts, self.candidates), self.draws)

    def observe(self, step: int, feedback: list[GroupFeedback]) -> None:
        self.calibrate(step, feedback)
        self.table.observe(feedback)

    def predict(self, step: int, examples: list) -> list[float]:
        """The posterior-mean success rate of each example as of `step` (what calibration scores)."""
        return [self.table.mean(ex.prompt) for ex in examples]

    def calibrate(self, step: int, feedback: list[GroupFeedback]) -> None:
        """Keep this step's posterior means, before its verdicts, beside the success rates observed."""
        if self.predictions[0] != step:
            self.predictions = (step, [], [])
        self.predictions[1].extend(self.table.mean(f.prompt_id) for f in feedback)
        self.predictions[2].extend(f.successes / max(f.n_rollouts, 1) for f in feedback)

    def metrics(self) -> dict[str, float]:
        """Prompts with a posterior, and how the step's predicted success rates rank against the
        observed ones (Spearman ρ; absent when either side is constant)."""
        rho = spearman(*self.predictions[1:]) if len(self.predictions[1]) > 1 else None
        return {"selection/prompts_seen": float(len(self.table.rows)),
                **({"sampler/calibration_spearman": rho} if rho is not None else {})}

    def state_dict(self) -> dict:
        return {"table": self.table.state_dict(), "rng": self.rng.getstate()}

    def load_state_dict(self, state: dict) -> None:
        self.table.load_state_dict(state["table"])
        self.rng.setstate(state["rng"])


class MoPPS(PosteriorSampler):
    """Thompson draws from per-prompt posteriors; the `P` candidates nearest `target` roll out."""

    stream = "prompt-selection"

    def __init__(self, *, candidates: float = 2.0, target: float = 0.5, decay: float = 0.5, **common):
        super().__init__(candidates=candidates, decay=decay, **common)
        self.target = target

    def propose(self, step: int, n_prompts: int, budget: int) -> list[Request]:
        cands = self.draw_candidates(n_prompts)
        rates = [self.rng.betavariate(*self.table.get(ex.prompt)) for ex in cands]
        return spread([cands[i] for i in closest_to_target(rates, n_prompts, self.target)], self.group_size)


class VADE(PosteriorSampler):
    """Thompson draws from time-decayed posteriors; the `P` candidates of largest p̃(1 − p̃) roll out."""

    stream = "vade"

    def __init__(self, *, candidates: float = 2.0, decay: float = 0.9, time_decay: float = 0.98, **common):
        super().__init__(candidates=candidates, decay=decay, **common)
        self.time_decay = time_decay

    def current(self, prompt: str, step: int) -> tuple[float, float]:
        """The posterior of `prompt` as of `step`, its evidence aged since it was last observed."""
        alpha, beta, last = self.table.rows.get(prompt, (*PRIOR, step))
        return aged(alpha, beta, step - int(last), time_decay=self.time_decay)

    def propose(self, step: int, n_prompts: int, budget: int) -> list[Request]:
        cands = self.draw_candidates(n_prompts)
        rates = [self.rng.betavariate(*self.current(ex.prompt, step)) for ex in cands]
        return spread([cands[i] for i in most_informative(rates, n_prompts)], self.group_size)

    def observe(self, step: int, feedback: list[GroupFeedback]) -> None:
        self.calibrate(step, feedback)
        self.table.observe(feedback, prior=self.current)

    def predict(self, step: int, examples: list) -> list[float]:
        out = []
        for ex in examples:
            alpha, beta = self.current(ex.prompt, step)
            out.append(alpha / (alpha + beta))
        return out
