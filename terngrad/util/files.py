"""Writing files so that nothing is ever half-written, and reading them so that nothing given as
a file can hang the reader or fill its memory.

* :func:`atomic_write` — a temporary file beside the target, fsynced, renamed over it.
* :func:`read_bounded` — the bytes of a *regular* file of at most ``limit`` bytes: a FIFO, a
  device, a folder or a file too large is refused with one line before anything is read, and
  the read itself stops at the limit (a file that grows meanwhile is refused too).
  :func:`read_json` and :func:`read_text` build on it; :data:`MEMORY_LIMIT` is the bound for
  what can be as large as a model (a checkpoint, a data set).
"""

from __future__ import annotations

import json
import os
import re
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

#: the temporary files of :func:`atomic_write`: "." + the target's name + "." + mkstemp's
#: random part + ".tmp"; one is left behind only when its writer was killed mid-write
LEFTOVER = re.compile(r"^\..+\.[A-Za-z0-9_]{8}\.tmp$")


def atomic_write(path: Path, write: Callable[[BinaryIO], None]) -> None:
    """Call ``write`` on a temporary file beside ``path``, fsync it, then rename it over
    ``path``: a crash at any point leaves the old file or the new one, whole."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; outputs get the usual mode
        os.replace(tmp, path)
        _fsync_folder(path.parent)  # the rename itself survives a power loss
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda f: f.write(text.encode()))


def _memory_limit() -> int:
    """A quarter of this machine's memory: reading a file and unpacking what it holds (a copy
    or two) must leave the rest to the run."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 4
    except (ValueError, OSError):  # no such sysconf here
        return 4 << 30


#: the largest file read whole that can be as large as a model (a checkpoint, a data set)
MEMORY_LIMIT = _memory_limit()
#: the largest JSON or text record file a run reads back (settings, summaries, metrics)
RECORD_LIMIT = 256 << 20


def read_bounded(path: Path | str, limit: int, what: str) -> bytes:
    """The bytes of the regular file ``path`` (``what`` names it in errors), at most ``limit``
    of them. ``ValueError`` with one line, before anything is read, if it is missing or not a
    regular file (a FIFO would block the reader for ever, a device never end) or larger than
    ``limit``; ``FileNotFoundError`` is a ``ValueError`` here too. The open never blocks."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ValueError(f"no {what} at {path}") from None
    except OSError as exc:
        raise ValueError(f"cannot read {what} {path}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(
                f"{what} {path} is {_kind(info.st_mode)}, not a regular file: give the path of "
                "a file"
            )
        if info.st_size > limit:
            raise ValueError(_too_large(path, what, info.st_size, limit))
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(limit + 1 - size, 1 << 24) or 1)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:  # it grew while being read
            raise ValueError(_too_large(path, what, size, limit))
        return b"".join(chunks)
    except OSError as exc:
        raise ValueError(f"cannot read {what} {path}: {exc.strerror}") from None
    finally:
        os.close(fd)


def read_text(path: Path | str, what: str, limit: int = RECORD_LIMIT) -> str:
    """:func:`read_bounded` as UTF-8 text (``ValueError`` naming the file if it is not)."""
    raw = read_bounded(path, limit, what)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        reason = f"{exc.reason} at byte {exc.start}"
        raise ValueError(f"{what} {path} is not UTF-8 text ({reason})") from None


def read_json(path: Path | str, what: str, limit: int = RECORD_LIMIT) -> Any:
    """The JSON document in ``path`` (:func:`read_bounded`); ``ValueError`` with one line if it
    is not JSON."""
    text = read_text(path, what, limit)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{what} {path} is not JSON ({exc.msg} at line {exc.lineno})") from None


def _kind(mode: int) -> str:
    kinds = [(stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
             (stat.S_ISSOCK, "a socket")]  # fmt: skip
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def _too_large(path: Path | str, what: str, size: int, limit: int) -> str:
    return (
        f"{what} {path} holds {size:,} bytes, more than the {limit:,} a {what} is read with "
        "here: is it the right file?"
    )


def _fsync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
