"""Small documents with large effects: YAML alias bombs, YAML 1.1's readings of `010`, `1:30` and
`on`, a section override that dropped an earlier key, and path fields read literally (`~`,
`${VAR}`, `trainer.name=/abs`). Each case ends in one line naming the field or file and the fix
(exit 2), or in the value the user meant. Config checks only: milliseconds each."""

from __future__ import annotations

import json
import os
import threading

import pytest
import yaml

from rlvr.cli import main
from rlvr.config import load_config
from rlvr.errors import ConfigError
from rlvr.yaml_io import MAX_VALUES, load_yaml


def _bomb(levels: int, width: int = 10) -> str:
    """A 'billion laughs' document: level k is `width` aliases of level k - 1 (width**levels leaves)."""
    lines = [f"a0: &a0 [{', '.join(['x'] * width)}]"]
    lines += [f"a{k}: &a{k} [{', '.join([f'*a{k - 1}'] * width)}]" for k in range(1, levels)]
    return "\n".join(lines) + "\n"


def _error(capsys, argv: list[str]) -> str:
    capsys.readouterr()
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in out + err, err
    return err


def test_the_bomb_is_what_plain_pyyaml_expands():
    """Canary: PyYAML builds the shared lists lazily, but anything that copies or prints the result
    (a deepcopy of the tree, an error line with its repr, a report) pays for every leaf."""
    small = _bomb(5)
    assert len(small) < 400
    assert len(json.dumps(yaml.safe_load(small))) > 500_000  # 10**5 leaves from under 400 bytes


@pytest.mark.parametrize("where", ["recipe", "override", "run_config"])
def test_an_alias_bomb_is_refused_in_one_line(where, tmp_path, capsys):
    bomb = _bomb(9)  # 10**9 leaves: never expanded
    if where == "recipe":
        (tmp_path / "r.yaml").write_text(bomb)
        err = _error(capsys, ["config", str(tmp_path / "r.yaml")])
    elif where == "override":
        flow = "{" + ", ".join(bomb.splitlines()) + "}"
        err = _error(capsys, ["config", f"trainer={flow}"])
    else:
        run = tmp_path / "run"
        run.mkdir()
        (run / "config.yaml").write_text(bomb)
        err = _error(capsys, ["runs", "list", str(run)])
    assert f"aliases expand to more than {MAX_VALUES} values" in err and len(err) < 400


def test_aliases_within_the_limit_and_merge_keys_still_work(tmp_path):
    (tmp_path / "r.yaml").write_text("x-base: &opt {lr: 0.001, warmup_steps: 3}\n"
                                     "optim:\n  <<: *opt\n  warmup_steps: 5\n")
    tree = load_yaml((tmp_path / "r.yaml").read_text(), "recipe")
    assert tree["optim"] == {"lr": 0.001, "warmup_steps": 5}


def test_a_recursive_alias_is_refused():
    with pytest.raises(ConfigError, match="refers to a value that contains it"):
        load_yaml("a: &a [1, *a]\n", "recipe 'r.yaml'")


def test_a_huge_recipe_is_refused_before_parsing(tmp_path, capsys):
    (tmp_path / "big.yaml").write_text("# " + "x" * (2 << 20) + "\nseed: 1\n")
    assert "more than a recipe may be" in _error(capsys, ["config", str(tmp_path / "big.yaml")])


SURPRISES = [  # (override, what YAML 1.1 (PyYAML's safe_load) reads, the words of the refusal)
    ("seed=010", 8, "leading zero as octal"),
    ("trainer.steps=1:30", 90, "base 60"),
    ("trainer.steps=1_000", 1000, "1.2 as text"),
    ("rollout.greedy_in_group=on", True, "boolean"),
    ("rollout.greedy_in_group=no", False, "boolean"),
]


@pytest.mark.parametrize(("override", "yaml11", "words"), SURPRISES, ids=[s[0] for s in SURPRISES])
def test_yaml_11_surprises_are_refused_with_a_hint(override, yaml11, words, capsys):
    key, _, raw = override.partition("=")
    assert yaml.safe_load(raw) == yaml11  # canary: what the value silently became
    err = _error(capsys, ["config", override])
    assert f"override '{key}'" in err and words in err and "quote it for text" in err


def test_yaml_12_numbers_read_as_written(tmp_path):
    (tmp_path / "r.yaml").write_text("optim: {lr: 5e-5, warmup_steps: 0x10}\nseed: 0o17\n")
    config = load_config(tmp_path / "r.yaml")
    assert (config.optim.lr, config.optim.warmup_steps, config.seed) == (5e-5, 16, 15)
    assert load_yaml("a: '010'\nb: \"on\"\n", "r") == {"a": "010", "b": "on"}  # quoted: text


def test_a_section_override_merges_into_earlier_keys():
    config = load_config(None, ["trainer.steps=7", "trainer={threads: 1}"])
    assert (config.trainer.steps, config.trainer.threads) == (7, 1)
    config = load_config({"trainer": {"steps": 9, "eval_every": 3}}, ["trainer={threads: 1}"])
    assert (config.trainer.steps, config.trainer.eval_every, config.trainer.threads) == (9, 3, 1)


def test_a_key_set_twice_through_a_section_is_refused(capsys):
    err = _error(capsys, ["config", "trainer.steps=7", "trainer={steps: 8}"])
    assert "override 'trainer.steps': given twice" in err


def test_a_duplicate_key_in_a_recipe_is_refused(tmp_path, capsys):
    (tmp_path / "r.yaml").write_text("seed: 1\nseed: 2\n")
    assert "key 'seed' given twice (line 2)" in _error(capsys, ["config", str(tmp_path / "r.yaml")])


def test_a_named_pipe_as_recipe_is_refused_without_blocking(tmp_path, capsys):
    fifo = tmp_path / "r.yaml"
    os.mkfifo(fifo)
    result = {}
    worker = threading.Thread(target=lambda: result.setdefault("err", _error(capsys, ["config", str(fifo)])),
                              daemon=True)
    worker.start()
    worker.join(20)  # opening a pipe for reading blocks until a writer comes: a hang, bounded here
    assert not worker.is_alive(), "reading a named pipe as a recipe hung"
    assert "is a named pipe, not a regular file" in result["err"]


@pytest.mark.parametrize(("override", "words"), [
    ("trainer.name=/tmp/elsewhere", "not a folder name inside trainer.out_dir"),
    ("trainer.name=.", "not a folder name inside trainer.out_dir"),
    ("trainer.name=runs/../..", "not a folder name inside trainer.out_dir"),
    ("trainer.out_dir=${SCRATCH}/runs", "environment variable ${SCRATCH}, which rlvr does not expand"),
    ("model.path=$HOME/model", "environment variable $HOME"),
])
def test_path_fields_that_would_land_elsewhere_are_refused(override, words, capsys):
    err = _error(capsys, ["config", override])
    assert override.partition("=")[0] in err and words in err


def test_a_home_folder_in_a_recipe_is_expanded(tmp_path):
    (tmp_path / "r.yaml").write_text("trainer: {out_dir: ~/runs, name: a/b}\n")
    config = load_config(tmp_path / "r.yaml")
    assert config.trainer.out_dir == os.path.expanduser("~/runs") and "~" not in config.trainer.out_dir
    assert config.trainer.name == "a/b"
