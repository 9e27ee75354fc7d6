"""A run's output folder: one run at a time, no leftovers of a killed one, and never another
run's files overwritten.

* :func:`claim` holds the folder for as long as the run lasts: an exclusive ``flock`` on
  ``.terngrad.lock`` inside it, which holds the holder's PID, host and command. A second run on
  the same folder is refused naming the holder (:class:`FolderInUse`). The kernel drops the lock
  when the holder dies, however it dies, so a killed run never leaves the folder locked.
* Under the claim, :func:`remove_leftovers` deletes the temporary files that
  :func:`~terngrad.util.files.atomic_write` leaves when it is killed mid-write (a full-size
  ``.checkpoint-<step>.pt.<random>.tmp`` each): no other writer can be at work then.
* :func:`foreign_outputs` lists the files a run writes (metrics, summary, curves) that a folder
  already holds, which the trainer refuses to overwrite unless they are its own run's.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shlex
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from terngrad.util.files import LEFTOVER

LOCK = ".terngrad.lock"
#: what a run writes into its folder besides checkpoints (and config.json, its settings)
OUTPUTS = ("metrics.jsonl", "summary.json", "curves.png")


class FolderInUse(ValueError):
    """Another live process holds the run folder."""


@contextlib.contextmanager
def claim(folder: Path, lock: str = LOCK, what: str = "--out") -> Iterator[Path]:
    """Create ``folder`` if needed and hold it (through its file ``lock``) until the block
    ends; :class:`FolderInUse` (one line naming the holder) if another process holds it. A
    folder this call created is removed again if the block fails while the folder holds
    nothing but the lock."""
    folder = Path(folder)
    created = not folder.exists()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(folder / lock, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise ValueError(f"cannot write into {what} {folder}: {exc.strerror}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "a process"
            raise FolderInUse(
                f"{what} {folder} is in use by another run ({holder}): wait for it to "
                f"finish, or choose another {what}"
            ) from None
        me = f"PID {os.getpid()} on {socket.gethostname()}, since {time.strftime('%H:%M:%S')}"
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{me}: {shlex.join(sys.argv)}\n".encode(), 0)
        try:
            yield folder
        except BaseException:
            if created and {p.name for p in folder.iterdir()} <= {lock}:
                (folder / lock).unlink(missing_ok=True)
                folder.rmdir()
            raise
    finally:
        os.close(fd)  # drops the lock


def remove_leftovers(folder: Path) -> list[Path]:
    """Delete the temporary files a killed write left in ``folder``; call only under
    :func:`claim`. Returns what was deleted."""
    gone = [p for p in Path(folder).iterdir() if LEFTOVER.match(p.name) and p.is_file()]
    for path in gone:
        path.unlink(missing_ok=True)
    return gone


def foreign_outputs(folder: Path) -> list[str]:
    """The names of :data:`OUTPUTS` that ``folder`` holds."""
    return [name for name in OUTPUTS if (Path(folder) / name).exists()]
