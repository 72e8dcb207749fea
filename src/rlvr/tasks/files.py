"""File-backed tasks: rows from JSONL, Parquet or a local Hugging Face dataset.

``MathFileTask`` (GSM8K/MATH-style rows: a question and a reference answer, scored by
``rlvr.rewards.math``) and ``CodeFileTask`` (a problem and its ``tests``, run in the sandbox by
``rlvr.rewards.code``). Both share ``FileTask``:

- **Loading.** ``path`` ending ``.jsonl``/``.json`` (one JSON object per line), ``.parquet``
  (needs ``pyarrow``, the ``data`` extra), or a directory written by ``datasets``'
  ``save_to_disk`` (needs ``datasets``; ``split`` picks the split of a ``DatasetDict``).
- **Field mapping.** ``prompt_key``, ``answer_key``, ``tests_key`` name the row fields. A bad
  row raises ``ConfigError`` naming the file, the line (or row number) and the field.
- **Prompt.** ``prompt_template`` (``{prompt}`` is the row's text), then the optional
  ``system_prompt``; with a ``tokenizer`` that has a chat template, the messages go through
  ``apply_chat_template(..., add_generation_prompt=True)``; without one, the system prompt is
  prepended with a blank line.
- **Length filter.** Rows whose final prompt is longer than ``max_prompt_length`` (tokens with
  a tokenizer, characters without) are dropped; ``stats["dropped_long"]`` counts them.
- **Split.** ``heldout_size`` rows, chosen by a stable hash of the prompt text, are held out
  (or all rows of ``heldout_path`` when given, or of the ``heldout_split`` of a datasets
  directory, e.g. its ``test`` split); ``sample`` never returns them.
- **Hub datasets.** A ``path`` that is no local file and reads as ``org/name`` is a Hub dataset
  through the cache (``rlvr.tasks.rows.task_rows``, as ``Trainer(train_dataset="org/name")`` reads it).
- **Columns.** Each example keeps its row (``meta["row"]``): TRL-form reward functions get every
  column as a keyword, as TRL passes them (``solution=[...]``).
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from typing import Any

from rlvr.errors import ConfigError
from rlvr.hub import is_hub_dataset
from rlvr.rewards.forms import ROW_COLUMNS
from rlvr.tasks.rows import load_rows, task_rows
from rlvr.types import Example

__all__ = ["load_rows", "FileTask", "MathFileTask", "CodeFileTask"]


def _check_apart(train: list[Example], heldout: list[Example], field: str) -> None:
    """A held-out set whose every prompt is a training prompt (the same file named twice, or a
    copy) measures memorisation, not generalisation."""
    seen = {ex.prompt for ex in train}
    if heldout and all(ex.prompt in seen for ex in heldout):
        raise ConfigError(f"{field}: every held-out prompt is also a training prompt (the same data as "
                          f"the training set); point it at separate problems, or leave it empty to hold out "
                          f"rows of the training file")


def _stable_bucket(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


class FileTask:
    """Shared loading, prompt building, filtering and splitting; subclasses score."""

    name = "file"
    correct_is_full_reward = True  # `is_correct` is "`reward` is 1.0": the trainer reads it off the reward call

    def __init__(self, *, path: str, prompt_key: str = "question", answer_key: str = "answer",
                 tests_key: str = "tests", system_prompt: str = "", prompt_template: str = "{prompt}",
                 max_prompt_length: int = 0, heldout_size: int = 0, heldout_path: str = "",
                 split: str = "train", heldout_split: str = "", tokenizer: Any = None, seed: int = 0):
        if "{prompt}" not in prompt_template:
            raise ConfigError(f"task.{self.name}.prompt_template must contain {{prompt}}, got {prompt_template!r}")
        self.answer_key, self.tests_key = answer_key, tests_key
        self._setup(prompt_key=prompt_key, system_prompt=system_prompt, prompt_template=prompt_template,
                    max_prompt_length=max_prompt_length, tokenizer=tokenizer, seed=seed)
        examples = self._examples(task_rows(path, split=split, field=f"task.{self.name}.path"))
        heldout = None
        if heldout_path or heldout_split:  # a separate file, or another split of the same datasets directory
            field = f"task.{self.name}.heldout_path" if heldout_path else f"task.{self.name}.path"
            source = heldout_path or path
            if heldout_split and not (Path(source).is_dir() or is_hub_dataset(source)):
                raise ConfigError(f"task.{self.name}.heldout_split: {heldout_split!r} needs a datasets directory "
                                  f"(save_to_disk) or a Hub dataset in {field}; for a file, set heldout_path instead")
            rows = task_rows(source, split=heldout_split or split, field=field)
            heldout = self._examples(rows)
            if not heldout:
                where = f"{field}={heldout_path or path!r}" + (f" split {heldout_split!r}" if heldout_split else "")
                raise ConfigError(f"{where} holds no rows for the held-out set; point it at data with rows")
            _check_apart(examples, heldout, f"task.{self.name}.heldout_path" if heldout_path else
                         f"task.{self.name}.heldout_split")
        self._split(examples, heldout, heldout_size, f"task.{self.name}.path: {path!r}")

    def _setup(self, *, prompt_key: str, system_prompt: str, prompt_template: str, max_prompt_length: int,
               tokenizer: Any, seed: int) -> None:
        """The state every row source needs before `_examples` (subclasses that hold rows in memory
        call it instead of `FileTask.__init__`)."""
        self.prompt_key, self.system_prompt, self.prompt_template = prompt_key, system_prompt, prompt_template
        self.max_prompt_length, self.tokenizer = max_prompt_length, tokenizer
        self._rng = random.Random(seed)
        self.stats = {"rows": 0, "dropped_long": 0}

    def _split(self, examples: list[Example], heldout: list[Example] | None, heldout_size: int, source: str) -> None:
        """Training and held-out rows: `heldout` when given, else the `heldout_size` rows whose
        prompts hash lowest (stable across runs and row order)."""
        if heldout_size < 0:
            raise ConfigError(f"task.heldout_size must be >= 0, got {heldout_size}")
        if heldout is not None:
            self._train, self._heldout = examples, heldout
        else:
            ranked = sorted(range(len(examples)), key=lambda i: _stable_bucket(examples[i].prompt))
            held = set(ranked[:heldout_size])
            self._heldout = [ex for i, ex in enumerate(examples) if i in held]
            self._train = [ex for i, ex in enumerate(examples) if i not in held]
        if not self._train:
            raise ConfigError(f"{source} leaves no training rows "
                              f"({self.stats['rows']} rows, {self.stats['dropped_long']} too long, "
                              f"{len(self._heldout)} held out)")

    # ------------------------------------------------------------------------------ rows

    def _field(self, row: dict, key: str, where: str, kinds: tuple[type, ...], knob: str):
        if key not in row:
            raise ConfigError(f"{where}: field {key!r} missing (row has {', '.join(sorted(row)) or 'no fields'}); "
                              f"set {knob} to the right field name")
        value = row[key]
        if not isinstance(value, kinds) or isinstance(value, bool):
            wanted = " or ".join(k.__name__ for k in kinds)
            raise ConfigError(f"{where}: field {key!r} must be {wanted}, got {type(value).__name__}")
        return value

    def _prompt(self, row: dict, where: str) -> str:
        """The row's prompt text; an empty one is refused (it would train on the template alone)."""
        text = self._field(row, self.prompt_key, where, (str,), f"task.{self.name}.prompt_key")
        if not text.strip():
            raise ConfigError(f"{where}: field {self.prompt_key!r} is empty; give every row a prompt or drop the row")
        return text

    def _row_to_example(self, row: dict, where: str) -> Example:  # overridden
        raise NotImplementedError

    def _examples(self, rows: list[tuple[dict, str]]) -> list[Example]:
        out = []
        for row, where in rows:
            self.stats["rows"] += 1
            ex = self._row_to_example(row, where)
            if self.max_prompt_length and self._length(ex.prompt) > self.max_prompt_length:
                self.stats["dropped_long"] += 1
                continue
            out.append(ex)
        return out

    def format_prompt(self, text: str) -> str:
        """Template, system prompt and chat template applied to one row's text."""
        user = self.prompt_template.replace("{prompt}", text)
        template = getattr(self.tokenizer, "chat_template", None)
        if self.tokenizer is not None and template:
            messages = ([{"role": "system", "content": self.system_prompt}] if self.system_prompt else [])
            messages.append({"role": "user", "content": user})
            return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return f"{self.system_prompt}\n\n{user}" if self.system_prompt else user

    def _length(self, prompt: str) -> int:
        if self.tokenizer is not None:
            return len(self.tokenizer(prompt, add_special_tokens=False)["input_ids"])
        return len(prompt)

    # ------------------------------------------------------------------------------ Task API

    def sample(self, n: int, rng: random.Random | None = None) -> list[Example]:
        """``n`` training rows: a random subset when n <= rows, else with replacement."""
        rng = self._rng if rng is None else rng
        if n <= len(self._train):
            return rng.sample(self._train, n)
        return [rng.choice(self._train) for _ in range(n)]

    def heldout(self) -> list[Example]:
        return list(self._heldout)

    def prompts(self) -> list[str]:
        """Every prompt, training and held-out (the trainer checks the longest fits the model)."""
        return [ex.prompt for ex in (*self._train, *self._heldout)]

    def is_correct(self, completion: str, example: Example) -> bool:
        value = self.reward(example.prompt, completion, answer=example.answer, meta=example.meta)
        if isinstance(value, dict):
            value = value.get("reward")
        return value == 1.0

    solution_hint = "a 'solution' field in every row"

    def solution(self, example: Example) -> str:
        """The row's worked solution (what `rlvr sft` trains on); a one-line error when it has none."""
        solution = example.meta.get("solution")
        if not solution:
            where = example.meta.get("source", f"task.{self.name}")
            raise ConfigError(f"{where}: no reference solution (what rlvr sft, rm and dpo train on and expert rows "
                              f"show); it needs {self.solution_hint}")
        return solution


