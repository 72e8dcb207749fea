"""A generative judge: a local causal LM prompted with a rubric, as a batched reward function.

The rubric is a text with ``{prompt}`` and ``{completion}`` slots. Two ways to score:

- ``mode="verdict"``: one forward of the judge on the rubric; the reward is the probability of
  the first verdict token against the second at the next position, p(yes) / (p(yes) + p(no))
  (each verdict must be one token of the judge's tokenizer).
- ``mode="score"``: the judge writes a verdict greedily through a rollout engine (any
  `RolloutEngine`: the torch sampler or vLLM); `parse_score` reads its last ``Score: N`` (or
  ``N/M``) and maps [low, high] to [0, 1]. A verdict without a readable score in range is that
  sample's error (``JudgeParseError``, counted in ``<name>/errors``), never a crash.

Each (prompt, completion) is judged once: the result is cached, so a completion scored again
(correctness after the batch, a repeated sample) costs no judge call.

In a config, ``reward.fn`` names a saved causal LM as a judge by ``judge:`` and its folder
(``reward.fn="task, 0.5*judge:JUDGE_DIR"``), with ``reward.judge_rubric``, ``reward.judge_mode``,
``reward.judge_verdicts`` and ``reward.judge_score_max``; `load_judge` builds it. The engine of
the ``score`` mode comes from the caller (``make_engine(model, tokenizer)``: the builder passes
the torch sampler), so this module never imports an engine.

>>> parse_score("Reasoning... Score: 7", low=0, high=10)
0.7
>>> parse_score("8/10 overall")
0.8
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import torch

from rlvr.codec import decode_completions, encode_prompts
from rlvr.errors import ConfigError
from rlvr.model_files import check_loading, check_tokenizer, check_weights, head_names, read_json

__all__ = ["JUDGE_PREFIX", "GenerativeJudge", "JudgeParseError", "load_judge", "parse_score"]

JUDGE_PREFIX = "judge:"

MODES = ("verdict", "score")
_SCORE = re.compile(r"score\s*[:=]?\s*(-?\d+(?:\.\d+)?)", re.IGNORECASE)
_FRACTION = re.compile(r"(-?\d+(?:\.\d+)?)\s*/\s*(\d+(?:\.\d+)?)")


class JudgeParseError(ValueError):
    """A verdict without a readable score."""


def parse_score(text: str, *, low: float = 0.0, high: float = 10.0) -> float:
    """The verdict's last ``Score: N`` (else its last ``N/M``, read as N out of M) mapped from
    [low, high] to [0, 1]; `JudgeParseError` when there is none or it is out of range."""
    found = _SCORE.findall(text)
    if found:
        value = float(found[-1])
    else:
        fractions = _FRACTION.findall(text)
        if not fractions:
            raise JudgeParseError(f"no score in verdict {text[:60]!r}")
        n, m = (float(x) for x in fractions[-1])
        if m == 0:
            raise JudgeParseError(f"score out of 0 in verdict {text[:60]!r}")
        value = low + (high - low) * n / m
    if not low <= value <= high:
        raise JudgeParseError(f"score {value:g} outside [{low:g}, {high:g}] in verdict {text[:60]!r}")
    return round((value - low) / (high - low), 12)


class GenerativeJudge:
    """``fn(prompts, completions, **columns) -> list[float | JudgeParseError]`` (batched); see the
    module doc. `engine` is needed for ``mode="score"`` only."""

    batched = True
    in_process = True  # the judge model lives on the trainer's device: scored here, not in a forked reward worker

    def __init__(self, model, tokenizer, rubric: str, *, mode: str = "verdict",
                 verdicts: tuple[str, str] = ("Yes", "No"), engine=None, low: float = 0.0, high: float = 10.0,
                 batch_size: int = 16, name: str = "judge"):
        if mode not in MODES:
            raise ConfigError(f"reward.judge_mode: unknown {mode!r}; choose one of {', '.join(MODES)}")
        if "{completion}" not in rubric:
            raise ConfigError("reward.judge_rubric: it has no {completion} slot; write the rubric around {prompt} "
                              "and {completion}")
        if mode == "score" and engine is None:
            raise ConfigError("reward.judge_mode=score: pass engine= (a RolloutEngine over the judge model)")
        if not high > low:
            raise ConfigError(f"reward.judge_score_max: must be above the lowest score {low:g}, got {high!r}")
        if len(verdicts) != 2 or not all(isinstance(v, str) and v for v in verdicts):
            raise ConfigError(f"reward.judge_verdicts: two verdicts, the good one first (e.g. Yes,No), "
                              f"got {verdicts!r}")
        self.model, self.tokenizer, self.rubric, self.mode, self.engine = model, tokenizer, rubric, mode, engine
        self.low, self.high, self.batch_size, self.__name__ = low, high, batch_size, name
        self.verdict_ids = [self._one_token(v) for v in verdicts] if mode == "verdict" else []
        self.cache: dict[tuple[str, str], float | JudgeParseError] = {}

    def _one_token(self, verdict: str) -> int:
        ids = self.tokenizer(verdict, add_special_tokens=False)["input_ids"]
        if len(ids) != 1:
            raise ConfigError(f"reward.judge_verdicts: {verdict!r} is {len(ids)} tokens of the judge's tokenizer; "
                              f"choose verdicts of one token each")
        return ids[0]

    def render(self, prompt: str, completion: str) -> str:
        return self.rubric.replace("{prompt}", prompt).replace("{completion}", completion)

    @torch.no_grad()
    def _verdict_probs(self, texts: list[str]) -> list[float]:
        device = next(self.model.parameters()).device
        ids, mask = encode_prompts(self.tokenizer, texts)  # left-padded: the next position is the last
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        logits = self.model(input_ids=ids.to(device), attention_mask=mask.to(device),
                            position_ids=positions.to(device)).logits[:, -1].float()
        pair = logits[:, self.verdict_ids].softmax(-1)  # (B, 2)
        return pair[:, 0].tolist()

    def _scores(self, texts: list[str]) -> list[float | JudgeParseError]:
        ids, mask = encode_prompts(self.tokenizer, texts)
        rollouts = self.engine(ids, mask, torch.arange(len(texts)), temperature=0.0)
        out: list[float | JudgeParseError] = []
        for verdict in decode_completions(self.tokenizer, rollouts):
            try:
                out.append(parse_score(verdict, low=self.low, high=self.high))
            except JudgeParseError as err:
                out.append(err)
        return out

    def __call__(self, prompts: list[str], completions: list[str], **columns) -> list[float | JudgeParseError]:
        todo = list(dict.fromkeys((p, c) for p, c in zip(prompts, completions) if (p, c) not in self.cache))
        judge = self._verdict_probs if self.mode == "verdict" else self._scores
        for start in range(0, len(todo), self.batch_size):
            chunk = todo[start:start + self.batch_size]
            for key, value in zip(chunk, judge([self.render(p, c) for p, c in chunk])):
                self.cache[key] = value
        return [self.cache[(p, c)] for p, c in zip(prompts, completions)]


def load_judge(path: str | Path, *, rubric: str, mode: str = "verdict", verdicts: str | tuple[str, str] = "Yes,No",
               low: float = 0.0, high: float = 10.0, batch_size: int = 16, device: str | torch.device | None = None,
               make_engine: Callable | None = None) -> GenerativeJudge:
    """A `GenerativeJudge` over the causal LM saved in `path` (its own tokenizer, no hub access);
    `verdicts` as ``"Yes,No"`` or a pair; `make_engine(model, tokenizer)` gives the ``score`` mode's
    rollout engine."""
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, who = Path(path), "reward.fn: judge"
    fix = f"write {JUDGE_PREFIX}DIR with DIR a causal LM saved by save_pretrained or `rlvr export`"
    heads = head_names(read_json(folder / "config.json", who, fix))
    if heads and not any(h.endswith(("ForCausalLM", "LMHeadModel")) for h in heads):
        raise ConfigError(f"{who} '{path}' holds a {heads[0]}, which writes no text, so its verdict head would be "
                          f"random; {fix} (a sequence classifier is a reward model: name it without {JUDGE_PREFIX})")
    check_weights(folder, who, fix)
    check_tokenizer(folder, who)
    if isinstance(verdicts, str):
        verdicts = tuple(v.strip() for v in verdicts.split(","))
    try:
        model, info = AutoModelForCausalLM.from_pretrained(str(folder), local_files_only=True,
                                                           output_loading_info=True, ignore_mismatched_sizes=True)
        tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    # what the checks above cannot see: a config.json transformers cannot build a model from, a corrupt tokenizer
    except (OSError, ValueError, KeyError, TypeError, RuntimeError, SafetensorError) as err:
        raise ConfigError(f"{who}: cannot load '{path}' as a causal LM: "
                          f"{(str(err).strip().splitlines() or [type(err).__name__])[0][:200]}") from None
    check_loading(info, folder, who, fix)
    model = (model.to(device) if device is not None else model).eval()
    engine = make_engine(model, tokenizer) if mode == "score" and make_engine is not None else None
    return GenerativeJudge(model, tokenizer, rubric, mode=mode, verdicts=verdicts, engine=engine, low=low, high=high,
                           batch_size=batch_size)
