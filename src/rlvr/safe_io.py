"""Writing files where others may have put things first: the primitives rlvr's writers share.

A run folder, an export folder or an `--out` path may already hold what someone else planted: a
link to a user's file under the name of a temp file, a device node, a folder that is not rlvr's.
So:
1. a whole file is written to a temp file with a unique name in its folder (`mkstemp`: created
   with `O_EXCL`, so never through a link) and renamed over the target (`os.replace` replaces a
   link itself, never what it points at); a write that fails removes the temp file;
2. an output the user names must be a regular file or a new path (`check_output_file`): a
   device, a FIFO, a socket, a link or a folder there is refused in one line;
3. a folder is deleted only when rlvr made it (`MADE_MARKER`, written inside it when it was made)
   and it is neither the working folder nor one above it nor one above a path the command reads
   (`remove_made_folder`);
4. a write that fails on a read-only or full disk is one line naming the path and the free space
   there (`write_error_message`), for the command line to print.
Folders written whole by a library (`save_pretrained`) go to a new temp folder (`temp_folder_for`)
renamed into place, so nothing planted beside the output is written through either.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import stat
import tempfile
from pathlib import Path

from rlvr.errors import ConfigError

MADE_MARKER = ".rlvr-made"  # written into every folder `--force` / `--overwrite` may later delete
WRITE_ERRNOS = {errno.ENOSPC: "no space left", errno.EDQUOT: "disk quota exceeded",
                errno.EROFS: "read-only file system", errno.EACCES: "permission denied",
                errno.EPERM: "operation not permitted", errno.ELOOP: "a symbolic link is in the way"}
PATH_ERRNOS = {errno.ENAMETOOLONG: "a name in it is longer than the file system allows", errno.ENOTDIR:
               "a part of it is a file, not a folder", errno.EISDIR: "it is a directory",
               errno.EEXIST: "a file is already there"}
"""Paths the OS refuses whatever the disk: the output path is wrong, not the disk."""
_KINDS = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a named pipe"), (stat.S_ISSOCK, "a socket"))


def _umask() -> int:
    """This process's umask, read from /proc (`os.umask` can only be read by setting it, which races)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write `path` whole or not at all, through a uniquely named temp file beside it renamed over
    it. The new file keeps a regular file's mode, else gets the umask's; a link at `path` is
    replaced, never followed."""
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as err:  # named by the file asked for, not the temp file
        raise OSError(err.errno, err.strerror, str(path)) from None
    try:
        try:
            old = os.lstat(path)
            mode = stat.S_IMODE(old.st_mode) if stat.S_ISREG(old.st_mode) else 0o666 & ~_umask()
        except FileNotFoundError:
            mode = 0o666 & ~_umask()
        os.fchmod(fd, mode)
        with open(fd, "wb", closefd=False) as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.close(fd)
        fd = -1
        os.replace(tmp, path)
    except BaseException as err:
        if fd >= 0:
            os.close(fd)
        Path(tmp).unlink(missing_ok=True)
        if isinstance(err, OSError) and err.filename in (None, tmp):  # a failed write names no file
            raise OSError(err.errno, err.strerror, str(path)) from None
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | Path, data, **options) -> None:
    atomic_write_text(path, json.dumps(data, **options) + "\n")


def open_new_or_regular(path: str | Path, flags: int, mode: int = 0o644) -> int:
    """`os.open` that never follows a link at `path` and opens only a regular file (a device or a
    FIFO raises `OSError(EINVAL)` naming it); for files rlvr appends to or locks in place."""
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, mode)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def kind_of(path: str | Path) -> str | None:
    """What `path` is when it is not a regular file ("a named pipe", "a symbolic link", ...); None
    for a regular file or a new path."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    return next((name for test, name in _KINDS if test(mode)), None)


def check_output_file(path: str | Path, option: str) -> None:
    """Refuse (one line) an output file path that holds anything but a regular file: writing to a
    device, a FIFO or a socket would hang or feed it HTML, and a link would move the write elsewhere."""
    kind = kind_of(path)
    if kind is not None:
        raise ConfigError(f"{option}: '{path}' is {kind}; rlvr writes only regular files or new paths, "
                          f"choose another path")


def temp_folder_for(out: str | Path) -> Path:
    """A new, uniquely named temp folder beside `out` (never one planted there), with the mode a
    plain `mkdir` would give it, to be renamed to `out` once complete."""
    out = Path(out)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    os.chmod(tmp, 0o777 & ~_umask())
    return tmp


def mark_made(folder: str | Path, command: str) -> None:
    """Record inside `folder` that rlvr (`command`) made it, so a later `--force` may delete it."""
    atomic_write_json(Path(folder) / MADE_MARKER, {"made_by": f"rlvr {command}"})


