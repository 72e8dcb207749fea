"""`rlvr rm`: a Bradley–Terry reward model trained on preference pairs.

The model is `config.model` (a local causal LM, the packaged warm start, or a fresh tiny one)
with its LM head replaced by a one-label score head (`AutoModelForSequenceClassification` of the
same config, the trunk's weights copied, the head initialised from `seed`). Pairs are scored as
`rlvr.rewards.reward_model.RewardModel` scores them (its tokenizer and chat template, the pooled
logit of the last token), so the exported folder is what `reward.fn` loads. Each step: B pairs ->
2B scores -> `bradley_terry_loss` with each pair's margin (its own, else `preference.margin`) ->
AdamW. Evaluations log the held-out pairwise accuracy (chosen scored above rejected).
"""

from __future__ import annotations

import random

import torch

from rlvr.algos.preference import bradley_terry_loss
from rlvr.builder import build
from rlvr.config import Config
from rlvr.config.commands_schema import preference_lr
from rlvr.errors import ConfigError
from rlvr.preference.pairs import Pair
from rlvr.preference.run import PreferenceRun, check_pairs_fit, split_pairs
from rlvr.rewards.reward_model import encode_pairs, prepare, sequence_scores

__all__ = ["reward_classifier", "train_reward_model"]


def reward_classifier(causal, seed: int):
    """A one-label sequence classifier with `causal`'s config and trunk weights, a fresh score head."""
    import copy

    from transformers import AutoModelForSequenceClassification

    config = copy.deepcopy(causal.config)
    config.num_labels = 1
    torch.manual_seed(seed)
    model = AutoModelForSequenceClassification.from_config(config)
    trunk = getattr(model, model.base_model_prefix)
    trunk.load_state_dict(getattr(causal, causal.base_model_prefix).state_dict())
    return model.to(causal.dtype)


def pair_scores(model, tokenizer, pad_id: int, pairs: list[Pair]) -> tuple[torch.Tensor, torch.Tensor]:
    """(chosen (B,), rejected (B,)) scores in one forward of 2B rows."""
    device = next(model.parameters()).device
    prompts = [p.prompt for p in pairs] * 2
    ids, mask = encode_pairs(tokenizer, prompts, [p.chosen for p in pairs] + [p.rejected for p in pairs],
                             pad_id=pad_id)
    scores = sequence_scores(model, ids.to(device), mask.to(device))
    return scores[:len(pairs)], scores[len(pairs):]


def _margins(pairs: list[Pair], default: float) -> torch.Tensor:
    return torch.tensor([default if p.margin is None else p.margin for p in pairs])


def train_reward_model(config: Config, *, command: list[str], echo=print) -> dict:
    """Train a reward model on `config.preference`'s pairs in a new run directory; returns the last
    metrics line. `rlvr export RUN DIR` then writes the folder `reward.fn` names."""
    if config.model.kind == "diffusion":
        raise ConfigError("model.kind: rlvr rm trains a causal sequence classifier; set model.kind=causal")
    if config.model.lora.r:
        raise ConfigError("model.lora.r: rlvr rm trains the whole model; set model.lora.r=0")
    p = config.preference
    causal, tokenizer = build.base_model(config)
    task = build.build_task(config, tokenizer)
    train_pairs, heldout = split_pairs(config, task)
    check_pairs_fit(train_pairs + heldout, tokenizer, causal)
    model = build.prepare_model(config, reward_classifier(causal, config.seed))
    pad_id = prepare(model, tokenizer)
    optimizer, scheduler = build.build_optimizer(model.parameters(), lr=preference_lr(p, "rm"), warmup_steps=0,
                                                 total_steps=p.steps)
    run, rng = PreferenceRun(config, "rm", command, echo=echo), random.Random(config.seed)

    def evaluate() -> dict:
        if not heldout:
            return {}
        with torch.no_grad():
            chosen, rejected = pair_scores(model, tokenizer, pad_id, heldout)
        return {"eval/heldout_pair_accuracy": float((chosen > rejected).float().mean())}

    def step_loss(step: int):
        pairs = rng.sample(train_pairs, min(p.batch_size, len(train_pairs)))
        chosen, rejected = pair_scores(model, tokenizer, pad_id, pairs)
        return bradley_terry_loss(chosen, rejected, margin=_margins(pairs, p.margin).to(chosen.device))

    return run.train(model, tokenizer, optimizer, scheduler, step_loss, evaluate, kind="rm")
