"""Run folders are input: a crafted one of each kind (trainer state, optimizer metadata and shards,
config, report inputs) is resumed, exported, reported and compared, and no payload runs.

Each payload is a pickle whose `__reduce__` calls `os.system("touch CANARY")` (or a Python file that
writes the canary when imported); every test asserts the canary is absent afterwards, and, where
`--trust-pickle` is the documented opt-in, that the same payload does run with it (so the check can fail).
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from cli_lines import cli, one_line
from fake_runs import tiny_run_args

from rlvr.cli import main
from rlvr.runtime.fsdp import load_sharded_optimizer
from rlvr.runtime.safe_load import UntrustedPickle
from rlvr.trainer.checkpoint import CHECKSUM_FILE, STATE_FILE, _digests, load_state

TINY = tiny_run_args(steps=1)


class Payload:
    """Pickled, it names `os.system`: loading it with the full pickle runs the command."""

    def __init__(self, canary: Path):
        self.canary = canary

    def __reduce__(self):
        return os.system, (f"touch {self.canary}",)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("crafted")
    assert main(["train", *TINY, f"trainer.out_dir={root}", "trainer.name=base"]) == 0
    return root / "base"


@pytest.fixture
def run(trained, tmp_path) -> Path:
    """A copy of the trained run to craft."""
    return Path(shutil.copytree(trained, tmp_path / "run"))


def _checkpoint(run: Path) -> Path:
    return run / "checkpoints" / "step_000001"


def _reseal(checkpoint: Path) -> None:
    """What an attacker does: recompute checksums.json, so the folder's integrity check passes."""
    (checkpoint / CHECKSUM_FILE).write_text(json.dumps(_digests(checkpoint)))


def _tools_leave_it(run: Path, tmp_path: Path, canary: Path, capsys) -> None:
    """Export, report and compare read the crafted run: each finishes (or refuses in one line);
    none runs the payload."""
    for argv in (["export", str(run), str(tmp_path / "exported")],
                 ["report", str(run), "--out", str(tmp_path / "r.html")],
                 ["runs", "compare", str(run), "--out", str(tmp_path / "cmp")]):
        code, err = cli(argv, capsys)
        assert code == 0 or code == 2 and err.count("\n") == 1, (argv, err)
        assert not canary.exists(), argv


def test_a_trainer_state_naming_code_is_refused_by_resume_and_runs_only_with_trust_pickle(run, tmp_path, capsys):
    canary = tmp_path / "canary"
    checkpoint = _checkpoint(run)
    state = torch.load(checkpoint / STATE_FILE, weights_only=False)  # the test's own file: trusted here
    torch.save({**state, "scheduler": Payload(canary)}, checkpoint / STATE_FILE)
    _reseal(checkpoint)
    code, err = cli(["train", "--resume", str(run), "trainer.steps=2"], capsys)
    one_line(code, err, STATE_FILE, "posix.system", "--trust-pickle")
    assert not canary.exists()
    _tools_leave_it(run, tmp_path, canary, capsys)
    assert load_state(checkpoint, trust_pickle=True)["scheduler"] == 0  # the payload is live: the opt-in runs it
    assert canary.exists()


def test_the_trainer_state_of_a_real_run_loads_weights_only(trained):
    state = load_state(_checkpoint(trained))
    assert state["step"] == 1 and isinstance(state["rng"]["torch"], torch.Tensor)


def test_optimizer_metadata_naming_code_is_refused_and_the_shards_are_in_the_checksums(run, tmp_path, capsys):
    """A single-process checkpoint made to look like a sharded one: no optimizer in the trainer
    state, an `optimizer/.metadata` pickle that names `os.system` (and is listed in the checksums)."""
    canary = tmp_path / "canary"
    checkpoint = _checkpoint(run)
    state = load_state(checkpoint)
    del state["optimizer"]
    torch.save(state, checkpoint / STATE_FILE)
    (checkpoint / "optimizer").mkdir()
    (checkpoint / "optimizer" / ".metadata").write_bytes(pickle.dumps(Payload(canary)))
    _reseal(checkpoint)
    assert "optimizer/.metadata" in json.loads((checkpoint / CHECKSUM_FILE).read_text())
    code, err = cli(["train", "--resume", str(run), "trainer.steps=2"], capsys)
    one_line(code, err, "optimizer/.metadata", "posix.system", "--trust-pickle")
    assert not canary.exists()
    _tools_leave_it(run, tmp_path, canary, capsys)


def test_optimizer_shards_outside_the_checksums_are_refused(run, capsys):
    """rlvr lists every file it writes in checksums.json, the optimizer's shards too: an unlisted one is not loaded."""
    checkpoint = _checkpoint(run)
    (checkpoint / "optimizer").mkdir()
    (checkpoint / "optimizer" / ".metadata").write_bytes(b"not listed")
    code, err = cli(["train", "--resume", str(run), "trainer.steps=2"], capsys)
    one_line(code, err, "files not in checksums.json: optimizer/.metadata")