class MathFileTask(FileTask):
    """GSM8K/MATH-style rows; reward 1.0 when the final answer matches (``rlvr.rewards.math``).

    ``strict`` (the default): the completion's answer is read only from ``\\boxed{}``, an
    ``<answer>`` tag or ``#### X``; ``strict=False`` adds the "the answer is X" and last-number
    fallbacks, which reward any completion that happens to end on the right number."""

    name = "math_file"

    def __init__(self, *, path: str, math_timeout_s: float = 5.0, solution_key: str = "", strict: bool = True,
                 **kwargs):
        self.math_timeout_s, self.solution_key, self.strict = math_timeout_s, solution_key, strict
        self.solution_hint = (f"the field {solution_key!r} filled" if solution_key else
                              "task.math_file.solution_key set to the row field that holds a worked solution")
        super().__init__(path=path, **kwargs)

    def _row_to_example(self, row: dict, where: str) -> Example:
        text = self._prompt(row, where)
        answer = self._field(row, self.answer_key, where, (str, int, float), f"task.{self.name}.answer_key")
        if not str(answer).strip():
            raise ConfigError(f"{where}: field {self.answer_key!r} is empty")
        meta = {"source": where, ROW_COLUMNS: row}  # TRL-form reward functions read any column
        if self.solution_key:
            meta["solution"] = str(self._field(row, self.solution_key, where, (str,), f"task.{self.name}.solution_key"))
        return Example(self.format_prompt(text), str(answer), meta)

    def reward(self, prompt: str, completion: str, /, answer: str | None = None, **example) -> float | None:
        from rlvr.rewards.math import extract_answer, math_equal

        if answer is None:
            return None
        gold = extract_answer(answer) if ("####" in answer or "\\boxed" in answer) else answer
        found = extract_answer(completion, strict=self.strict)
        return 1.0 if math_equal(found, gold, timeout_s=self.math_timeout_s) else 0.0


