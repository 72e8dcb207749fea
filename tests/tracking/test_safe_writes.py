"""Writes never follow links and never clobber; `--force` deletes only what rlvr made; a
read-only or full disk is one line naming the path and the free space, and leaves nothing partial.

Every test plants something where rlvr writes (a link to a user's file, a device node, a FIFO, a
user's folder) and checks the user's files byte for byte afterwards.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import subprocess
from pathlib import Path

import pytest
from cli_lines import cli, one_line, snapshot
from fake_runs import make_run

from rlvr import safe_io as files
from rlvr.cli import main
from rlvr.errors import ConfigError
from rlvr.models.causal_lm import tiny_llama
from rlvr.models.tokenizer import char_tokenizer
from rlvr.safe_io import MADE_MARKER, atomic_write_text, remove_made_folder
from rlvr.tracking.run_dir import RunDir
from rlvr.trainer.checkpoint import save_checkpoint, verify_checkpoint

MINE = b"the user's own file\n"


@pytest.fixture
def user(tmp_path) -> Path:
    """A user's folder with a file rlvr must never touch."""
    folder = tmp_path / "home"
    folder.mkdir()
    (folder / "notes.txt").write_bytes(MINE)
    return folder


@pytest.fixture
def run(tmp_path) -> Path:
    """A finished run with a checkpoint (no training: a tiny model saved as a checkpoint)."""
    run = make_run(tmp_path / "runs", "grpo_s0", seed=0, steps=4)
    tokenizer = char_tokenizer()
    model = tiny_llama(len(tokenizer), hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                       max_seq_len=32, seed=0)
    save_checkpoint(run / "checkpoints", 4, model, tokenizer, {"optimizer": {}}, keep_last=1)
    return run


# ------------------------------------------------------------------------------ --force


def test_export_force_onto_the_working_folder_leaves_it_byte_identical(run, user, capsys, monkeypatch):
    monkeypatch.chdir(user)
    before = snapshot(user)
    one_line(*cli(["export", str(run), ".", "--force"], capsys), "the working folder")
    assert snapshot(user) == before
    one_line(*cli(["export", str(run), str(user.parent), "--force"], capsys), "holds the run directory")
    monkeypatch.chdir(user.parent)
    one_line(*cli(["export", str(run), str(user), "--force"], capsys), "not made by rlvr")
    assert snapshot(user) == before


def test_force_replaces_an_export_rlvr_made_but_not_once_it_holds_the_working_folder(run, tmp_path, capsys,
                                                                                     monkeypatch):
    out = tmp_path / "exported"
    assert cli(["export", str(run), str(out)], capsys)[0] == 0
    assert json.loads((out / MADE_MARKER).read_text()) == {"made_by": "rlvr export"}
    (out / "scratch.txt").write_text("mine")
    assert cli(["export", str(run), str(out), "--force"], capsys)[0] == 0
    assert not (out / "scratch.txt").exists() and (out / "config.json").is_file()
    (out / "inner").mkdir()
    monkeypatch.chdir(out / "inner")  # a marked folder that holds the working folder is still refused
    one_line(*cli(["export", str(run), str(out), "--force"], capsys), "the working folder")


def test_remove_made_folder_refuses_a_link_a_forged_marker_link_and_a_file(user, tmp_path):
    link = tmp_path / "link"
    link.symlink_to(user)
    forged = tmp_path / "forged"
    forged.mkdir()
    (forged / "keep").write_bytes(MINE)
    (forged / MADE_MARKER).symlink_to(user / "notes.txt")  # a marker that is a link is no marker
    for target, says in ((link, "symbolic link"), (forged, "not made by rlvr"), (user / "notes.txt", "a file")):
        with pytest.raises(ConfigError, match=says):
            remove_made_folder(target, "--force")
    assert (user / "notes.txt").read_bytes() == MINE and (forged / "keep").read_bytes() == MINE


# ------------------------------------------------------------------------------ planted links


