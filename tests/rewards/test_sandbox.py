"""Sandbox plumbing: modes, the loud warning, SANDBOX_ERROR accounting, stdin, files, limits."""

from __future__ import annotations

import os
import shutil
import warnings

import pytest

import rlvr.rewards.sandbox.sandbox as sbx
from rlvr.rewards.sandbox import Limits, Sandbox, Verdict

FAST = Limits(wall_s=2.0, memory_mb=256)


def test_no_isolation_warns_loudly_once(capsys, monkeypatch):
    monkeypatch.setattr(sbx, "_warned", set())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Sandbox(workers=1, isolation="none")
        Sandbox(workers=1, isolation="none")
    # (a host without per-sample cgroups adds its own one-time warning; this one is about isolation)
    assert len([w for w in caught if issubclass(w.category, sbx.SandboxWarning)
                and "NO SANDBOX ISOLATION" in str(w.message)]) == 1
    assert capsys.readouterr().err.count("rlvr sandbox WARNING: NO SANDBOX ISOLATION") == 1


@pytest.mark.parametrize("mode", ["none", "unshare", "bwrap"])
def test_basic_verdicts_in_every_mode(mode):
    if mode == "unshare" and (os.geteuid() != 0 or shutil.which("unshare") is None):
        pytest.skip("unshare mode needs root")
    if mode == "bwrap" and sbx.detect_isolation() != "bwrap":
        pytest.skip("bubblewrap unavailable")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sb = Sandbox(workers=2, isolation=mode, limits=FAST, base_uid=62000)
    jobs = [dict(source="print(input()[::-1])", stdin="abc\n"),
            dict(source="import helper\nprint(helper.X)", files={"helper.py": "X = 7\n"}),
            dict(source="raise SystemExit(3)"),
            dict(source="1/0"),
            dict(source="while True: pass", limits=Limits(wall_s=1.0)),
            dict(source="print('x' * 5000)", limits=Limits(output_bytes=1000))]
    out = sb.run_many(jobs)
    assert [r.verdict for r in out] == [Verdict.OK, Verdict.OK, Verdict.RUNTIME_ERROR, Verdict.RUNTIME_ERROR,
                                        Verdict.TIMEOUT, Verdict.OUTPUT_LIMIT]
    assert out[0].stdout == "cba\n" and out[1].stdout == "7\n" and "ZeroDivisionError" in out[3].stderr
    assert len(out[5].stdout) == 1000 and out[4].elapsed < 1.8
    sb.close()


def test_sandbox_error_is_ours_and_counted(monkeypatch):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sb = Sandbox(workers=1, isolation="none", limits=FAST)
    monkeypatch.setattr(sbx.launch.subprocess, "Popen", lambda *a, **k: (_ for _ in ()).throw(OSError("no fork")))
    result = sb.run("print(1)")
    assert result.verdict is Verdict.SANDBOX_ERROR and "no fork" in result.detail
    assert sb.counters["sandbox_errors"] == 1
    from rlvr.rewards.code import Grade
    assert Grade(Verdict.SANDBOX_ERROR, 0, 3).reward() is None  # never a silent zero


def test_bad_configuration_is_rejected():
    with pytest.raises(ValueError, match="workers"):
        Sandbox(workers=0)
    with pytest.raises(ValueError, match="isolation"):
        Sandbox(isolation="docker")
    with pytest.raises(ValueError, match="not executable"):
        Sandbox(isolation="none", python="/nonexistent/python3")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = Sandbox(isolation="none").run("x", files={"../evil.py": ""})
    assert result.verdict is Verdict.SANDBOX_ERROR and "plain name" in result.detail


@pytest.mark.parametrize("mode", ["none", "bwrap"])
def test_rlimits_are_the_limits_asked_for(mode):
    """The shell's ``ulimit`` units (KiB, 512-byte blocks) come out as the bytes and counts asked for."""
    if mode == "bwrap" and sbx.detect_isolation() != "bwrap":
        pytest.skip("bubblewrap unavailable")
    limits = Limits(wall_s=3.5, memory_mb=300, file_mb=5, nofile=40, nproc=20)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sb = Sandbox(workers=1, isolation=mode, limits=limits, base_uid=62600)
    r = sb.run("import resource as r\nprint([r.getrlimit(getattr(r, 'RLIMIT_' + n)) for n in "
               "('CPU', 'AS', 'FSIZE', 'NOFILE', 'NPROC', 'CORE')])")
    sb.close()
    assert r.verdict is Verdict.OK, r
    assert r.stdout == f"{[(4, 5), (300 << 20,) * 2, (5 << 20,) * 2, (40, 40), (20, 20), (0, 0)]}\n"
