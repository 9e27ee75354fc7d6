"""TensorBoard event files in a run's folder, beside ``metrics.jsonl``, so that a run is read
where users read training (``tensorboard --logdir <out>``, or W&B through it).

Rank 0 writes, through ``torch.utils.tensorboard`` (the ``tensorboard`` package, the extra
``terngrad[tensorboard]``; without it the run trains as ever and says so once):

* every step: ``train/loss`` (that step's batch, rank 0's), ``train/lr``, and with terngrad's
  exchange ``terngrad/bytes_sent`` (what rank 0 handed to the collectives in that step: with
  local steps, all of it at the outer steps) and ``terngrad/skipped_steps`` (so far);
* every evaluation: each number of its ``metrics.jsonl`` record as ``metrics/<key>``.

TensorBoard appends to event files as it goes (nothing to write atomically): each start adds a
file, and a resumed run marks its first step as a restart (``purge_step``), so TensorBoard hides
what an earlier start wrote from that step on, the steps after the checkpoint that the resumed
run trains again. The file is flushed at each evaluation and each skipped step: a run that
stops for non-finite gradients shows them.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

#: the names of TensorBoard's event files
EVENTS = "events.out.tfevents.*"
MISSING = (
    "terngrad: no TensorBoard event files for this run (the tensorboard package is not "
    "installed): pip install 'terngrad[tensorboard]' to have them"
)


class Board:
    """Rank 0's TensorBoard writer; every call does nothing where ``writer`` is ``None`` (the
    other ranks, or no ``tensorboard`` installed)."""

    def __init__(self, writer: Any = None) -> None:
        self.writer = writer
        self.bytes_sent = 0
        self.skipped = 0

    @classmethod
    def open(cls, out: Path, start: int, state: Any) -> Board:
        """The writer of a run in ``out`` that trains on from step ``start`` (0 for a fresh
        one) with the exchange ``state`` (the hook's or local steps'; ``None``: PyTorch's own
        averaging)."""
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            print(MISSING, file=sys.stderr, flush=True)
            return cls()
        # events from step start + 1 on come again from this start: hide an earlier start's
        board = cls(SummaryWriter(str(out), purge_step=start + 1 if start else None))
        if state is not None:  # counts so far (a resumed run's, from its checkpoint)
            board.bytes_sent, board.skipped = state.stats.bytes_sent, state.stats.skipped_steps
        return board

    def step(self, step: int, loss: float, lr: float, state: Any) -> None:
        """Step ``step`` (counted from 1) done, its batch's ``loss`` at rate ``lr``."""
        if self.writer is None:
            return
        self.writer.add_scalar("train/loss", loss, step)
        self.writer.add_scalar("train/lr", lr, step)
        if state is None:
            return
        stats = state.stats
        self.writer.add_scalar("terngrad/bytes_sent", stats.bytes_sent - self.bytes_sent, step)
        self.writer.add_scalar("terngrad/skipped_steps", stats.skipped_steps, step)
        skipped = stats.skipped_steps > self.skipped
        self.bytes_sent, self.skipped = stats.bytes_sent, stats.skipped_steps
        if skipped:  # on disk before a run of them stops training
            self.writer.flush()

    def evaluation(self, record: dict[str, Any]) -> None:
        """An evaluation's record (:mod:`terngrad.train.outputs`), its numbers as scalars."""
        if self.writer is None:
            return
        for key, value in record.items():
            if key != "step" and isinstance(value, int | float) and not isinstance(value, bool):
                self.writer.add_scalar(f"metrics/{key}", value, record["step"])
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
