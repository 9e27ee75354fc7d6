"""A run's output folder: one run at a time, no leftovers of a killed one, and never another
run's files overwritten.

* :func:`claim` holds the folder for as long as the run lasts: an exclusive ``flock`` on
  ``.terngrad.lock`` inside it, which holds the holder's PID, host and command. A second run on
  the same folder is refused naming the holder (:class:`FolderInUse`). The workers a launcher
  starts hold the lock with it (a duplicate of its descriptor), so it is held until the last
  process of the run is gone; the kernel drops it then, however they died, so a killed run
  never leaves the folder locked. The lock file is never a link nor another file.
* Under the claim, :func:`remove_leftovers` deletes the temporary files that
  :func:`~terngrad.util.files.atomic_write` leaves when it is killed mid-write (a full-size
  ``.checkpoint-<step>.pt.<random>.tmp`` each): no other writer can be at work then.
* :func:`foreign_outputs` lists the files a run writes (metrics, summary, curves) that a folder
  already holds, which the trainer refuses to overwrite unless they are its own run's.
* :func:`prepare_out` makes every check of a run's folder that writes nothing: writable, the
  checkpoint it would resume from whole, of this run and fitting it (every field a worker
  reads: :mod:`terngrad.train.checkpoint_fit`), no two histories mixed, no other run's outputs
  overwritten. :func:`write_run_config` marks the folder as the run's (``config.json``),
  and :func:`seed_metrics` starts the metrics of a run resumed from another folder's
  checkpoint.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shlex
import socket
import stat
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from terngrad.train import checkpoints
from terngrad.train.checkpoint_fit import check_fit
from terngrad.train.config import RESUMABLE_CHANGES, TrainConfig
from terngrad.train.outputs import CURVES, METRICS, SUMMARY, truncate_metrics
from terngrad.util.files import LEFTOVER, atomic_write_text, read_json, read_text

LOCK = ".terngrad.lock"
CONFIG = "config.json"
#: what a run writes into its folder besides checkpoints (and config.json, its settings)
OUTPUTS = (METRICS, SUMMARY, CURVES)


class FolderInUse(ValueError):
    """Another live process holds the run folder."""


@contextlib.contextmanager
def claim(folder: Path, lock: str = LOCK, what: str = "--out") -> Iterator[int]:
    """Create ``folder`` if needed and hold it (through its file ``lock``) until the block
    ends; :class:`FolderInUse` (one line naming the holder) if another process holds it. Yields
    the lock's file descriptor: a process handed a duplicate of it (the workers of
    :func:`terngrad.train.launch.launch`) holds the folder with this one, until the last of
    them exits. The lock never follows a link nor writes into a file that is not a lock
    (:func:`_open_lock`). A folder this call created is removed again if the block fails while
    the folder holds nothing but the lock."""
    folder = Path(folder)
    created = not folder.exists()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"cannot write into {what} {folder}: {exc.strerror}") from None
    fd = _open_lock(folder / lock, what)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "a process"
            raise FolderInUse(
                f"{what} {folder} is in use by another run ({holder}): wait for it to "
                f"finish, or choose another {what}"
            ) from None
        if not _is_lock_record(os.pread(fd, len(_RECORD), 0)):  # checked under the lock
            raise ValueError(_not_a_lock(folder / lock, what, "a file that is not terngrad's"))
        me = f"PID {os.getpid()} on {socket.gethostname()}, since {time.strftime('%H:%M:%S')}"
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{me}: {shlex.join(sys.argv)}\n".encode(), 0)
        try:
            yield fd
        except BaseException:
            with contextlib.suppress(OSError):  # (the folder may be gone: removed mid-run)
                if created and {p.name for p in folder.iterdir()} <= {lock}:
                    (folder / lock).unlink(missing_ok=True)
                    folder.rmdir()
            raise
    finally:
        os.close(fd)  # drops the lock (unless a worker still holds a duplicate)


#: how every lock record starts (what :func:`claim` writes)
_RECORD = b"PID "


def _is_lock_record(head: bytes) -> bool:
    """An empty lock file (just created), or one that holds a lock record."""
    return head == b"" or head == _RECORD


def _open_lock(path: Path, what: str) -> int:
    """Open (create) the lock file ``path`` for reading and writing; never through a symbolic
    link (``O_NOFOLLOW``), never a FIFO, device or folder, never a file with other names (a
    hard link: writing the record would change that file too). ``ValueError`` with one line
    otherwise."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ValueError(_not_a_lock(path, what, "a symbolic link")) from None
        raise ValueError(f"cannot write into {what} {path.parent}: {exc.strerror}") from None
    info = os.fstat(fd)
    kind = None if stat.S_ISREG(info.st_mode) else "not a regular file"
    if kind is None and info.st_nlink != 1:
        kind = f"a file with {info.st_nlink} names (a hard link)"
    if kind is not None:
        os.close(fd)
        raise ValueError(_not_a_lock(path, what, kind))
    return fd