def _sharded(folder: Path, canary: Path | None = None):
    """A Linear layer's Adam state saved with torch.distributed.checkpoint (as sharded learners
    save it); with `canary`, the learning rate (a non-tensor entry DCP pickles) is a payload."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    state = get_optimizer_state_dict(model, optimizer)
    if canary is not None:
        state["param_groups"][0]["lr"] = Payload(canary)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"optimizer": state}, checkpoint_id=str(folder))
    return model, optimizer


def _fresh():
    torch.manual_seed(1)
    model = torch.nn.Linear(3, 2)
    return model, torch.optim.AdamW(model.parameters(), lr=5e-1)


def test_sharded_optimizer_state_loads_through_the_allow_list(tmp_path):
    model, optimizer = _sharded(tmp_path / "optimizer")
    fresh, fresh_optimizer = _fresh()
    load_sharded_optimizer(fresh, fresh_optimizer, tmp_path / "optimizer")
    saved, loaded = optimizer.state_dict(), fresh_optimizer.state_dict()
    assert loaded["param_groups"][0]["lr"] == 1e-3
    for i in saved["state"]:
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(saved["state"][i][key], loaded["state"][i][key])


def test_a_payload_in_a_sharded_entry_is_refused_and_runs_only_with_trust_pickle(tmp_path):
    canary = tmp_path / "canary"
    _sharded(tmp_path / "optimizer", canary)
    assert not canary.exists()
    with pytest.raises(UntrustedPickle, match="posix.system.*--trust-pickle"):
        load_sharded_optimizer(*_fresh(), tmp_path / "optimizer")
    assert not canary.exists()
    load_sharded_optimizer(*_fresh(), tmp_path / "optimizer", trust_pickle=True)  # the opt-in runs the pickle
    assert canary.exists()


PAYLOAD_PY = ("from pathlib import Path\nPath({canary!r}).write_text('ran')\n"
              "def fn(prompt, completion, **kw):\n    return 0.0\n")


def test_a_config_naming_a_reward_file_inside_the_run_folder_is_refused(run, tmp_path, capsys):
    canary = tmp_path / "canary"
    (run / "payload.py").write_text(PAYLOAD_PY.format(canary=str(canary)))
    config = (run / "config.yaml").read_text()
    assert "\nreward:\n  fn: ''\n" in config
    crafted = config.replace("\nreward:\n  fn: ''\n", f"\nreward:\n  fn: {run / 'payload.py'}:fn\n")
    (run / "config.yaml").write_text(crafted)
    code, err = cli(["train", "--resume", str(run), "trainer.steps=2"], capsys)
    one_line(code, err, "reward.fn", "inside the run folder")
    assert not canary.exists()
    _tools_leave_it(run, tmp_path, canary, capsys)


def test_report_inputs_cannot_inject_script_into_the_report(run, tmp_path, capsys):
    """samples.jsonl and run.json are text from the model and the folder: the report escapes them."""
    hostile = "</pre></section><script>document.title='pwned'</script><img src=x onerror=alert(1)>"
    with open(run / "samples.jsonl", "a") as handle:
        handle.write(json.dumps({"step": 1, "prompt": hostile, "completion": hostile, "reward": 0.0}) + "\n")
    info = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**info, "git_sha": hostile}))
    code, _ = cli(["report", str(run), "--out", str(tmp_path / "r.html")], capsys)
    page = (tmp_path / "r.html").read_text()
    assert code == 0 and "<script>document" not in page and "<img src=x" not in page
    assert "&lt;script&gt;document.title" in page


def test_the_trainer_state_file_kinds_each_hash_into_the_checksums(trained):
    listed = json.loads((_checkpoint(trained) / CHECKSUM_FILE).read_text())
    for name in (STATE_FILE, "model.safetensors", "config.json"):
        assert listed[name] == hashlib.sha256((_checkpoint(trained) / name).read_bytes()).hexdigest()


def test_pickled_model_weights_naming_code_are_refused_by_export_and_eval(run, tmp_path, capsys):
    """A checkpoint whose weights are a `.bin` pickle instead of safetensors: `transformers` loads it
    weights-only for rlvr, and the refusal is one line."""
    from safetensors.torch import load_file

    canary = tmp_path / "canary"
    checkpoint = _checkpoint(run)
    weights = load_file(str(checkpoint / "model.safetensors"))
    torch.save({**weights, "extra": Payload(canary)}, checkpoint / "pytorch_model.bin")
    (checkpoint / "model.safetensors").unlink()
    for argv in (["export", str(run), str(tmp_path / "exported")], ["eval", str(run), "--n", "1"]):
        one_line(*cli(argv, capsys), "posix.system", "safetensors")
        assert not canary.exists()
    assert not (tmp_path / "exported").exists()