def test_a_lock_planted_as_a_link_a_hard_link_or_a_folder_is_refused_in_one_line(run, user, capsys):
    target = user / "notes.txt"
    lock = run / ".lock"
    for plant, says in ((lambda: lock.symlink_to(target), "a symbolic link"),
                        (lambda: os.link(target, lock), "a hard link"),
                        (lambda: lock.mkdir(), "a directory")):
        plant()
        one_line(*cli(["train", "--resume", str(run), "trainer.steps=5"], capsys), str(lock), says, "remove it")
        assert target.read_bytes() == MINE
        lock.rmdir() if lock.is_dir() and not lock.is_symlink() else lock.unlink()


def test_links_planted_under_temp_names_and_run_files_are_never_written_through(run, user):
    """The names rlvr once wrote run.json, report.html and checkpoints through, and run.json itself."""
    target = user / "notes.txt"
    for name in (".run.json.tmp", ".report.html.tmp", ".disk_reserve"):
        (run / name).symlink_to(target)
    (run / "checkpoints" / ".tmp_step_000005").symlink_to(user)
    dangling = user / "made_by_rlvr"
    (run / "samples.jsonl").unlink()
    (run / "samples.jsonl").symlink_to(dangling)
    before = snapshot(user)
    r = RunDir(run)
    r.write_json("run.json", {"status": "finished"})
    with pytest.raises(OSError) as raised:  # never appended through the link, nor created at its target
        r.append(r.samples_file, {"step": 5})
    assert raised.value.errno == errno.ELOOP
    assert main(["report", str(run)]) == 0
    tokenizer = char_tokenizer()
    model = tiny_llama(len(tokenizer), hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                       max_seq_len=32, seed=0)
    save_checkpoint(run / "checkpoints", 5, model, tokenizer, {}, keep_last=3)
    assert snapshot(user) == before and not dangling.exists()
    assert json.loads((run / "run.json").read_text()) == {"status": "finished"}
    assert verify_checkpoint(run / "checkpoints" / "step_000005") is None
    assert "<html" in (run / "report.html").read_text()
    (run / "run.json").unlink()
    (run / "run.json").symlink_to(target)  # the file itself a link: the link is replaced, its target kept
    r.write_json("run.json", {"status": "again"})
    assert not (run / "run.json").is_symlink() and target.read_bytes() == MINE


def test_a_report_html_that_is_a_link_is_refused(run, user, capsys):
    (run / "report.html").symlink_to(user / "notes.txt")
    one_line(*cli(["report", str(run)], capsys), "report.html", "a symbolic link")
    assert (user / "notes.txt").read_bytes() == MINE


# ------------------------------------------------------------------------------ --out onto nodes


def _nodes(folder: Path) -> dict[str, Path]:
    nodes = {"a named pipe": folder / "fifo"}
    os.mkfifo(nodes["a named pipe"])
    if os.geteuid() == 0:  # a /dev/null of our own: mknod needs root
        nodes["a character device"] = folder / "null"
        os.mknod(nodes["a character device"], stat.S_IFCHR | 0o666, os.makedev(1, 3))
    return nodes


def test_out_onto_a_device_node_or_a_fifo_is_refused_and_the_node_kept(run, fake_runs, tmp_path, capsys):
    for kind, node in _nodes(tmp_path).items():
        before = os.lstat(node)
        for argv in (["report", str(run), "--out", str(node)],
                     ["report", str(run), str(fake_runs / "ppo_s0"), "--out", str(node)],
                     ["runs", "plot", str(fake_runs), "--out", str(node)],
                     ["runs", "compare", str(fake_runs), "--out", str(node)],
                     ["export", str(run), str(node)], ["export", str(run), str(node), "--force"]):
            one_line(*cli(argv, capsys), str(node), kind)
        after = os.lstat(node)
        assert (after.st_mode, after.st_rdev, after.st_ino) == (before.st_mode, before.st_rdev, before.st_ino)
    out = tmp_path / "cmp"
    out.mkdir()
    os.mkfifo(out / "compare.csv")
    one_line(*cli(["runs", "compare", str(fake_runs), "--out", str(out)], capsys), "compare.csv", "a named pipe")
    assert sorted(p.name for p in out.iterdir()) == ["compare.csv"]