def _not_a_lock(path: Path, what: str, kind: str) -> str:
    return (
        f"{what} {path.parent} cannot be held: its lock file {path.name} is {kind}, which "
        f"terngrad does not write into; remove {path} (or choose another {what})"
    )


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


def prepare_out(cfg: TrainConfig, resume: str | None = None) -> Path:
    """Every check of ``cfg.out`` that writes nothing (a launch makes them again once it holds
    the folder): a folder, or none yet, that can be written; the checkpoint the run would
    resume from is whole, of this run and not past ``cfg.steps``; no history is mixed with
    another; no other run's outputs are overwritten. ``ValueError`` with one line otherwise
    (a name the file system refuses, too long for one, included)."""
    try:
        return _prepare_out(cfg, resume)
    except OSError as exc:  # the folder's own name or path: ENAMETOOLONG, ELOOP, EACCES
        raise ValueError(f"cannot use --out {cfg.out}: {exc.strerror or exc}") from None


def _prepare_out(cfg: TrainConfig, resume: str | None) -> Path:
    out = Path(cfg.out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} exists and is not a folder")
    parent = next(p for p in (out.absolute(), *out.absolute().parents) if p.exists())
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"cannot write into --out {out}: {parent} is not a writable folder")
    start = checkpoints.resume_point(out, resume)
    if start is None:
        if foreign_outputs(out) and not same_run(out, cfg):
            names = ", ".join(foreign_outputs(out))
            raise ValueError(
                f"--out {out} holds another run's outputs ({names}) and no checkpoint to "
                "resume from: choose another --out, or delete them"
            )
        return out
    try:  # every field a worker reads, against the run it will build: fail now, not in each
        ckpt = checkpoints.load_run(start, cfg)
        check_fit(start, ckpt, cfg)
    except checkpoints.Unusable as exc:
        if resume is not None:
            raise
        older = [s for s in checkpoints.steps(out) if s < checkpoints.steps(out)[-1]]
        then = f"resume from the one before it (step {older[-1]})" if older else "start afresh"
        raise ValueError(
            f"{exc}: move it out of --out {out} (or delete it) and run the same command again "
            f"to {then}"
        ) from None
    if ckpt["step"] > cfg.steps:
        raise ValueError(
            f"--steps {cfg.steps} is fewer than the {ckpt['step']} steps {start} has trained: "
            f"give --steps {ckpt['step']} or more to go on from it, or another --out for a "
            "shorter run"
        )
    if start.absolute().parent != out.absolute():
        held = [checkpoints.path_for(out, s).name for s in checkpoints.steps(out)]
        held += foreign_outputs(out)
        if held:
            raise ValueError(
                f"--out {out} already holds a run ({', '.join(held[:3])}): resuming into it "
                f"from {start}, a checkpoint of another folder, would mix the two; give an "
                "empty --out"
            )
        return out
    newer = [s for s in checkpoints.steps(out) if s > ckpt["step"]]
    if newer:
        raise ValueError(
            f"--out {out} holds checkpoints newer than {start} (step {newer[-1]} > "
            f"{ckpt['step']}): resuming from the older one would mix two histories; choose "
            "another --out, or delete the newer checkpoints first"
        )
    return out


def same_run(out: Path, cfg: TrainConfig) -> bool:
    """Whether ``out/config.json`` (written when a run starts) is this run's: the outputs of a
    run killed before its first checkpoint are its own, and are started afresh."""
    try:
        saved = TrainConfig.from_dict(read_json(out / CONFIG, "run settings")["config"])
    except (ValueError, TypeError, KeyError):
        return False
    return not saved.diff(cfg, RESUMABLE_CHANGES)


def write_run_config(cfg: TrainConfig, resume: str | None = None) -> Path:
    """``cfg.out/config.json``: the run's settings (what marks the folder as this run's, and
    what torchrun's workers read)."""
    path = Path(cfg.out) / CONFIG
    atomic_write_text(path, json.dumps({"config": cfg.to_dict(), "resume": resume}))
    return path


def read_run_config(path: Path | str) -> tuple[TrainConfig, str | None]:
    """The run's config and the checkpoint it was started from, as :func:`write_run_config`
    wrote them."""
    saved = read_json(path, "run settings")
    return TrainConfig.from_dict(saved["config"]), saved["resume"]


def seed_metrics(cfg: TrainConfig, resume: str | None) -> None:
    """A run resumed into an empty folder from another folder's checkpoint starts its
    ``metrics.jsonl`` with that folder's evaluations up to the checkpoint's step."""
    if resume is None or Path(resume).absolute().parent == Path(cfg.out).absolute():
        return
    source = Path(resume).parent / METRICS
    target = Path(cfg.out) / METRICS
    if source.exists() and not target.exists():
        ckpt = checkpoints.load(Path(resume))
        atomic_write_text(target, read_text(source, "metrics"))
        truncate_metrics(target, ckpt["step"], ckpt.get("evaluation"))
