"""`train_dataset` named by a string, as TRL's `dataset_name`: a local file, a `datasets` folder, or a
Hub dataset id through the Hugging Face cache (offline: the cache only), each read before any model."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from _hub_cache import hub_dataset_cache

import rlvr
from rlvr.errors import ConfigError

datasets = pytest.importorskip("datasets")
ROWS = [{"prompt": f"{a} {a + 1} 1>{2 * a + 2}:", "target": 2 * a + 2} for a in range(1, 21)]


def _trainer(data, **kwargs):
    from rlvr import Trainer

    return Trainer("rlvr:countdown-warmstart", lambda completions, **kw: [0.0] * len(completions), data,
                   echo=lambda *a: None, **kwargs)


def test_a_file_and_a_saved_folder(tmp_path):
    jsonl = tmp_path / "rows.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    assert _trainer(str(jsonl)).rows == ROWS
    datasets.Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "saved"))
    assert _trainer(tmp_path / "saved").rows == ROWS
    with pytest.raises(ConfigError, match=r"^train_dataset: '.*rows.txt' is not .jsonl, .json, .parquet"):
        (tmp_path / "rows.txt").write_text("x")
        _trainer(str(tmp_path / "rows.txt"))


def test_a_hub_dataset_id_through_the_cache_offline(tmp_path):
    data = "".join(json.dumps(r) + "\n" for r in ROWS)
    hub_dataset_cache(tmp_path / "cache", "acme/rows", {"data/train.jsonl": data})
    code = ("from rlvr import Trainer; t = Trainer('rlvr:countdown-warmstart', lambda completions, **kw: "
            "[0.0] * len(completions), 'acme/rows', echo=lambda *a: None); print(len(t.rows))")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "cache"),
           "HF_DATASETS_CACHE": str(tmp_path / "ds"), "PYTHONPATH": str(Path(rlvr.__file__).parents[1])}
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0 and run.stdout.split()[-1] == "20", run.stderr[-2000:]
    missing = subprocess.run([sys.executable, "-c", code.replace("acme/rows", "acme/none")], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=300)
    assert "train_dataset: cannot read dataset 'acme/none'" in missing.stderr, missing.stderr[-2000:]
    assert "(hf download acme/none --repo-type dataset)" in missing.stderr


def test_a_file_tasks_path_takes_a_hub_dataset_and_its_splits(tmp_path, monkeypatch):
    import huggingface_hub

    from rlvr.tasks.files import MathFileTask

    rows = [{"question": f"{a} + {a} = ?", "answer": str(2 * a)} for a in range(1, 13)]
    text = ["".join(json.dumps(r) + "\n" for r in part) for part in (rows[:9], rows[9:])]
    hub_dataset_cache(tmp_path / "cache", "acme/sums", {"data/train.jsonl": text[0], "data/test.jsonl": text[1]})
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    task = MathFileTask(path="acme/sums", heldout_split="test")
    assert [ex.answer for ex in task.heldout()] == ["20", "22", "24"]
    assert {ex.answer for ex in task.sample(64, random.Random(0))} == {str(2 * a) for a in range(1, 10)}
    assert task.heldout()[0].meta["row"] == rows[9]  # the row itself, for TRL-form rewards' columns
    with pytest.raises(ConfigError, match=r"^task.math_file.path: cannot read dataset 'acme/none' .*hf download"):
        MathFileTask(path="acme/none")
    with pytest.raises(ConfigError, match=r"^task.math_file.path: 'data/none.jsonl' not found$"):
        MathFileTask(path="data/none.jsonl")  # a missing file is not a dataset to download
