"""Expert rows under data-parallel learners: `torchrun --nproc_per_node 2` (FSDP2 over gloo, one
thread per rank) against one process, with `expert.per_step` demonstration rows after the groups.

Every rank draws the same expert problems (a pure function of the seed and the step) and builds
the same rows; the old-policy and reference passes over them split the rows over the ranks and
gather the log-probs back; each minibatch (its groups and its share of the expert rows) is cut
between the ranks, and the metric sums are summed over them, a rank whose share has no expert
rows (or only expert rows) counting 0 for the other side's metrics. So the metrics and weights are
the single process's.
"""

from __future__ import annotations

import pytest
from _learners import SMALL, SRC, checkpoint_weights, run_metrics, same_lines, same_weights, torchrun, warm_start
from safetensors.torch import load_file

from rlvr.cli import main

RECIPES = SRC.parent / "recipes"


def _two_and_one(tmp_path, *common: str):
    """A 2-rank run and a 1-process run of `common`: their metric lines."""
    done = torchrun(*common, "trainer.name=two")
    assert done.returncode == 0, done.stderr[-3000:]
    assert main(["train", *common, "trainer.name=one", "trainer.threads=1"]) == 0
    return run_metrics(tmp_path / "two"), run_metrics(tmp_path / "one")


@pytest.mark.slow
def test_two_ranks_train_chord_expert_rows_as_one_process(tmp_path):
    """CHORD on Countdown, 3 expert rows a step, two minibatches (the old-policy pass runs, the
    expert rows split 2 + 1 over them) and a KL penalty (the reference pass runs over the expert
    rows too): 10 rows in the first minibatch, so rank 0 holds no expert row and rank 1 both kinds."""
    common = [str(RECIPES / "chord_countdown.yaml"), "trainer.steps=3", "trainer.minibatches=2", "algo.kl_coef=0.05",
              "expert.per_step=3", f"trainer.out_dir={tmp_path}", *SMALL]
    two, one = _two_and_one(tmp_path, *common)
    assert all(m["expert/rows"] == 3 and m["actor/expert_token_frac"] > 0 for m in two[1:])
    assert all(m["actor/expert_chord_phi"] > 0 and m["actor/kl"] > 0 for m in two[1:])
    same_lines(two, one)
    same_weights(checkpoint_weights(tmp_path / "two", 3), checkpoint_weights(tmp_path / "one", 3), warm_start())


@pytest.mark.slow
def test_two_ranks_train_erils_external_rows_as_one_process(tmp_path):
    """ERILS on the masked-diffusion model: the length-controlled external rows (EOS-padded to the
    window) score under the step's masks, a function of each row's tokens and the step's seed,
    so the ranks' shares draw the single process's masks."""
    common = [str(RECIPES / "dllm_erils_countdown.yaml"), "trainer.steps=3", "trainer.ppo_epochs=1",
              f"trainer.out_dir={tmp_path}", *SMALL[:-1]]  # its own lengths
    two, one = _two_and_one(tmp_path, *common)
    assert all(m["expert/rows"] > 0 and m["actor/expert_token_frac"] > 0 for m in two[1:])
    same_lines(two, one)
    start = load_file(str(SRC / "rlvr" / "assets" / "countdown-dllm-warmstart" / "model.safetensors"))
    same_weights(checkpoint_weights(tmp_path / "two", 3), checkpoint_weights(tmp_path / "one", 3), start)
