"""A reward that separates a random model's completions: 1 / (1 + characters), in TRL's form
(`fn(completions, **kwargs) -> list[float]`), so both trainers call the same function.

`bench/vs_trl.py --model PATH --reward length` uses it where the task's verifier would score
every completion of an untrained model 0 (no group would train). Length is counted in characters,
which tokenizer and trainer cannot change.
"""


def length_reward(completions, **kwargs) -> list[float]:
    return [1.0 / (1.0 + len(c)) for c in completions]
