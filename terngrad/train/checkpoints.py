"""Checkpoint files that are whole, or refused with the reason.

A checkpoint is ``checkpoint-<step, 8 digits>.pt`` in the run's folder: the 16-byte magic
``TERNGRAD-CKPT-1\\n``, the SHA-256 of the rest, then what ``torch.save`` wrote. It is written to
a temporary file, fsynced and renamed (:func:`~terngrad.util.files.atomic_write`), so a crash
leaves the previous checkpoints untouched; :func:`load` refuses a truncated, bit-flipped or
foreign file with a one-line ``ValueError`` and reads the rest with ``weights_only=True`` (no
pickled code runs). :func:`prune` keeps the newest ``keep``.
"""

from __future__ import annotations

import hashlib
import io
import re
from pathlib import Path
from typing import Any

import torch

from terngrad.util.files import atomic_write

MAGIC = b"TERNGRAD-CKPT-1\n"
_DIGEST = 32
_NAME = re.compile(r"^checkpoint-(\d{8})\.pt$")


def path_for(folder: Path, step: int) -> Path:
    return folder / f"checkpoint-{step:08d}.pt"


def save(path: Path, checkpoint: dict[str, Any]) -> None:
    """Write ``checkpoint`` to ``path`` atomically, with its checksum."""
    buf = io.BytesIO()
    torch.save(checkpoint, buf)
    payload = buf.getvalue()
    digest = hashlib.sha256(payload).digest()

    def write(f) -> None:
        f.write(MAGIC)
        f.write(digest)
        f.write(payload)

    atomic_write(path, write)


def load(path: Path) -> dict[str, Any]:
    """The checkpoint in ``path``; ``ValueError`` saying what is wrong with it otherwise."""
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        raise ValueError(f"no checkpoint at {path}") from None
    except OSError as exc:
        raise ValueError(f"cannot read checkpoint {path}: {exc.strerror}") from None
    head = len(MAGIC) + _DIGEST
    if not raw.startswith(MAGIC):
        raise ValueError(f"{path} is not a terngrad training checkpoint")
    if len(raw) <= head or hashlib.sha256(raw[head:]).digest() != raw[len(MAGIC) : head]:
        raise ValueError(
            f"checkpoint {path} is damaged (truncated or modified: its checksum does not match)"
        )
    try:
        checkpoint = torch.load(io.BytesIO(raw[head:]), map_location="cpu", weights_only=True)
    except Exception as exc:  # a checksum-valid file that torch cannot read: another version
        raise ValueError(f"cannot read checkpoint {path}: {str(exc).splitlines()[0]}") from None
    if not isinstance(checkpoint, dict):
        raise ValueError(f"{path} is not a terngrad training checkpoint")
    return checkpoint


def steps(folder: Path) -> list[int]:
    """The steps of the checkpoints in ``folder``, oldest first."""
    if not folder.is_dir():
        return []
    found = (_NAME.match(p.name) for p in folder.iterdir())
    return sorted(int(m.group(1)) for m in found if m)


def latest(folder: Path) -> Path | None:
    """The newest checkpoint in ``folder``, if any."""
    found = steps(folder)
    return path_for(folder, found[-1]) if found else None


def prune(folder: Path, keep: int) -> None:
    """Delete all but the newest ``keep`` checkpoints."""
    for step in steps(folder)[:-keep]:
        path_for(folder, step).unlink(missing_ok=True)