def _protected(target: Path, reads) -> Path | None:
    """The working folder or a path the command reads, when `target` is it or holds it."""
    for kept in (Path.cwd().resolve(), *(Path(r).resolve() for r in reads)):
        if kept == target or kept.is_relative_to(target):
            return kept
    return None


def removable_folder(folder: str | Path, option: str, *, reads=()) -> None:
    """Refuse (one line) deleting `folder` unless rlvr made it: a real folder (not a link) with
    rlvr's marker in it (a regular file), and neither the working folder, nor above it, nor above
    anything in `reads`. An empty folder holds nothing to lose and passes without the marker."""
    folder = Path(folder)
    kind = kind_of(folder)
    if kind is None and not folder.exists():
        return
    if kind != "a directory":
        raise ConfigError(f"{option}: '{folder}' is {kind or 'a file'}, not a folder rlvr made; choose a new path")
    kept = _protected(folder.resolve(), reads)
    if kept is not None:
        what = "the working folder" if kept == Path.cwd().resolve() else f"'{kept}', which this command reads"
        raise ConfigError(f"{option}: '{folder}' is or holds {what}; choose a new folder")
    marker = folder / MADE_MARKER
    if any(folder.iterdir()) and not (marker.exists() and kind_of(marker) is None):
        raise ConfigError(f"{option}: '{folder}' was not made by rlvr (no {MADE_MARKER} file in it), so it is "
                          f"not deleted; remove it yourself or choose a new folder")


def remove_made_folder(folder: str | Path, option: str, *, reads=()) -> None:
    """Delete `folder` after `removable_folder` allows it (`shutil.rmtree` never follows a link inside)."""
    removable_folder(folder, option, reads=reads)
    if kind_of(folder) == "a directory":
        shutil.rmtree(folder)


def clear_temp(path: str | Path) -> None:
    """Remove whatever is at a temp path rlvr reuses by name: a link or file is unlinked (never
    what it points at), a folder removed with its contents."""
    kind = kind_of(path)
    if kind == "a directory":
        shutil.rmtree(path, ignore_errors=True)
    elif kind is not None or Path(path).is_file():
        Path(path).unlink(missing_ok=True)


def free_space(path: str | Path) -> str:
    """The free space on the disk of `path` (or its nearest existing folder), e.g. '1.2 GB free'."""
    here = Path(path).absolute()
    while not here.exists() and here != here.parent:
        here = here.parent
    try:
        free = shutil.disk_usage(here).free
    except OSError:
        return "free space unknown"
    for unit, size in (("GB", 2**30), ("MB", 2**20), ("KB", 2**10)):
        if free >= size:
            return f"{free / size:.1f} {unit} free"
    return f"{free} bytes free"


def refused_global(err: BaseException) -> str:
    """What a weights-only unpickler refused, from torch's message ('Unsupported global: GLOBAL x.y')."""
    found = re.search(r"GLOBAL ([\w.]+)", str(err))
    return f"the Python object '{found.group(1)}'" if found else "Python objects"


def unpickling_message(err: BaseException, where: str) -> str:
    """One line for a weights file (a model folder's `.bin`) whose pickle names code."""
    return (f"{where} holds a pickle that asks to load {refused_global(err)}, which could run code; rlvr loads only "
            f"weights from it: convert it to safetensors (or load it yourself, if you trust it)")


def write_error(err: BaseException) -> bool:
    """Whether `err` is a write refused by the disk (full, over quota, read-only, not permitted) or a path
    the OS refuses (a name too long, a file where a folder must be)."""
    return isinstance(err, OSError) and (err.errno in WRITE_ERRNOS or err.errno in PATH_ERRNOS)


def write_error_message(err: OSError, fallback: str | Path = ".") -> str:
    """One line for a file operation the disk refused: the path, why, the free space there and the fix."""
    path = err.filename or fallback
    if err.errno in PATH_ERRNOS:
        shown = str(path) if len(str(path)) <= 120 else f"{str(path)[:60]}...{str(path)[-40:]}"
        return f"cannot use the path '{shown}': {PATH_ERRNOS[err.errno]}; choose another path"
    why = WRITE_ERRNOS.get(err.errno, err.strerror or type(err).__name__)
    if err.errno == errno.ELOOP:
        return f"cannot write '{path}': it is a symbolic link, which rlvr never writes through; remove it"
    if err.errno in (errno.EACCES, errno.EPERM):  # a read may meet these too
        return f"cannot access '{path}': {why} ({free_space(path)}); fix its permissions or choose another path"
    fix = "free space there" if err.errno in (errno.ENOSPC, errno.EDQUOT) else "choose a path on a writable disk"
    return f"cannot write '{path}': {why} ({free_space(path)}); {fix}, then run the command again"
