"""`rlvr rm preference.process=true`: a process reward model trained from step labels.

Rows are (prompt, steps, labels): label 1 for a step that is right so far, 0 for one that is
wrong. Every step prefix — prompt + the first k steps joined by `preference.step_separator` —
is one binary example: the classifier's score is its logit, trained with binary cross-entropy,
so that `ProcessRewardModel` (with the same separator in `reward.model_step_separator`) scores
each step as it was trained. Held out: the accuracy of the score's sign on every step.

Step labels come from `preference.data` (rows with `prompt`, a list `steps` and a list `labels`)
or, by default, from the verifier of Countdown with shown work (`task.countdown.show_work=true`):
each problem gives its solution's steps (all 1) and a copy whose k-th step writes a wrong result,
cut there (steps before it 1, the wrong one 0; k uniform).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rlvr.builder import build
from rlvr.config import Config
from rlvr.config.commands_schema import preference_lr
from rlvr.errors import ConfigError
from rlvr.preference.reward_model import reward_classifier
from rlvr.preference.run import PreferenceRun
from rlvr.rewards.reward_model import encode_pairs, prepare, sequence_scores
from rlvr.tasks.files import load_rows

__all__ = ["StepLabels", "load_step_labels", "train_process_reward_model", "verifier_step_labels"]


@dataclass(frozen=True)
class StepLabels:
    prompt: str
    steps: tuple[str, ...]
    labels: tuple[int, ...]


def load_step_labels(path: str) -> list[StepLabels]:
    out = []
    for row, where in load_rows(path, field="preference.data"):
        steps, labels = row.get("steps"), row.get("labels")
        if not (isinstance(row.get("prompt"), str) and isinstance(steps, list) and isinstance(labels, list)
                and steps and len(steps) == len(labels) and all(v in (0, 1) for v in labels)):
            raise ConfigError(f"preference.data: {where}: a step-labelled row is {{\"prompt\": ..., \"steps\": [...], "
                              f"\"labels\": [0 or 1 per step]}}")
        out.append(StepLabels(row["prompt"], tuple(map(str, steps)), tuple(labels)))
    return out


def verifier_step_labels(task, examples, rng: random.Random, *, separator: str = ",") -> list[StepLabels]:
    """Two rows per problem: its solution's steps, and a copy wrong at a uniform step (see the module doc)."""
    out = []
    for ex in examples:
        steps = task.solution(ex).split(separator)
        out.append(StepLabels(ex.prompt, tuple(steps), (1,) * len(steps)))
        k = rng.randrange(len(steps))
        head, result = steps[k].rsplit("=", 1)
        if not result.lstrip("-").isdigit():  # a fraction (division on): no wrong copy of this one
            continue
        wrong = f"{head}={int(result) + rng.choice([-2, -1, 1, 2])}"
        out.append(StepLabels(ex.prompt, (*steps[:k], wrong), (1,) * k + (0,)))
    return out


def _prefixes(rows: list[StepLabels], separator: str) -> tuple[list[str], list[str], torch.Tensor]:
    prompts, texts, labels = [], [], []
    for row in rows:
        for k in range(1, len(row.steps) + 1):
            prompts.append(row.prompt)
            texts.append(separator.join(row.steps[:k]))
            labels.append(float(row.labels[k - 1]))
    return prompts, texts, torch.tensor(labels)


def _split(config: Config, task) -> tuple[list[StepLabels], list[StepLabels]]:
    p = config.preference
    if p.data:
        rows = load_step_labels(p.data)
        held = min(p.heldout_pairs, len(rows) // 2)
        return rows[:len(rows) - held], rows[len(rows) - held:]
    if not getattr(task, "show_work", False):
        raise ConfigError("preference.process: step labels come from Countdown's shown work; set "
                          "task.countdown.show_work=true, or pass step-labelled rows in preference.data")
    rng = random.Random(config.seed)
    return (verifier_step_labels(task, task.sample(p.pairs, rng), rng, separator=p.step_separator),
            verifier_step_labels(task, task.heldout()[:p.heldout_pairs], rng, separator=p.step_separator))


def train_process_reward_model(config: Config, *, command: list[str], echo=print) -> dict:
    """Train a process reward model from step labels in a new run directory; returns the last metrics line."""
    p = config.preference
    causal, tokenizer = build.base_model(config)
    train_rows, heldout = _split(config, build.build_task(config, tokenizer))
    model = build.prepare_model(config, reward_classifier(causal, config.seed))
    pad_id = prepare(model, tokenizer)
    optimizer, scheduler = build.build_optimizer(model.parameters(), lr=preference_lr(p, "rm"), warmup_steps=0,
                                                 total_steps=p.steps)
    run, rng = PreferenceRun(config, "prm", command, echo=echo), random.Random(config.seed)

    def scores(rows):
        prompts, texts, labels = _prefixes(rows, p.step_separator)
        ids, mask = encode_pairs(tokenizer, prompts, texts, pad_id=pad_id)
        device = next(model.parameters()).device
        return sequence_scores(model, ids.to(device), mask.to(device)), labels.to(device)

    def step_loss(step: int):
        logits, labels = scores(rng.sample(train_rows, min(p.batch_size, len(train_rows))))
        loss = F.binary_cross_entropy_with_logits(logits, labels)
        return loss, {"accuracy": float(((logits.detach() > 0).float() == labels).float().mean())}

    def evaluate() -> dict:
        if not heldout:
            return {}
        with torch.no_grad():
            logits, labels = scores(heldout)
        return {"eval/heldout_step_accuracy": float(((logits > 0).float() == labels).float().mean())}

    return run.train(model, tokenizer, optimizer, scheduler, step_loss, evaluate, kind="prm")
