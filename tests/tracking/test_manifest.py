"""run.json provenance: code, environment, hardware, data fingerprints, start/end and exit status."""

from __future__ import annotations

import hashlib
import json

import pytest

from rlvr.tracking.run_dir import RunDir, fingerprint, finish_manifest, manifest, recorded_exit


def test_manifest_records_code_environment_hardware_and_data(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    data = tmp_path / "train.jsonl"
    data.write_text('{"question": "1+1", "answer": "2"}\n')
    info = manifest(["rlvr", "train", "seed=3"], 3, config={"seed": 3, "algo": {"objective": "gspo"}},
                    data_files=[data])
    assert info["command"] == ["rlvr", "train", "seed=3"] and info["seed"] == 3
    assert len(info["git_sha"] or "x" * 40) == 40 and isinstance(info["git_dirty"], (bool, type(None)))
    assert info["packages"]["torch"] and info["python"] and info["hostname"]
    assert info["torch_threads"] >= 1 and info["cpu"] and info["cpu_count"] >= 1 and isinstance(info["gpus"], list)
    assert info["env"]["PYTHONHASHSEED"] == "0"
    assert info["datasets"][0]["sha256"] == hashlib.sha256(data.read_bytes()).hexdigest()
    assert info["config"]["algo"]["objective"] == "gspo" and len(info["config_sha256"]) == 64
    json.dumps(info)  # serialisable as is


def test_fingerprint_of_a_folder_changes_with_content_and_names(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.txt").write_text("x")
    first = fingerprint(tmp_path / "d")
    (tmp_path / "d" / "a.txt").rename(tmp_path / "d" / "b.txt")
    renamed = fingerprint(tmp_path / "d")
    assert first["files"] == 1 and first["sha256"] != renamed["sha256"]
    assert fingerprint(tmp_path / "nope")["missing"]


def test_finish_and_recorded_exit(tmp_path):
    run = RunDir(tmp_path)
    run.write_json("run.json", {**manifest(["rlvr"], 0), "status": "running"})
    info = finish_manifest(run, "finished", exit_status=0, final={"step": 3})
    assert info["status"] == "finished" and info["exit_status"] == 0 and info["duration_s"] >= 0
    assert run.read_json("run.json")["final"] == {"step": 3} and "ended" in run.read_json("run.json")

    with pytest.raises(FloatingPointError), recorded_exit(run):
        raise FloatingPointError("non-finite metrics at step 7")
    after = run.read_json("run.json")
    assert after["status"] == "failed" and after["exit_status"] == 1 and "step 7" in after["error"]
