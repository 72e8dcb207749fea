"""Opening files rlvr did not just write (recipes, data files, other runs' files): regular files only.

A named pipe, a socket or a device given where a file is expected would block `open()` until a
writer comes, or be read once and then again forever by a loader that opens a file twice (a
size check, then the read). Each is opened without blocking, checked with `fstat` on the open
descriptor (no gap between the check and the read for a path to be swapped in), and refused
with one line unless it is a regular file.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from rlvr.errors import ConfigError

__all__ = ["check_regular", "read_bytes", "read_text"]

_KINDS = [(stat.S_ISFIFO, "a named pipe"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a directory")]


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


PASS_A_FILE = "save the content to a file and pass that"
RUN_FILE = "move it away (rlvr reads and writes a regular file of that name)"


def _refuse(path: Path, what: str, mode: int, fix: str = PASS_A_FILE) -> ConfigError:
    return ConfigError(f"{what} '{path}' is {_kind(mode)}, not a regular file; {fix}")


def check_regular(path: str | Path, what: str) -> None:
    """Refuse `path` unless it is a regular file (or a link to one); a missing path passes (the
    caller says what a missing file means)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as err:
        raise ConfigError(f"{what} '{path}' cannot be read ({err.strerror}); check its permissions") from None
    if not stat.S_ISREG(mode):
        raise _refuse(Path(path), what, mode)


def read_bytes(path: str | Path, what: str, limit: int | None = None, fix: str = PASS_A_FILE) -> bytes:
    """The bytes of the regular file `path`; `what` names it in errors (`recipe`, `data file`).
    `limit`: refuse a file larger than this many bytes (read up to limit + 1, whatever its size claims)."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise ConfigError(f"{what} '{path}' does not exist; check the path") from None
    except OSError as err:
        raise ConfigError(f"{what} '{path}' cannot be read ({err.strerror}); check its permissions") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise _refuse(path, what, mode, fix)
    with os.fdopen(fd, "rb") as handle:
        try:
            data = handle.read() if limit is None else handle.read(limit + 1)
        except OSError as err:
            raise ConfigError(f"{what} '{path}' cannot be read ({err.strerror})") from None
    if limit is not None and len(data) > limit:
        raise ConfigError(f"{what} '{path}' is over {limit} bytes, more than a {what} may be; check that "
                          "it is the file you meant")
    return data


def read_text(path: str | Path, what: str, limit: int | None = None, fix: str = PASS_A_FILE) -> str:
    """`read_bytes` decoded as UTF-8; bytes that are not are an error naming the file and line."""
    data = read_bytes(path, what, limit, fix)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise ConfigError(f"{what} '{path}' is not UTF-8 text (line {line}, byte {err.start}); save it as UTF-8") \
            from None
