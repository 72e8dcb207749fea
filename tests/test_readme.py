"""README.md and the guide cannot go stale: every `rlvr` command line they show runs, and so does the
guide's Python script.

Commands: every line of the ```bash blocks, and every inline `rlvr ...` span of the prose, in
document order (the README, then docs/usage.md), in one directory (holding links to recipes/ and
data/), so a command that reads an earlier command's run directory (`rlvr eval
runs/grpo_countdown_s3`) finds it. Training commands get SHORTEN appended (a few steps on a small
batch); everything else runs as written.
Lines that are not `rlvr` commands must be in NOT_RUN, with the reason; inline spans with a
placeholder (a word in capitals: `rlvr report RUN`) are skipped, and the same command must be
shown runnable in a block.

Script: the guide's ```python block using `rlvr.Trainer` runs unchanged in a fresh directory; its run
must show the reward rising and rewards computed from the dataset's `target` column.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import rlvr
from rlvr.cli import main

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
GUIDE = ROOT / "docs" / "usage.md"

NOT_RUN = {  # command prefix -> why the test does not run it
    "python3 -m venv": "creates the environment these tests already run in",
    ". .venv/bin/activate": "activates that environment",
    "pip install": "installs the package these tests import",
    "pip uninstall": "removes the packages the vllm extra pulls in and cannot load",
    "pytest": "the test suite itself",
    "ruff check": "the linter; the same README line runs it before these tests",
}
SHORTEN = {  # appended to a command by its subcommand, in place of the same keys of the command
    "train": ["trainer.steps=2", "trainer.eval_every=0", "task.heldout_size=8", "rollout.prompts_per_step=2",
              "rollout.group_size=2", "trainer.threads=1"],
    "sft": ["sft.steps=2", "sft.batch_size=4"],
    "rm": ["preference.steps=2", "preference.pairs=16", "preference.heldout_pairs=8", "preference.batch_size=4",
           "task.heldout_size=8", "trainer.threads=1"],
    "dpo": ["preference.steps=2", "preference.pairs=16", "preference.heldout_pairs=8", "preference.batch_size=4",
            "task.heldout_size=8", "trainer.threads=1"],
}
RESUMED_STEPS = "trainer.steps=3"  # a resumed run (saved at step 2) trains one step more
PLACEHOLDER = re.compile(r"^[A-Z][A-Z_]*(\.\.\.)?$")


def readme_commands(text: str) -> list[str]:
    """Shell command lines of the bash blocks and inline `rlvr` spans, in document order."""
    found = []
    for match in re.finditer(r"```bash\n(.*?)```|`(rlvr [^`]+)`", text, re.DOTALL):
        block, inline = match.groups()
        lines = block.splitlines() if block is not None else [inline]
        for line in lines:
            for part in line.split("&&"):
                command = " ".join(shlex.split(part, comments=True))
                if command:
                    found.append(command)
    return found


def _not_run(command: str) -> bool:
    return any(command == prefix or command.startswith(prefix + " ") for prefix in NOT_RUN)


def _argv(command: str) -> list[str]:
    argv = shlex.split(command)[1:]
    extra = SHORTEN.get(argv[0], [])
    if argv[0] == "train" and "--resume" in argv:
        extra = [RESUMED_STEPS]
    shortened = {item.partition("=")[0] for item in extra}  # replace the command's own: a key twice is refused
    return [a for a in argv if "=" not in a or a.partition("=")[0] not in shortened] + extra


def _shown_commands() -> list[str]:
    return readme_commands(README.read_text()) + readme_commands(GUIDE.read_text())


def test_readme_lists_the_commands_this_test_relies_on():
    commands = _shown_commands()
    assert "rlvr train" in commands and "rlvr eval runs/grpo_countdown_s3" in commands
    assert any(c.startswith("pip install") for c in commands)  # the skip list is exercised
    for command in commands:
        assert command.startswith("rlvr ") or _not_run(command), \
            f"README or docs/usage.md shows {command!r}: make it an rlvr command, or add it to NOT_RUN with the reason"


@pytest.mark.filterwarnings("ignore:constrained_layout not applied")  # curves of 2-step runs are tiny
def test_every_readme_command_runs(tmp_path, monkeypatch, capsys):
    for name in ("recipes", "data"):
        (tmp_path / name).symlink_to(ROOT / name)
    monkeypatch.chdir(tmp_path)
    commands = [c for c in dict.fromkeys(_shown_commands()) if not _not_run(c)]
    runnable = [c for c in commands if not any(PLACEHOLDER.match(word) for word in shlex.split(c))]
    for skipped in set(commands) - set(runnable):  # `rlvr report RUN`: a runnable `rlvr report ...` must exist
        verb = " ".join(w for w in shlex.split(skipped)[:3] if not PLACEHOLDER.match(w))
        assert any(c.startswith(verb + " ") for c in runnable), f"{skipped!r} has no runnable example shown"
    for command in runnable:
        code = main(_argv(command))
        assert code == 0, f"README command {command!r} (run as {_argv(command)}) failed: {capsys.readouterr().err}"
    assert (tmp_path / "runs" / "grpo_countdown_s3" / "checkpoints" / "step_000003").is_dir()  # resumed
    assert (tmp_path / "my_model" / "config.json").is_file()  # exported


def readme_script(text: str) -> str:
    blocks = [b for b in re.findall(r"```python\n(.*?)```", text, re.DOTALL) if "from rlvr import Trainer" in b]
    assert len(blocks) == 1, "docs/usage.md should show one Python script using rlvr.Trainer"
    return blocks[0]


def test_readme_script_runs_and_the_reward_rises(tmp_path):
    script = tmp_path / "readme_script.py"
    script.write_text(readme_script(GUIDE.read_text()))
    env = {**os.environ, "PYTHONPATH": str(Path(rlvr.__file__).resolve().parents[1])}
    out = subprocess.run([sys.executable, script.name], cwd=tmp_path, env=env, capture_output=True, text=True,
                         check=False, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "held-out accuracy" in out.stdout and "step 10: reward" in out.stdout
    run = tmp_path / "runs" / "grpo_dataset_s0"
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rewards = [m["reward/user/mean"] for m in metrics if "reward/user/mean" in m]  # all completions of a step
    first, last = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
    assert len(rewards) == 30 and last > first + 0.1, (first, last)
    heldout = [m["eval/heldout_accuracy"] for m in metrics if "eval/heldout_accuracy" in m]
    assert heldout[-1] > heldout[0], heldout

    from rlvr.tasks.countdown import evaluate, parse

    def from_column(prompt: str, completion: str) -> float:  # the target column is the prompt's last number
        target = int(prompt.split(">")[1].rstrip(":"))
        try:
            return float(evaluate(parse(completion)) == target)
        except (ValueError, ZeroDivisionError):
            return 0.0

    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert samples and all(s["reward"] == from_column(s["prompt"], s["completion"]) for s in samples)
    assert json.loads((run / "run.json").read_text())["train_dataset"]["rows"] == 500


@pytest.mark.parametrize("line, expected", [
    ("rlvr train --resume runs/x seed=3   # note", ["train", "--resume", "runs/x", "seed=3", RESUMED_STEPS]),
    ("rlvr sft model.path= --out w sft.steps=300", ["sft", "model.path=", "--out", "w", *SHORTEN["sft"]]),
])
def test_command_lines_are_parsed_and_shortened(line, expected):
    (command,) = readme_commands(f"```bash\n{line}\n```")
    assert _argv(command) == expected


def test_ci_runs_exactly_the_readmes_test_command():
    """`.ci/run` calls the README's test command line as it is written (after its own set-up)."""
    blocks = re.findall(r"Run the tests:\n\n```bash\n(.*?)\n```", README.read_text(), re.DOTALL)
    assert len(blocks) == 1 and "pytest" in blocks[0]
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert blocks[0].strip() in [line.strip() for line in ci_lines]
