"""Held-out evaluation on a list of Examples: greedy accuracy, and avg@k / pass@k of k samples.

`agent`: the task's examples are an agent's episodes (`rlvr.agents.task.is_agent_task`, asked by the
caller once), scored by running them in the task's environments. `judge(task, examples, texts) ->
list[bool]`, when given, answers correctness in place of calling `task.is_correct` here: the run's
verifier (`BatchVerifier.correct`), with its per-sample deadlines."""

from __future__ import annotations

import torch

from rlvr.agents.collect import correctness as agent_correctness
from rlvr.codec import decode_completions, encode_examples


def greedy_accuracy(engine, tokenizer, task, examples, *, agent: bool, batch_size: int = 256,
                    judge=None) -> float:
    """Fraction of `examples` whose greedy completion (engine at temperature 0) is correct."""
    correct = greedy_verdicts(engine, tokenizer, task, examples, agent=agent, batch_size=batch_size, judge=judge)
    return sum(correct) / max(len(correct), 1)


def accuracy_by_source(examples, verdicts: list[bool]) -> dict[str, float]:
    """Accuracy per `meta["source"]` of `examples` (a task with difficulty buckets), in first-seen
    order; empty when no example names a source.

    >>> from rlvr.types import Example
    >>> exs = [Example(p, "", {"source": s}) for p, s in (("a", "d2"), ("b", "d3"), ("c", "d2"))]
    >>> accuracy_by_source(exs, [True, False, False])
    {'d2': 0.5, 'd3': 0.0}
    """
    hits: dict[str, list[bool]] = {}
    for ex, ok in zip(examples, verdicts):
        if "source" in ex.meta:
            hits.setdefault(ex.meta["source"], []).append(ok)
    return {source: sum(v) / len(v) for source, v in hits.items()}


def greedy_verdicts(engine, tokenizer, task, examples, *, agent: bool, batch_size: int = 256,
                    judge=None) -> list[bool]:
    """Whether each example's greedy completion is correct (for paired comparisons of checkpoints)."""
    return _correctness(engine, tokenizer, task, examples, agent=agent, temperature=0.0, first_seed=None,
                        batch_size=batch_size, judge=judge)


def sampled_scores(engine, tokenizer, task, examples, *, agent: bool, samples: int, temperature: float,
                   batch_size: int = 256, judge=None) -> tuple[float, float]:
    """(avg@k, pass@k) of `samples` completions per example at `temperature`.

    The policy RL optimises is the sampled one; greedy decoding can stay put while it improves
    (a masked-diffusion sampler's argmax path especially). pass@k (some sample right) shows
    whether RL only sharpens onto problems already solved or keeps the others reachable. Seeds
    are fixed (1,000,000 + index), so two checkpoints are scored on the same noise."""
    rows = [ex for ex in examples for _ in range(samples)]
    correct = _correctness(engine, tokenizer, task, rows, agent=agent, temperature=temperature,
                           first_seed=1_000_000, batch_size=batch_size, judge=judge)
    if not correct:
        return 0.0, 0.0
    per_example = [correct[i:i + samples] for i in range(0, len(correct), samples)]
    return sum(correct) / len(correct), sum(any(group) for group in per_example) / len(per_example)


def _correctness(engine, tokenizer, task, rows, *, agent: bool, temperature: float, first_seed: int | None,
                 batch_size: int, judge=None) -> list[bool]:
    """Whether each of `rows` is answered correctly, one completion each; seeds first_seed + index (0 if None)."""
    if agent:
        return agent_correctness(engine, tokenizer, task, rows, temperature=temperature, first_seed=first_seed,
                                 batch_size=batch_size)
    correct = []
    for start in range(0, len(rows), batch_size):
        chunk = rows[start:start + batch_size]
        ids, mask, extras = encode_examples(tokenizer, chunk)
        seeds = torch.zeros(len(chunk), dtype=torch.long)
        if first_seed is not None:
            seeds += torch.arange(start, start + len(chunk)) + first_seed
        texts = decode_completions(tokenizer, engine(ids, mask, seeds, temperature=temperature, **extras))
        correct.extend(judge(task, chunk, texts) if judge is not None else
                       (bool(task.is_correct(text, ex)) for text, ex in zip(texts, chunk)))
    return correct
