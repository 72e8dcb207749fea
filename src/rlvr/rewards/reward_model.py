"""A sequence-classification reward model as a batched reward function (the one torch module here).

`RewardModel(model, tokenizer)` scores B (prompt, completion) pairs with any
`AutoModelForSequenceClassification` (one output label): each pair is rendered with the **reward
model's** tokenizer and chat template (a user turn, then an assistant turn), not the policy's;
pairs without a template are scored as ``prompt + completion``. Scoring runs in batches of
`batch_size` on the model's device, right-padded, and takes the model's own pooled logit (the
last non-pad token, as `transformers` pools it), so a score equals a direct forward of that text.

Normalisation of the B scores of one call (one rollout batch): ``normalize="batch"`` whitens them,
(r − mean) / (std + eps) (Bessel std), and ``clip`` > 0 then bounds them to [−clip, clip]. Each
sample's raw score is logged beside its reward (``<name>/raw``).

Anywhere a reward function is accepted it takes one of these: ``reward.fn`` names a saved reward
model by its folder (``reward.fn="task, 0.5*runs/rm/export"``), and the Python API takes a
`RewardModel`, or a bare `PreTrainedModel` whose folder holds its tokenizer, in ``reward_funcs``.

>>> # RewardModel.from_pretrained("runs/rm/export", normalize="batch", clip=3.0)
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from rlvr.errors import ConfigError
from rlvr.model_files import check_loading, check_tokenizer, check_weights, head_names, read_json
from rlvr.rewards.process import AGGREGATIONS, process_reward, split_steps

__all__ = ["ProcessRewardModel", "RewardModel", "encode_pairs", "load_reward_model",
           "make_reward_model", "sequence_scores"]

NORMALIZATIONS = ("none", "batch")


def render_pair(tokenizer, prompt: str, completion: str) -> str:
    """One (prompt, completion) as the reward model reads it: its chat template when it has one."""
    if getattr(tokenizer, "chat_template", None):
        messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": completion}]
        return tokenizer.apply_chat_template(messages, tokenize=False)
    return prompt + completion


def encode_pairs(tokenizer, prompts: list[str], completions: list[str], *, max_length: int | None = None,
                 pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) right-padded input ids and attention mask of the rendered pairs; with `max_length`
    the left of a long text is cut (the completion's end, where the score is read, stays)."""
    chat = bool(getattr(tokenizer, "chat_template", None))
    rows = [tokenizer(render_pair(tokenizer, p, c), add_special_tokens=not chat)["input_ids"]
            for p, c in zip(prompts, completions)]
    if max_length:
        rows = [r[-max_length:] for r in rows]
    width = max((len(r) for r in rows), default=0)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r, dtype=torch.long)
        mask[i, :len(r)] = 1
    return ids, mask


