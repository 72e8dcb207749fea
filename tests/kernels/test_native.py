"""The loader's cache key and failure line, without building anything."""

import shutil

from rlvr.kernels import native


def test_every_csrc_file_is_built_and_hashed():
    on_disk = {p.name for p in native.CSRC.iterdir() if p.suffix in (".cpp", ".h")}
    assert on_disk == set(native.SOURCES) | set(native.HEADERS)


def test_the_extension_name_changes_with_any_source(tmp_path, monkeypatch):
    """torch caches builds by name: an edited source (another checkout, another version) must get
    another name, so a stale build is never loaded."""
    before = native.extension_name()
    assert before == native.extension_name() and before.startswith("rlvr_kernels_")
    for name in (*native.SOURCES, *native.HEADERS):
        copy = tmp_path / name.replace(".", "_")
        shutil.copytree(native.CSRC, copy)
        (copy / name).write_text((copy / name).read_text() + "\n// edited\n")
        monkeypatch.setattr(native, "CSRC", copy)
        assert native.extension_name() != before, name


def test_a_build_failure_reports_the_compiler_error_line():
    exc = RuntimeError("Error building extension 'rlvr_kernels_x': [1/3] c++ -MMD ...\n"
                       "/src/rlvr/kernels/csrc/training.cpp:158:18: error: expected ';' before '}' token\n"
                       "  158 |   return {dx, dw}\n")
    assert native._reason(exc) == "/src/rlvr/kernels/csrc/training.cpp:158:18: error: expected ';' before '}' token"
    assert native._reason(RuntimeError("Ninja is required to load C++ extensions")) == (
        "Ninja is required to load C++ extensions")


def test_two_checkouts_of_the_same_sources_get_their_own_build(tmp_path, monkeypatch):
    """torch's build file holds the sources' absolute paths: a shared name would make two
    checkouts rebuild one directory in turn, each waiting on the other's lock."""
    before = native.extension_name()
    copy = tmp_path / "csrc"
    shutil.copytree(native.CSRC, copy)
    monkeypatch.setattr(native, "CSRC", copy)
    assert native.extension_name() != before
