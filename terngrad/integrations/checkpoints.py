"""terngrad's per-rank state in the frameworks' checkpoints, so that a run resumed through the
Trainer (``resume_from_checkpoint``) or Lightning (``ckpt_path``) continues the one it was
saved from, bit for bit.

A framework saves rank 0's model and optimizer; what terngrad keeps differs from rank to rank
and is saved per rank (:func:`rank_entry`):

* the hook's state (:meth:`terngrad.ddp.State.state_dict`): random generator, error-feedback
  residuals, local variance, counters;
* with local steps, the DiLoCo's (:meth:`terngrad.diloco.DiLoCo.state_dict`): anchor, outer
  optimizer, pseudo-gradient in flight (``overlap``), the exchange's state, this rank's inner
  optimizer, step counts — and, between outer steps, this rank's parameters (``replica``):
  each replica holds its own steps since the last outer step, and the framework's checkpoint
  holds rank 0's alone.

The Trainer keeps them in files beside its own per-rank ones (:func:`save_file`); Lightning
gathers them into its one checkpoint file. :func:`agree_saved` makes the ranks agree on
whether there is a state to load (none: a warning, and terngrad starts afresh; some ranks
only: refused), :func:`load_entry` refuses, in one line, an entry saved by another number of
ranks or another kind of exchange, and the hook's and DiLoCo's own checks refuse other
settings.
"""

from __future__ import annotations

import io
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from terngrad.comm.front.hook import State
from terngrad.diloco import DiLoCo
from terngrad.util.files import MEMORY_LIMIT, atomic_write, read_bounded

__all__ = ["agree_saved", "file_name", "load_entry", "rank_entry", "read_file", "save_file"]

#: the layout of an entry (:func:`rank_entry`)
FORMAT = 1
_KIND = "terngrad state of a framework checkpoint"


def file_name(rank: int) -> str:
    """The file of rank ``rank``'s entry in a checkpoint folder (the Trainer's)."""
    return f"terngrad-rank{rank}.pt"


def rank_entry(state: State | DiLoCo) -> dict[str, Any]:
    """This rank's terngrad state, as one entry of a framework checkpoint."""
    local = isinstance(state, DiLoCo)
    if local:
        state.wait()  # (the caller's collectives must not race the exchange's thread)
    replica = None
    if local and not state.in_sync:  # this replica's own steps since the last outer step
        replica = [p.detach().clone() for p in state.params]
    return {
        "format": FORMAT,
        "world_size": dist.get_world_size(),
        "local_steps": local,
        "state": state.state_dict(),
        "replica": replica,
    }


def load_entry(state: State | DiLoCo, entry: Any) -> None:
    """Restore :func:`rank_entry` into ``state``: refused in one ``ValueError`` line when it
    was saved by another number of ranks, with or without local steps unlike ``state``, or with
    other settings (the hook's and DiLoCo's checks)."""
    if not isinstance(entry, dict) or entry.get("format") != FORMAT:
        raise ValueError(f"not a {_KIND} (or one of another format version)")
    world, saved_world = dist.get_world_size(), entry.get("world_size")
    if saved_world != world:
        raise ValueError(
            f"this checkpoint's terngrad state was saved by {saved_world} ranks, and {world} "
            "resume it: resume with the same number of processes, or without the checkpoint"
        )
    local = isinstance(state, DiLoCo)
    if entry.get("local_steps") is not local:
        said = ("with", "without") if entry.get("local_steps") else ("without", "with")
        raise ValueError(
            f"this checkpoint's terngrad state was saved {said[0]} local steps and this "
            f"TernGradCallback trains {said[1]} them: resume with the settings it was saved with"
        )
    replica = entry.get("replica")
    if replica is not None and (
        not isinstance(replica, list)
        or [getattr(t, "shape", None) for t in replica] != [p.shape for p in state.params]
    ):
        raise ValueError(f"this {_KIND}'s replica does not fit the model's parameters")
    state.load_state_dict(entry["state"])
    if replica is not None:
        with torch.no_grad():
            for p, saved in zip(state.params, replica, strict=True):
                p.copy_(saved)


def save_file(folder: str | Path, entry: dict[str, Any]) -> None:
    """Write this rank's ``entry`` into ``folder``, atomically (:func:`file_name`)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write(folder / file_name(dist.get_rank()), lambda f: torch.save(entry, f))


def read_file(folder: str | Path) -> dict[str, Any] | None:
    """This rank's entry in ``folder``, or ``None`` where it has none; read with
    ``weights_only=True`` (no pickled code runs)."""
    path = Path(folder) / file_name(dist.get_rank())
    if not path.exists():
        return None
    raw = read_bounded(path, MEMORY_LIMIT, "terngrad state")
    try:
        return torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
    except Exception as exc:  # a file torch cannot read, whatever the reason: one line
        raise ValueError(f"cannot read {path}: {str(exc).splitlines()[0]}") from None


def agree_saved(entry: Any, where: str) -> bool:
    """Whether every rank has an entry to load (one small object all-gather over the ranks):
    none has, a warning and ``False`` (a checkpoint made without terngrad's callback: terngrad
    starts afresh); only some have, a one-line ``ValueError`` naming the others."""
    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, entry is not None)
    if all(every):
        return True
    if not any(every):
        warnings.warn(
            f"terngrad: {where} holds no terngrad state (saved without TernGradCallback?): "
            "terngrad's state starts afresh (no error-feedback residuals; with local steps, "
            "the anchor is the model loaded)",
            RuntimeWarning,
            stacklevel=3,
        )
        return False
    lacking = [r for r, has in enumerate(every) if not has]
    raise ValueError(
        f"terngrad: {where} holds no terngrad state of rank(s) {lacking} (saved by fewer "
        "ranks?): resume with the number of processes it was saved with"
    )
