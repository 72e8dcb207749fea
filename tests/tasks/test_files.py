"""File-backed tasks: loading, field mapping, prompts, filtering, split, errors, fixtures."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from rlvr.errors import ConfigError
from rlvr.tasks import make_task
from rlvr.tasks.files import CodeFileTask, MathFileTask, load_rows

DATA = Path(__file__).resolve().parents[2] / "data"


def _write(path: Path, rows) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_gsm8k_fixture_loads_splits_and_scores():
    task = make_task("math_file", path=str(DATA / "gsm8k_fixture.jsonl"), heldout_size=10)
    train, held = task.sample(40, random.Random(0)), task.heldout()
    assert task.stats == {"rows": 50, "dropped_long": 0} and len(held) == 10
    assert not {e.prompt for e in train} & {e.prompt for e in held}
    ex = held[0]
    final = ex.answer.rsplit("####", 1)[1].strip()
    assert task.reward(ex.prompt, f"Reasoning... so \\boxed{{{final}}}.", answer=ex.answer, meta=ex.meta) == 1.0
    assert task.reward(ex.prompt, "So \\boxed{-1}.", answer=ex.answer, meta=ex.meta) == 0.0
    assert task.is_correct(f"\\boxed{{{final}}}", ex)
    with pytest.raises(ConfigError, match=r"gsm8k_fixture.jsonl:\d+: no reference solution .*solution_key"):
        task.solution(ex)
    assert len(task.sample(100, random.Random(1))) == 100  # more than rows: with replacement


def test_math_file_is_strict_by_default_and_lenient_on_request():
    rows = {"question": "q", "answer": "#### 42"}
    strict = make_task("math_file", path=str(DATA / "gsm8k_fixture.jsonl"), heldout_size=0)
    lenient = make_task("math_file", path=str(DATA / "gsm8k_fixture.jsonl"), heldout_size=0, strict=False)
    garbage = "x9 qq 17 ) 42 zz"  # the right number, no final-answer marker
    for text, strict_score, lenient_score in [
        (garbage, 0.0, 1.0),
        ("the answer is 42", 0.0, 1.0),
        ("17 then \\boxed{42}", 1.0, 1.0),
        ("<answer> 42 </answer> 17", 1.0, 1.0),
        ("work 17\n#### 42", 1.0, 1.0),
        ("\\boxed{41} 42", 0.0, 0.0),
    ]:
        assert strict.reward("q", text, answer=rows["answer"]) == strict_score, text
        assert lenient.reward("q", text, answer=rows["answer"]) == lenient_score, text


def test_field_mapping_template_and_system_prompt(tmp_path):
    path = _write(tmp_path / "d.jsonl", [{"problem": "1+1?", "solution": "2"}, {"problem": "2+2?", "solution": "4"}])
    task = MathFileTask(path=str(path), prompt_key="problem", answer_key="solution",
                        prompt_template="Q: {prompt}\nA:", system_prompt="Be brief.")
    assert (sorted(e.prompt for e in task.sample(2, random.Random(0)))
            == ["Be brief.\n\nQ: 1+1?\nA:", "Be brief.\n\nQ: 2+2?\nA:"])


class _ChatTokenizer:
    chat_template = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}<|assistant|>"

    def apply_chat_template(self, messages, tokenize, add_generation_prompt):
        assert tokenize is False and add_generation_prompt is True
        return "".join(f"<|{m['role']}|>{m['content']}" for m in messages) + "<|assistant|>"

    def __call__(self, text, add_special_tokens):
        return {"input_ids": text.split()}


def test_chat_template_and_length_filter(tmp_path):
    rows = [{"question": "short one", "answer": "1"}, {"question": "a much much longer question here", "answer": "2"}]
    path = _write(tmp_path / "d.jsonl", rows)
    task = MathFileTask(path=str(path), system_prompt="sys", tokenizer=_ChatTokenizer(), max_prompt_length=3)
    assert task.stats == {"rows": 2, "dropped_long": 1}
    assert task.sample(1, random.Random(0))[0].prompt == "<|system|>sys<|user|>short one<|assistant|>"
    chars = MathFileTask(path=str(path), max_prompt_length=10)  # no tokenizer: characters
    assert chars.stats["dropped_long"] == 1


@pytest.mark.parametrize("rows,message", [
    (['{"question": "ok", "answer": "1"}', '{"question": "bad" "answer"}'], r"d.jsonl:2: invalid JSON"),
    ([{"question": "ok", "answer": "1"}, {"prompt": "x", "answer": "2"}],
     r"d.jsonl:2: field 'question' missing \(row has answer, prompt\); set task.math_file.prompt_key"),
    ([{"question": "ok", "answer": ["1"]}], r"d.jsonl:1: field 'answer' must be str or int or float, got list"),
    ([{"question": "ok", "answer": " "}], r"d.jsonl:1: field 'answer' is empty"),
    (['[1, 2]'], r"d.jsonl:1: expected a JSON object, got list"),
])
def test_bad_rows_name_file_line_and_field(tmp_path, rows, message):
    path = _write(tmp_path / "d.jsonl", rows)
    with pytest.raises(ConfigError, match=message):
        MathFileTask(path=str(path))


def test_bad_paths_and_knobs(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        MathFileTask(path=str(tmp_path / "none.jsonl"))
    (tmp_path / "d.csv").write_text("a,b\n")
    with pytest.raises(ConfigError, match="not .jsonl, .json, .parquet"):
        MathFileTask(path=str(tmp_path / "d.csv"))
    path = _write(tmp_path / "d.jsonl", [{"question": "q", "answer": "1"}])
    with pytest.raises(ConfigError, match="must contain"):
        MathFileTask(path=str(path), prompt_template="no placeholder")
    with pytest.raises(ConfigError, match="leaves no training rows"):
        MathFileTask(path=str(path), heldout_size=1)


def test_code_rows_validated(tmp_path):
    path = _write(tmp_path / "c.jsonl", [{"prompt": "p", "tests": [{"input": "1"}]}])
    with pytest.raises(ConfigError, match=r"c.jsonl:1: field 'tests'\[0\] must be an assert string"):
        CodeFileTask(path=str(path), isolation="none")
    path = _write(tmp_path / "c.jsonl", [{"prompt": "p", "tests": []}])
    with pytest.raises(ConfigError, match="c.jsonl:1: field 'tests' is empty"):
        CodeFileTask(path=str(path), isolation="none")


def test_parquet_and_hf_dataset(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    pa = pytest.importorskip("pyarrow")
    rows = [{"q": f"{i}+1?", "a": str(i + 1)} for i in range(5)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "d.parquet")
    task = MathFileTask(path=str(tmp_path / "d.parquet"), prompt_key="q", answer_key="a", heldout_size=1)
    assert len(task.heldout()) == 1 and len(load_rows(tmp_path / "d.parquet")) == 5
    pq.write_table(pa.Table.from_pylist([{"q": "x"}]), tmp_path / "bad.parquet")
    with pytest.raises(ConfigError, match=r"bad.parquet:row 1: field 'a' missing"):
        MathFileTask(path=str(tmp_path / "bad.parquet"), prompt_key="q", answer_key="a")
    datasets = pytest.importorskip("datasets")
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)}).save_to_disk(str(tmp_path / "hf"))
    task = MathFileTask(path=str(tmp_path / "hf"), prompt_key="q", answer_key="a")
    assert len(task.sample(5, random.Random(0))) == 5
    with pytest.raises(ConfigError, match="task.math_file.split='test' not in"):
        MathFileTask(path=str(tmp_path / "hf"), prompt_key="q", answer_key="a", split="test")


def test_code_fixture_reference_solutions_pass_and_wrong_ones_fail():
    task = make_task("code_file", path=str(DATA / "code_fixture.jsonl"), heldout_size=5, sandbox_workers=2)
    rows = task.sample(25, random.Random(0)) + task.heldout()
    assert len({e.prompt for e in rows}) == 30
    good = task.reward_batch([e.prompt for e in rows], [f"```python\n{e.meta['solution']}```" for e in rows],
                             [e.meta for e in rows])
    assert [g["reward"] for g in good] == [1.0] * 30 and all(g["verdict/PASS"] == 1.0 for g in good)
    ex = rows[0]
    bad = task.reward(ex.prompt, "print('nope')", meta=ex.meta)
    assert bad["reward"] == 0.0 and bad["verdict/PASS"] == 0.0
    assert task.is_correct(ex.meta["solution"], ex) and not task.is_correct("x = (", ex)
    assert task.solution(ex) == ex.meta["solution"]