class CodeFileTask(FileTask):
    """Rows with ``tests`` (asserts or stdin/stdout pairs); reward = fraction passed in the sandbox.

    ``reward`` returns ``{"reward": r, "verdict/<V>": 1.0}``, ``r`` None on SANDBOX_ERROR.
    ``reward_batch`` grades a whole batch over the sandbox's worker pool. Grades are cached per
    (code, tests), so ``is_correct`` after ``reward`` does not rerun the program. Graded in the
    trainer's process (``in_process``): the programs run in the sandbox under its own limits, and
    the grader's pool of threads and slot uids is the trainer's.
    """

    name = "code_file"
    in_process = True

    def __init__(self, *, path: str, prompt_key: str = "prompt", all_or_nothing: bool = False,
                 sandbox_workers: int = 2, wall_s: float = 5.0, memory_mb: int = 512,
                 isolation: str = "auto", **kwargs):
        from rlvr.rewards.code import CodeGrader
        from rlvr.rewards.sandbox import Limits, Sandbox

        self.all_or_nothing = all_or_nothing
        super().__init__(path=path, prompt_key=prompt_key, **kwargs)
        limits = Limits(wall_s=wall_s, memory_mb=memory_mb)
        self.grader = CodeGrader(Sandbox(workers=sandbox_workers, limits=limits, isolation=isolation))
        self._cache: dict[str, Any] = {}

    def _row_to_example(self, row: dict, where: str) -> Example:
        text = self._prompt(row, where)
        tests = self._field(row, self.tests_key, where, (list, str), f"task.{self.name}.tests_key")
        if isinstance(tests, str):  # a JSON-encoded list (common in Parquet exports)
            try:
                tests = json.loads(tests)
            except json.JSONDecodeError:
                tests = [t for t in tests.splitlines() if t.strip()]
        if not tests:
            raise ConfigError(f"{where}: field {self.tests_key!r} is empty")
        for i, t in enumerate(tests):
            ok = isinstance(t, str) or (isinstance(t, dict) and "input" in t and "output" in t)
            if not ok:
                raise ConfigError(f"{where}: field {self.tests_key!r}[{i}] must be an assert string or "
                                  f"{{\"input\": ..., \"output\": ...}}, got {json.dumps(t)[:80]}")
        meta = {"tests": tests, "source": where, ROW_COLUMNS: row}
        if row.get("solution"):
            meta["solution"] = str(row["solution"])
        return Example(self.format_prompt(text), "", meta)

    def _grades(self, completions: list[str], metas: list[dict]) -> list:
        from rlvr.rewards.code import extract_code

        keys = [json.dumps([extract_code(c), m.get("tests")]) for c, m in zip(completions, metas)]
        todo = {k: (extract_code(c), m.get("tests") or []) for k, c, m in zip(keys, completions, metas)
                if k not in self._cache}
        if todo:
            if len(self._cache) > 4096:
                self._cache.clear()
            for key, grade in zip(todo, self.grader.grade_many(list(todo.values()))):
                self._cache[key] = grade
        return [self._cache[k] for k in keys]

    def _score(self, grade) -> dict:
        from rlvr.rewards.sandbox import Verdict

        out = {"reward": grade.reward(self.all_or_nothing)}
        out.update({f"verdict/{v.value}": float(grade.verdict is v) for v in Verdict if v is not Verdict.OK})
        out["check_breaches"] = float(bool(grade.breach))  # the checks on its values ran past their bound
        return out

    def reward(self, prompt: str, completion: str, /, meta: dict | None = None, **example) -> dict:
        return self._score(self._grades([completion], [meta or {}])[0])

    def reward_batch(self, prompts: list[str], completions: list[str], meta: list[dict], **columns) -> list[dict]:
        return [self._score(g) for g in self._grades(completions, meta)]

    reward_batch.batched = True