# ------------------------------------------------------------------------------ read-only and full disks


def _read_only(folder: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True)


def test_report_and_compare_onto_a_read_only_disk_are_one_line_naming_the_path_and_free_space(
        run, fake_runs, tmpfs, capsys):
    disk = tmpfs("1m")
    (disk / "kept.txt").write_bytes(MINE)
    _read_only(disk)
    before = snapshot(disk)
    one_line(*cli(["report", str(run), "--out", str(disk / "r.html")], capsys),
             f"cannot write '{disk / 'r.html'}'", "read-only file system", "free")
    one_line(*cli(["runs", "compare", str(fake_runs), "--out", str(disk)], capsys),
             "read-only file system", "free")
    assert snapshot(disk) == before


def test_compare_onto_a_full_disk_leaves_no_partial_file(fake_runs, tmpfs, fill_disk, capsys):
    disk = tmpfs("256k")
    out = disk / "cmp"
    out.mkdir()
    fill_disk(disk)
    one_line(*cli(["runs", "compare", str(fake_runs), "--out", str(out)], capsys), "no space left", "free")
    assert list(out.iterdir()) == []


def test_resume_train_and_sft_on_a_read_only_disk_are_one_line(run, tmpfs, capsys):
    disk = tmpfs("4m")
    copy = disk / "run"
    subprocess.run(["cp", "-a", str(run), str(copy)], check=True)
    _read_only(disk)
    before = snapshot(disk)
    one_line(*cli(["train", "--resume", str(copy), "trainer.steps=5"], capsys), str(copy), "read-only", "free")
    one_line(*cli(["train", f"trainer.out_dir={disk}", "trainer.name=new", "trainer.steps=1", "model.path="], capsys),
             "read-only", "free")
    one_line(*cli(["sft", "--out", str(disk / "warm"), "sft.steps=1", "sft.batch_size=4", "task.heldout_size=4",
                   "trainer.threads=1"], capsys), "read-only", "free")
    assert snapshot(disk) == before


def test_a_failed_atomic_write_names_the_target_and_leaves_no_temp(tmp_path, monkeypatch):
    target = tmp_path / "run.json"
    target.write_bytes(MINE)
    os.chmod(target, 0o640)

    def full(*_):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files.os, "fsync", full)
    with pytest.raises(OSError) as raised:
        atomic_write_text(target, "new")
    assert raised.value.errno == errno.ENOSPC and raised.value.filename == str(target)
    assert "no space left" in files.write_error_message(raised.value) and str(target) in files.write_error_message(
        raised.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"] and target.read_bytes() == MINE
    monkeypatch.undo()
    atomic_write_text(target, "new")
    assert target.read_text() == "new" and stat.S_IMODE(target.stat().st_mode) == 0o640  # the mode is kept


def test_the_sandbox_uid_registry_refuses_a_shared_folder_and_never_writes_through_its_links(user, tmp_path):
    from rlvr.rewards.sandbox.uids import allocate_uids, release_uids

    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)  # as in /tmp: anyone could have planted the registry's files
    with pytest.raises(ConfigError, match="RLVR_SANDBOX_UID_DIR"):
        allocate_uids(63000, 2, str(shared))
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    (private / "ranges.json").symlink_to(user / "notes.txt")
    start, token = allocate_uids(63000, 2, str(private))
    release_uids(token, str(private))
    assert start == 63000 and (user / "notes.txt").read_bytes() == MINE
    assert not (private / "ranges.json").is_symlink() and json.loads((private / "ranges.json").read_text()) == []
    (private / "lock").unlink()
    (private / "lock").symlink_to(user / "notes.txt")
    with pytest.raises(OSError) as raised:
        allocate_uids(63000, 2, str(private))
    assert raised.value.errno == errno.ELOOP and (user / "notes.txt").read_bytes() == MINE
