"""Build-on-first-use loader of the C++ extension in `csrc/`, and its fallback notices.

`load()` compiles `csrc/decode.cpp` (the decode engine, a bound class) and `csrc/training.cpp`
(the training kernels, `torch.ops.rlvr.*`) into one module with `torch.utils.cpp_extension.load`,
once per machine: torch caches the build in `~/.cache/torch_extensions`. The cache key is the
extension's name, so the name carries a hash of the sources, the flags, torch's version and this
CPU's feature flags: an edited source, or a checkout of another version, never loads a stale
build. The first build prints one line (it takes about 30 s); when there is no compiler or ninja,
or the build fails, `load()` returns None after one stderr line and callers run their
pure-PyTorch path.
"""

from __future__ import annotations

import hashlib
import sys
import threading
from pathlib import Path

import torch

CSRC = Path(__file__).parent / "csrc"
SOURCES = ("decode.cpp", "training.cpp")
HEADERS = ("common.h",)
CFLAGS = ("-O3", "-march=native")

_LOCK = threading.Lock()
_STATE: dict = {}


def load():
    """The compiled extension module (`Engine`; its loading defines `torch.ops.rlvr`), or None
    (after one stderr line) if it cannot be built here. One attempt per process."""
    with _LOCK:
        if "module" not in _STATE:
            _STATE["module"] = _build()
        return _STATE["module"]


def load_for(model, what: str = ""):
    """`load()` for `model`'s weights: None (after one stderr line) unless they are float32 on CPU,
    the only layout the kernels take. `what` names the user in that line when it is not the decode
    step (e.g. "training kernels")."""
    weight = model.get_input_embeddings().weight
    if weight.dtype != torch.float32 or weight.device.type != "cpu":
        needs = "they take" if what else "the C++ decode engine takes"
        warn_once(f"{weight.dtype} on {weight.device.type}: {needs} float32 on CPU", what=what)
        return None
    module = load()
    if module is None and what:  # the build failure itself was reported once, for the decode step
        warn_once("the extension could not be built", what=what)
    return module


def fallbacks() -> list[str]:
    """Why this process fell back to eager ops, if it did (for the run's manifest)."""
    return sorted(_STATE.get("warned", ()))


def warn_once(reason: str, *, what: str = "") -> None:
    """One stderr line per reason and process: the caller falls back to eager ops. `what`: the
    user of the extension, when not the decode step (e.g. "training kernels")."""
    key = f"{what}: {reason}" if what else reason
    if key not in _STATE.setdefault("warned", set()):
        _STATE["warned"].add(key)
        message = (f"C++ {what} unavailable ({reason}); using eager ops" if what else
                   f"C++ decode engine unavailable ({reason}); using the eager decode step")
        print(f"rlvr: {message}", file=sys.stderr, flush=True)


def extension_name() -> str:
    """`rlvr_kernels_<hash>`: the hash covers every source and header, the flags, torch's version
    and the CPU (the build uses -march=native, so a shared home directory must not hand one
    machine's build to a CPU with other instructions), and where the sources are: torch's build
    file names them by absolute path, so two checkouts of the same sources sharing one build
    directory rewrite it and rebuild in turn (minutes each, the others waiting on its lock)."""
    digest = hashlib.sha1(str(CSRC.resolve()).encode() + b"\0")
    for name in (*SOURCES, *HEADERS):
        digest.update(name.encode() + b"\0" + (CSRC / name).read_bytes() + b"\0")
    digest.update(" ".join(CFLAGS).encode() + torch.__version__.encode() + _cpu_flags().encode())
    return f"rlvr_kernels_{digest.hexdigest()[:12]}"


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return ""


def _announce_first_build(cpp_extension, name: str) -> None:
    """One line before a cold build, so a first run does not look hung for half a minute."""
    try:
        built = any(Path(cpp_extension._get_build_directory(name, False)).glob("*.so"))
    except Exception:  # noqa: BLE001 -- a private torch helper; the message is only a courtesy
        built = True
    if not built:
        print("rlvr: building the C++ decode engine (once per machine, about 30 s)", file=sys.stderr, flush=True)


def _build():
    try:
        from torch.utils import cpp_extension
        name = extension_name()
        _announce_first_build(cpp_extension, name)
        module = cpp_extension.load(name=name, sources=[str(CSRC / s) for s in SOURCES],
                                    extra_cflags=list(CFLAGS), extra_include_paths=[str(CSRC)], verbose=False)
    except Exception as exc:  # noqa: BLE001 -- any build failure (no compiler/ninja, headers, link) means eager
        warn_once(_reason(exc))
        return None
    from rlvr.kernels import ops
    ops.register()
    return module


def _reason(exc: Exception) -> str:
    """The line of a build failure worth showing: the compiler's first error (file:line: error:
    ..., in csrc/) when there is one, else the exception's first line."""
    lines = str(exc).strip().splitlines()
    errors = [line.strip() for line in lines if ": error:" in line or ": fatal error:" in line]
    return (errors or lines or [type(exc).__name__])[0][:200]
