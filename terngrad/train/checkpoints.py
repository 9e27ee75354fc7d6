"""Checkpoints: files that are whole, or refused with the reason, and what a training run keeps
in them.

The file: a checkpoint is ``checkpoint-<step, 8 digits>.pt`` in the run's folder: the 16-byte magic
``TERNGRAD-CKPT-1\\n``, the SHA-256 of the rest, then what ``torch.save`` wrote. It is written to
a temporary file, fsynced and renamed (:func:`~terngrad.util.files.atomic_write`), so a crash
leaves the previous checkpoints untouched; :func:`load` refuses a truncated, bit-flipped or
foreign file with a one-line ``ValueError`` and reads the rest with ``weights_only=True`` (no
pickled code runs). :func:`prune` keeps the newest ``keep``.

The contents (format :data:`FORMAT`): the run's config, the step, wall-clock and training
seconds, the testbed's wire bytes per rank, the model, optimizer and schedule states, and every
rank's hook state and random generator, and the metrics record of the evaluation made at its
step, if one was (:func:`training_checkpoint`); :func:`load_run` reads one
back for the run it belongs to, :func:`read_training_checkpoint` for anyone (``terngrad study
--from-checkpoint``).
"""

from __future__ import annotations

import hashlib
import io
import re
from pathlib import Path
from typing import Any

import torch

from terngrad.train.config import RESUMABLE_CHANGES, TrainConfig
from terngrad.util.files import MEMORY_LIMIT, atomic_write, read_bounded

#: the layout of a training checkpoint's contents
FORMAT = 2
MAGIC = b"TERNGRAD-CKPT-1\n"
_DIGEST = 32
_NAME = re.compile(r"^checkpoint-(\d{8})\.pt$")


class Unusable(ValueError):
    """A checkpoint file no run can resume from: damaged, not a whole training checkpoint, or
    with contents that do not fit the run it belongs to (one line)."""


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
    """The checkpoint in ``path``; ``ValueError`` saying what is wrong with it otherwise (a
    FIFO, device or folder, or a file over :data:`~terngrad.util.files.MEMORY_LIMIT`, is
    refused before anything is read)."""
    raw = read_bounded(path, MEMORY_LIMIT, "checkpoint")
    head = len(MAGIC) + _DIGEST
    if not raw.startswith(MAGIC):
        raise Unusable(f"{path} is not a terngrad training checkpoint")
    body = memoryview(raw)[head:]  # (no copy of what may be gigabytes)
    if not body or hashlib.sha256(body).digest() != raw[len(MAGIC) : head]:
        raise Unusable(
            f"checkpoint {path} is damaged (truncated or modified: its checksum does not match)"
        )
    stream = io.BytesIO(raw)
    stream.seek(head)
    try:
        checkpoint = torch.load(stream, map_location="cpu", weights_only=True)
    except Exception as exc:  # a checksum-valid file that torch cannot read: another version
        raise Unusable(f"cannot read checkpoint {path}: {str(exc).splitlines()[0]}") from None
    if not isinstance(checkpoint, dict):
        raise Unusable(f"{path} is not a terngrad training checkpoint")
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


# --------------------------------------------------------------------------- a run's contents

#: what a training checkpoint holds besides its format and config, and of which type
_CONTENTS = {
    "step": int, "seconds": float, "model": dict, "optimizer": dict, "schedule": dict,
    "hook_states": list, "rng_states": list,
}  # fmt: skip


def training_checkpoint(
    cfg: TrainConfig, step: int, seconds: float, train_seconds: float,
    wire_bytes: list[int] | None, model: dict, optimizer: dict, schedule: dict,
    hook_states: list[Any], rng_states: list[torch.Tensor],
    evaluation: dict[str, Any] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The contents of a training checkpoint, ready for :func:`save`; ``evaluation``: the
    metrics record of an evaluation made at this step (a resumed run writes it back if
    ``metrics.jsonl`` lost it)."""
    return {
        "format": FORMAT,
        "config": cfg.to_dict(),
        "step": step,
        "seconds": seconds,
        "train_seconds": train_seconds,
        "wire_bytes": wire_bytes,
        "model": model,
        "optimizer": optimizer,
        "schedule": schedule,
        "hook_states": hook_states,
        "rng_states": rng_states,
        "evaluation": evaluation,
    }


def read_training_checkpoint(path: Path | str, contents: tuple[str, ...] = ("model",)) -> dict:
    """A ``terngrad train`` checkpoint of this version (checksum verified, no pickled code
    run) that holds ``contents`` (keys of a whole one); ``ValueError`` with one line
    otherwise."""
    ckpt = load(Path(path))
    if ckpt.get("format") != FORMAT or not isinstance(ckpt.get("config"), dict):
        raise Unusable(f"{path} is not a terngrad training checkpoint of this version")
    for key in contents:
        kind, value = _CONTENTS[key], ckpt.get(key)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise Unusable(
                f"{path} is not a whole terngrad training checkpoint: its {key!r} is "
                f"{'missing' if key not in ckpt else type(value).__name__}"
            )
    return ckpt


def saved_config(path: Path | str, ckpt: dict[str, Any]) -> TrainConfig:
    """The config a checkpoint was written with; ``ValueError`` if this version cannot read it."""
    try:
        return TrainConfig.from_dict(ckpt["config"])
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{path} holds a configuration this version cannot read: {exc}") from None


def load_run(path: Path, cfg: TrainConfig) -> dict[str, Any]:
    """A checkpoint of the run ``cfg`` (fields other than ``RESUMABLE_CHANGES`` must match),
    with everything a worker reads from it."""
    ckpt = read_training_checkpoint(path, tuple(_CONTENTS))
    saved = saved_config(path, ckpt)
    differing = saved.diff(cfg, RESUMABLE_CHANGES)
    if differing:
        raise ValueError(
            f"{path} belongs to a different run (this run's settings instead of the "
            f"checkpoint's: {'; '.join(differing)}): resume with the same settings or choose "
            "another --out"
        )
    ranks = (len(ckpt["hook_states"]), len(ckpt["rng_states"]))
    if ranks != (saved.workers, saved.workers) or not 0 <= ckpt["step"] <= 2**62:
        raise Unusable(
            f"{path} is not a whole terngrad training checkpoint: it holds {ranks[0]} hook "
            f"states and {ranks[1]} generators for {saved.workers} workers, at step "
            f"{ckpt['step']}"
        )
    evaluation = ckpt.get("evaluation")
    if evaluation is not None and (
        not isinstance(evaluation, dict) or evaluation.get("step") != ckpt["step"]
    ):
        raise Unusable(
            f"{path} is not a whole terngrad training checkpoint: its evaluation record is not "
            f"one of step {ckpt['step']}"
        )
    named = _NAME.match(Path(path).name)
    if named and int(named.group(1)) != ckpt["step"]:
        raise Unusable(
            f"{path} is not a whole terngrad training checkpoint: it holds step {ckpt['step']}, "
            f"and its name says step {int(named.group(1))}"
        )
    return ckpt


def resume_point(folder: Path, resume: str | None = None) -> Path | None:
    """The checkpoint a run starts from: ``resume`` if given, else the newest in ``folder``."""
    if resume is not None:
        return Path(resume)
    return latest(folder)
