"""reasoning-gym datasets as rlvr tasks, by name: `ReasoningGymTask("chain_sum", max_terms=3)`.

reasoning-gym (the optional `envs` extra, imported here only) generates procedural problems
offline, deterministically per seed, each with its own scorer. Here:

- `sample(n, rng)` draws `create_dataset(name, size=n, seed=<from rng>, **config)`; `heldout()` is
  the dataset at a fixed seed; a training draw whose question is held out is drawn again.
- The prompt is the question plus an instruction to answer in `<answer>...</answer>`; the reward is
  the dataset's `score_answer(<answer> content, entry)` in [0, 1]. Its scorers give partial credit to
  some wrong answers (countdown 0.05 for a wrong expression, 0.01 for none), so a completion is
  *correct* only at score 1.0.
- `level=k` sets every curriculum attribute of the dataset to level k (its `create_curriculum`),
  keyword knobs override it: the difficulty knobs as a curriculum, one level per run stage.
"""

from __future__ import annotations

import random

from rlvr.errors import ConfigError
from rlvr.types import Example

INSTRUCTION = "\nGive only the final answer inside <answer></answer>."
_HELDOUT_SEED = 7_777_777


def _rg():
    try:
        import reasoning_gym
    except ImportError:
        raise ImportError("reasoning-gym tasks need the envs extra: pip install -e '.[envs]'") from None
    return reasoning_gym


def level_config(name: str, level: int) -> dict:
    """The dataset's config with every curriculum attribute at `level` (clipped to its last level)."""
    from reasoning_gym.factory import create_curriculum

    curriculum = create_curriculum(name)
    for attr, definition in curriculum.attributes.items():
        for _ in range(min(level, len(definition.levels) - 1)):
            curriculum.increment_attr_level(attr)
    config = vars(curriculum.generate_configuration({"seed": 0, "size": 1}))
    return {k: v for k, v in config.items() if k not in ("seed", "size")}


class ReasoningGymTask:
    """One reasoning-gym dataset by name (see the module docstring)."""

    def __init__(self, name: str, *, heldout_size: int = 100, level: int | None = None, **config):
        rg = _rg()
        try:
            base = level_config(name, level) if level is not None else {}
            rg.create_dataset(name, size=1, seed=0, **{**base, **config})
        except Exception as err:  # noqa: BLE001 - its own errors name the bad knob
            raise ConfigError(f"reasoning_gym: cannot make {name!r} with {config or base}: "
                              f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}") from None
        self.name, self.config, self.heldout_size = name, {**base, **config}, heldout_size
        self._heldout: list[Example] | None = None
        self._scorer = None

    def _dataset(self, size: int, seed: int):
        return _rg().create_dataset(self.name, size=size, seed=seed, **self.config)

    @staticmethod
    def _example(entry: dict) -> Example:
        meta = {"entry": {"question": entry["question"], "answer": entry["answer"], "metadata": entry["metadata"]}}
        return Example(entry["question"] + INSTRUCTION, "" if entry["answer"] is None else str(entry["answer"]), meta)

    def heldout(self) -> list[Example]:
        if self._heldout is None:
            ds = self._dataset(self.heldout_size, _HELDOUT_SEED) if self.heldout_size else []
            self._heldout = [self._example(ds[i]) for i in range(len(ds))]
        return self._heldout

    def sample(self, n: int, rng: random.Random | None = None) -> list[Example]:
        rng = rng or random.Random()
        held = {ex.prompt for ex in self.heldout()}
        out: list[Example] = []
        for _ in range(100):
            ds = self._dataset(n, rng.getrandbits(32))
            out += [ex for ex in (self._example(ds[i]) for i in range(len(ds))) if ex.prompt not in held]
            if len(out) >= n:
                return out[:n]
        raise ConfigError(f"reasoning_gym {self.name}: almost every problem drawn is held out; lower heldout_size "
                          f"or widen the config")

    def score(self, completion: str, entry: dict) -> float:
        from reasoning_gym.utils import extract_answer

        if self._scorer is None:
            self._scorer = _rg().get_score_answer_fn(self.name)
        return float(self._scorer(answer=extract_answer(completion), entry=entry))

    def reward(self, prompt: str, completion: str, /, **example) -> float:
        entry = example.get("entry") or (example.get("meta") or {}).get("entry")  # a column, or in meta
        if entry is None:
            raise ConfigError("reasoning_gym: the example carries no 'entry' (its problem); build examples with "
                              "ReasoningGymTask.sample")
        return self.score(completion, entry)

    def is_correct(self, completion: str, example: Example) -> bool:
        return self.score(completion, example.meta["entry"]) >= 1.0
