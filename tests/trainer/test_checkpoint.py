"""Checkpoints: atomic, checksummed; a corrupt newest one is named with the last good one."""

import pytest
import torch

from rlvr.errors import ConfigError
from rlvr.models.causal_lm import tiny_llama
from rlvr.models.tokenizer import char_tokenizer
from rlvr.trainer.checkpoint import latest_checkpoint, save_checkpoint, verify_checkpoint


def _save(tmp_path, steps, keep_last=3):
    tok = char_tokenizer()
    model = tiny_llama(len(tok), hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32, max_seq_len=32,
                       seed=0)
    for step in steps:
        save_checkpoint(tmp_path, step, model, tok, {"rng": torch.get_rng_state()}, keep_last=keep_last)


def test_keep_last_prunes_and_no_temp_dirs_remain(tmp_path):
    _save(tmp_path, [1, 2, 3, 4], keep_last=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_000003", "step_000004"]
    assert verify_checkpoint(tmp_path / "step_000004") is None


def test_corrupt_newest_checkpoint_names_the_last_good_one(tmp_path):
    _save(tmp_path, [1, 2])
    state = tmp_path / "step_000002" / "trainer_state.pt"
    state.write_bytes(state.read_bytes()[:100])  # a torn write
    with pytest.raises(ConfigError, match=r"step_000002.*corrupt.*last good one is .*step_000001"):
        latest_checkpoint(tmp_path, verify=True)
    assert latest_checkpoint(tmp_path) == tmp_path / "step_000002"  # unverified lookup is unchanged