def sequence_scores(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """(B,) float32 scores: the model's pooled logit of label 0 (gradients flow when enabled)."""
    return model(input_ids=input_ids, attention_mask=attention_mask).logits[:, 0].float()


def prepare(model, tokenizer) -> int:
    """The pad id both sides agree on (a tokenizer without one pads with its eos)."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad is None:
        raise ConfigError("reward model: its tokenizer has neither a pad nor an eos token; set tokenizer.pad_token")
    if model.config.pad_token_id is None:  # transformers pools the last token that is not the pad id
        model.config.pad_token_id = pad
    return pad


class RewardModel:
    """A batched reward function ``fn(prompts, completions, **columns) -> list[dict]`` over a
    sequence-classification model; see the module doc. The model is put in eval mode and never
    trained here."""

    batched = True
    in_process = True  # the model lives on the trainer's device: scored here, not in a forked reward worker

    def __init__(self, model, tokenizer=None, *, batch_size: int = 16, normalize: str = "none", clip: float = 0.0,
                 max_length: int | None = None, device: str | torch.device | None = None,
                 name: str = "reward_model", eps: float = 1e-6):
        if normalize not in NORMALIZATIONS:
            raise ConfigError(f"reward.model_normalize: unknown {normalize!r}; "
                              f"choose one of {', '.join(NORMALIZATIONS)}")
        if not (isinstance(clip, (int, float)) and math.isfinite(clip) and clip >= 0):
            raise ConfigError(f"reward.model_clip: must be a number >= 0 (0 = no clipping), got {clip!r}")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigError(f"reward.model_batch_size: must be an integer >= 1, got {batch_size!r}")
        if getattr(model.config, "num_labels", 1) != 1:
            raise ConfigError(f"reward model: it has {model.config.num_labels} output labels; a reward model has one "
                              f"(AutoModelForSequenceClassification.from_pretrained(..., num_labels=1))")
        if tokenizer is None:
            source = getattr(model, "name_or_path", "") or ""
            if not source or not Path(source).is_dir():
                raise ConfigError("reward model: passed without its tokenizer; pass RewardModel(model, tokenizer)")
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(source)
        self.model = model.to(device) if device is not None else model
        self.model.eval()
        self.tokenizer = tokenizer
        self.pad_id = prepare(self.model, tokenizer)
        self.batch_size, self.normalize, self.clip, self.eps = batch_size, normalize, float(clip), eps
        self.max_length = max_length
        self.__name__ = name

    @classmethod
    def from_pretrained(cls, path: str | Path, *, dtype: str = "float32", **options) -> RewardModel:
        """Load a reward model and its tokenizer from a local folder (no hub access)."""
        from safetensors import SafetensorError
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        folder, who = Path(path), "reward model"
        fix = "name a one-score sequence classifier saved by save_pretrained (`rlvr rm`, then `rlvr export`, makes one)"
        config = read_json(folder / "config.json", who, fix)
        heads = head_names(config)
        if heads and not any(h.endswith("ForSequenceClassification") for h in heads):
            raise ConfigError(f"reward model: '{path}' holds a {heads[0]}, whose score head would be random; "
                              f"name a sequence classifier (train one with `rlvr rm`), or judge:{path} to "
                              f"prompt it as a generative judge")
        labels = config.get("id2label")
        if isinstance(labels, dict) and len(labels) != 1:
            raise ConfigError(f"reward model: '{path}' has {len(labels)} output labels (id2label in its config.json); "
                              f"a reward model has one score (AutoModelForSequenceClassification with num_labels=1)")
        check_weights(folder, who, fix)
        check_tokenizer(folder, who)
        try:
            model, info = AutoModelForSequenceClassification.from_pretrained(
                str(path), num_labels=1, dtype=getattr(torch, dtype), local_files_only=True, output_loading_info=True,
                ignore_mismatched_sizes=True)
            tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        # what the checks above cannot see: a config.json transformers cannot build a model from (ValueError),
        # weights of another shape than it says (RuntimeError "size mismatch"), a corrupt tokenizer file
        except (OSError, ValueError, KeyError, TypeError, RuntimeError, SafetensorError) as err:
            raise ConfigError(f"reward model: cannot load '{path}' as a sequence classifier: "
                              f"{(str(err).strip().splitlines() or [type(err).__name__])[0][:200]}") from None
        check_loading(info, folder, who, fix)
        return cls(model, tokenizer, **options)

    @torch.no_grad()
    def scores(self, prompts: list[str], completions: list[str]) -> torch.Tensor:
        """(B,) raw scores, in batches of `batch_size`."""
        device = next(self.model.parameters()).device
        out = []
        for start in range(0, len(completions), self.batch_size):
            ids, mask = encode_pairs(self.tokenizer, prompts[start:start + self.batch_size],
                                     completions[start:start + self.batch_size],
                                     max_length=self.max_length, pad_id=self.pad_id)
            out.append(sequence_scores(self.model, ids.to(device), mask.to(device)).cpu())
        return torch.cat(out) if out else torch.zeros(0)

    def rewards(self, raw: torch.Tensor) -> torch.Tensor:
        """The normalised (whitened over the batch) and clipped rewards of (B,) raw scores."""
        out = raw
        if self.normalize == "batch" and len(raw) > 1:
            out = (raw - raw.mean()) / (raw.std() + self.eps)
        elif self.normalize == "batch":
            out = torch.zeros_like(raw)
        if self.clip > 0:
            out = out.clamp(-self.clip, self.clip)
        return out

    def __call__(self, prompts: list[str], completions: list[str], **columns) -> list[dict]:
        raw = self.scores(list(prompts), list(completions))
        return [{"reward": float(r), "raw": float(s)} for r, s in zip(self.rewards(raw), raw)]


class ProcessRewardModel(RewardModel):
    """A process reward model: the classifier scores each step's prefix of the completion (steps
    from `rlvr.rewards.process.split_steps`), and the K step scores become one reward by
    `aggregate` (``min``, ``last``, ``mean``, ``clipped``, ``delta``; see `rlvr.rewards.process`).
    A completion without a step is not scorable (None). Logged beside each reward: its step count
    (``<name>/steps``) and weakest step (``<name>/min_step``)."""

    def __init__(self, model, tokenizer=None, *, aggregate: str = "min", separator: str = "\n\n",
                 tag: str | None = None, threshold: float = 0.0, name: str = "process_reward", **options):
        if aggregate not in AGGREGATIONS:
            raise ConfigError(f"reward.model_steps: unknown aggregation {aggregate!r}; "
                              f"choose one of {', '.join(AGGREGATIONS)}")
        super().__init__(model, tokenizer, name=name, **options)
        self.aggregate, self.separator, self.tag, self.threshold = aggregate, separator, tag, threshold

    def _prefix(self, steps: list[str], k: int) -> str:
        return "".join(s + self.tag for s in steps[:k]) if self.tag else self.separator.join(steps[:k])

    def step_scores(self, prompts: list[str], completions: list[str]) -> list[list[float]]:
        """Each completion's K step scores: the classifier on prompt + its first k steps, k = 1..K."""
        return self.prefix_scores(prompts, [split_steps(c, separator=self.separator, tag=self.tag)
                                            for c in completions])

    def prefix_scores(self, prompts: list[str], steps: list[list[str]]) -> list[list[float]]:
        """The K_i scores of each row's given steps (an agent's actions, one per turn): the classifier on
        prompt + its first k steps joined as a completion, k = 1..K_i."""
        flat = [(p, self._prefix(s, k)) for p, s in zip(prompts, steps) for k in range(1, len(s) + 1)]
        scores = self.scores([p for p, _ in flat], [c for _, c in flat]).tolist()
        out, start = [], 0
        for s in steps:
            out.append(scores[start:start + len(s)])
            start += len(s)
        return out

    def __call__(self, prompts: list[str], completions: list[str], **columns) -> list[dict]:
        per_step = self.step_scores(list(prompts), list(completions))
        rewards = [process_reward(s, self.aggregate, threshold=self.threshold) for s in per_step]
        scored = [i for i, r in enumerate(rewards) if r is not None]
        if scored:  # the batch whitening and clipping, over the scorable completions
            for i, r in zip(scored, self.rewards(torch.tensor([rewards[i] for i in scored])).tolist()):
                rewards[i] = r
        return [{"reward": r, "steps": len(s), **({"min_step": min(s)} if s else {})}
                for r, s in zip(rewards, per_step)]


def make_reward_model(model, tokenizer=None, **options) -> RewardModel:
    """A `ProcessRewardModel` when `options` name a step ``aggregate``, else a `RewardModel`."""
    return (ProcessRewardModel if options.get("aggregate") else RewardModel)(model, tokenizer, **options)


def load_reward_model(path: str | Path, **options) -> RewardModel:
    """`make_reward_model` of a saved folder (`RewardModel.from_pretrained`)."""
    return (ProcessRewardModel if options.get("aggregate") else RewardModel).from_pretrained(path, **options)
