"""`rlvr sft --out` never destroys a model: the base model's folder is refused, a non-empty folder
needs --overwrite, and the refusal comes before any training."""

import pytest

from rlvr.cli import main
from rlvr.models.causal_lm import resolve_model_path
from rlvr.sft.supervised import check_output_dir

FAST = ["sft.steps=1", "sft.batch_size=4", "task.heldout_size=4", "trainer.threads=1"]


def test_the_base_model_folder_is_refused_even_with_overwrite(tmp_path, capsys):
    base = resolve_model_path("rlvr:countdown-warmstart")
    before = sorted((p.name, p.stat().st_size) for p in base.iterdir())
    for overwrite in ([], ["--overwrite"]):
        assert main(["sft", "--out", str(base), *overwrite, *FAST]) == 2
        assert "holds the base model" in capsys.readouterr().err
    assert sorted((p.name, p.stat().st_size) for p in base.iterdir()) == before
    with pytest.raises(Exception, match="holds the base model"):
        check_output_dir(base.parent, "rlvr:countdown-warmstart", overwrite=True)  # a parent folder too


def test_a_non_empty_folder_needs_overwrite_and_only_one_rlvr_made_is_replaced(tmp_path, capsys):
    out = tmp_path / "warm"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert main(["sft", "--out", str(out), *FAST]) == 2
    assert "--overwrite" in capsys.readouterr().err and (out / "keep.txt").read_text() == "mine"
    assert main(["sft", "--out", str(out), "--overwrite", *FAST]) == 2  # a folder rlvr did not make stays
    assert "not made by rlvr" in capsys.readouterr().err and (out / "keep.txt").read_text() == "mine"
    made = tmp_path / "made"
    assert main(["sft", "--out", str(made), *FAST]) == 0
    (made / "stale.txt").write_text("old")
    assert main(["sft", "--out", str(made), "--overwrite", *FAST]) == 0  # a warm start rlvr made is replaced
    assert (made / "config.json").is_file() and not (made / "stale.txt").exists()
