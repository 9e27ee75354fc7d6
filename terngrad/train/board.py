"""TensorBoard event files in a run's folder, beside ``metrics.jsonl``, so that a run is read
where users read training (``tensorboard --logdir <out>``, or W&B through it).

Rank 0 writes (the ``tensorboard`` package, the extra ``terngrad[tensorboard]``; without it the
run trains as ever and says so once):

* every step: ``train/loss`` (that step's batch, rank 0's), ``train/lr``, and with terngrad's
  exchange ``terngrad/bytes_sent`` (what rank 0 handed to the collectives in that step: with
  local steps, all of it at the outer steps) and ``terngrad/skipped_steps`` (so far);
* every evaluation: each number of its ``metrics.jsonl`` record as ``metrics/<key>``.

Each start of a run appends to a file of its own (an event file is a stream of records: nothing
to write atomically); a resumed run marks its first step as a restart, as
``SummaryWriter(purge_step=...)`` does, so TensorBoard hides what an earlier start wrote from
that step on, the steps after the checkpoint that the resumed run trains again.

Written here, in the training thread, through tensorboard's record format and protos, rather
than through ``torch.utils.tensorboard.SummaryWriter``: its writer thread reopens the file for
every record, so a folder removed mid-run would end the run with that thread's traceback, not
the trainer's one line (:func:`terngrad.train.loop._writing`); here the file stays open and a
failure is an ``OSError`` of the write itself. The file is flushed at each evaluation and each
skipped step: a run that stops for non-finite gradients shows them.
"""

from __future__ import annotations

import itertools
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

#: the names of TensorBoard's event files (TensorBoard reads every file with "tfevents" in it)
EVENTS = "events.out.tfevents.*"
MISSING = (
    "terngrad: no TensorBoard event files for this run (the tensorboard package is not "
    "installed): pip install 'terngrad[tensorboard]' to have them"
)
_files = itertools.count()  # a process's files, should two start within a second


class Board:
    """Rank 0's TensorBoard events; every call does nothing where ``records`` (tensorboard's
    ``RecordWriter`` over the open file) is ``None``: the other ranks, or no ``tensorboard``."""

    #: the file in words, for errors
    NAME = "its TensorBoard event file"

    def __init__(self, records: Any = None) -> None:
        self.records = records
        self.bytes_sent = 0
        self.skipped = 0

    @classmethod
    def open(cls, out: Path, start: int, state: Any) -> Board:
        """The events of a run in ``out`` that trains on from step ``start`` (0 for a fresh
        one) with the exchange ``state`` (the hook's or local steps'; ``None``: PyTorch's own
        averaging)."""
        try:
            from tensorboard.compat.proto.event_pb2 import Event, SessionLog
            from tensorboard.summary.writer.record_writer import RecordWriter
        except ImportError:
            print(MISSING, file=sys.stderr, flush=True)
            return cls()
        name = (
            f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}."
            f"{os.getpid()}.{next(_files)}"
        )
        board = cls(RecordWriter(open(Path(out) / name, "xb")))  # noqa: SIM115 (close())
        board._write(Event(wall_time=time.time(), file_version="brain.Event:2"))
        if start:  # events from step start + 1 on come again from this start: hide the old
            restart = SessionLog(status=SessionLog.START)
            board._write(Event(wall_time=time.time(), step=start + 1, session_log=restart))
        if state is not None:  # counts so far (a resumed run's, from its checkpoint)
            board.bytes_sent, board.skipped = state.stats.bytes_sent, state.stats.skipped_steps
        board.records.flush()
        return board

    def step(self, step: int, loss: float, lr: float, state: Any) -> None:
        """Step ``step`` (counted from 1) done, its batch's ``loss`` at rate ``lr``."""
        if self.records is None:
            return
        values = {"train/loss": loss, "train/lr": lr}
        if state is not None:
            stats = state.stats
            values["terngrad/bytes_sent"] = stats.bytes_sent - self.bytes_sent
            values["terngrad/skipped_steps"] = stats.skipped_steps
            skipped = stats.skipped_steps > self.skipped
            self.bytes_sent, self.skipped = stats.bytes_sent, stats.skipped_steps
        self._scalars(step, values)
        if state is not None and skipped:  # on disk before a run of them stops training
            self.records.flush()

    def evaluation(self, record: dict[str, Any]) -> None:
        """An evaluation's record (:mod:`terngrad.train.outputs`), its numbers as scalars."""
        if self.records is None:
            return
        numbers = {
            f"metrics/{key}": value
            for key, value in record.items()
            if key != "step" and isinstance(value, int | float) and not isinstance(value, bool)
        }
        self._scalars(record["step"], numbers)
        self.records.flush()

    def close(self) -> None:
        if self.records is not None:
            self.records.close()

    def _scalars(self, step: int, values: dict[str, float]) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        summary = Summary(value=[Summary.Value(tag=t, simple_value=v) for t, v in values.items()])
        self._write(Event(wall_time=time.time(), step=step, summary=summary))

    def _write(self, event: Any) -> None:
        self.records.write(event.SerializeToString())
