"""A SPEC-RL run end to end: on a finite train set prompts recur, their drafts are reused, and the
run trains (tests/engines/test_speculative_engine.py checks the sampler itself)."""

import json
import math

import pytest

from rlvr.cli import main


@pytest.mark.slow
def test_a_speculative_run_reuses_drafts_and_trains(tmp_path, capsys):
    code = main(["train", "rollout.speculative=true", "task.train_size=4", "trainer.steps=8",
                 "rollout.prompts_per_step=2", "rollout.group_size=4", "optim.lr=1e-3", "trainer.eval_every=0",
                 "trainer.save_every=0", "task.heldout_size=8", f"trainer.out_dir={tmp_path}", "trainer.name=spec",
                 "trainer.threads=1"])
    assert code == 0, capsys.readouterr().err
    lines = [json.loads(line) for line in (tmp_path / "spec" / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in lines if m["step"] > 0]
    assert len(steps) == 8 and steps[0]["rollout/spec_drafted_frac"] == 0.0  # nothing cached yet
    assert max(m["rollout/spec_reuse_frac"] for m in steps) > 0
    for m in steps:  # what was generated anew never exceeds the completion tokens, and the update ran
        assert 0 <= m["rollout/spec_new_tokens"] <= m["batch/generated_tokens"]
        assert math.isfinite(m["loss/policy"]) and math.isfinite(m["actor/grad_norm"])
    assert any(m["actor/grad_norm"] > 0 for m in steps)
