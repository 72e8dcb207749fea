"""The reference loop (examples/grpo_minimal.py) runs end to end and uses the library's math."""

import importlib.util
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "grpo_minimal.py"


def test_reference_loop_runs_and_reports_accuracy():
    spec = importlib.util.spec_from_file_location("grpo_minimal", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = module.main(["--steps", "4", "--prompts", "2", "--group", "4", "--eval-every", "4", "--lr", "1e-4"])
    assert 0.0 <= out["start_heldout_accuracy"] <= 1.0 and 0.0 <= out["heldout_accuracy"] <= 1.0
    assert 0.0 <= out["reward"] <= 1.0 and out["length"] > 0
    assert len(EXAMPLE.read_text().splitlines()) <= 330  # "about 300 readable lines"
