"""What one rank's exchanges did: bytes, steps, skipped steps, and where the time went."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from terngrad.comm.exchanges.link import ByteCounter


@dataclass(frozen=True)
class Stats:
    """What one rank's exchanges did: bytes as handed to the collectives and the
    point-to-point messages sent (see :mod:`terngrad.comm.exchanges.link` for how each collective is
    counted), steps, skipped steps."""

    steps: int
    skipped_steps: int
    bytes_sent: int
    bytes_received: int
    last_step_bytes_sent: int
    last_step_bytes_received: int
    messages_sent: int = 0
    last_step_messages_sent: int = 0

    @property
    def bytes_sent_per_step(self) -> float:
        return self.bytes_sent / self.steps if self.steps else 0.0

    @property
    def bytes_received_per_step(self) -> float:
        return self.bytes_received / self.steps if self.steps else 0.0


@dataclass(frozen=True)
class Timing:
    """Where one rank's exchange time went (wall clock, all steps so far): ``exchange_seconds``
    in the hook's work on buckets, ``collective_seconds`` of it inside collectives (waiting for
    the network and the other ranks), the rest — ``codec_seconds`` — encoding and decoding."""

    exchange_seconds: float
    collective_seconds: float

    @property
    def codec_seconds(self) -> float:
        return max(self.exchange_seconds - self.collective_seconds, 0.0)


class Counters:
    """Steps, skipped steps, and the bytes and messages of the last step, over a link's
    :class:`ByteCounter`.

    A step is counted where it ends (:meth:`close_step`: the DDP reducer's), or where it
    starts, for an exchange that never learns where a step ends (:meth:`open_step`: FSDP's
    reduce-scatters); then the last step's counts are those since it started."""

    def __init__(self, bytes: ByteCounter) -> None:
        self.bytes = bytes
        self.steps = self.skipped_steps = 0
        #: the step last counted by :meth:`skip_open_step`
        self.skipped_step = 0
        self.exchange_seconds = 0.0
        self._step_start = (0, 0, 0)
        self._last_step = (0, 0, 0)
        self._open = False

    @contextlib.contextmanager
    def timed(self) -> Iterator[None]:
        """Add the block's wall-clock seconds to :attr:`exchange_seconds` (raised or not)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.exchange_seconds += time.perf_counter() - start

    def _now(self) -> tuple[int, int, int]:
        return (self.bytes.sent, self.bytes.received, self.bytes.messages)

    def _since_start(self) -> tuple[int, ...]:
        return tuple(a - b for a, b in zip(self._now(), self._step_start, strict=True))

    def close_step(self, skipped: bool) -> None:
        """A step is over: count it, and what it moved."""
        self._last_step = self._since_start()
        self._step_start = self._now()
        self.steps += 1
        self.skipped_steps += skipped

    def open_step(self) -> None:
        """A step starts: count it, and from here on what it moves."""
        self._step_start = self._now()
        self.steps += 1
        self._open = True

    def skip_open_step(self) -> None:
        """The step :meth:`open_step` started is skipped (counted once, however often said)."""
        if self.skipped_step != self.steps:
            self.skipped_step = self.steps
            self.skipped_steps += 1

    def stats(self) -> Stats:
        last = self._since_start() if self._open else self._last_step
        return Stats(
            steps=self.steps,
            skipped_steps=self.skipped_steps,
            bytes_sent=self.bytes.sent,
            bytes_received=self.bytes.received,
            last_step_bytes_sent=last[0],
            last_step_bytes_received=last[1],
            messages_sent=self.bytes.messages,
            last_step_messages_sent=last[2],
        )

    def timing(self) -> Timing:
        return Timing(self.exchange_seconds, self.bytes.seconds)

    def state_dict(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "skipped_steps": self.skipped_steps,
            "bytes_sent": self.bytes.sent,
            "bytes_received": self.bytes.received,
            "messages_sent": self.bytes.messages,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps, self.skipped_steps = state["steps"], state["skipped_steps"]
        self.bytes.sent, self.bytes.received = state["bytes_sent"], state["bytes_received"]
        self.bytes.messages = state.get("messages_sent", 0)  # not counted before 0.3
        self._step_start = self._now()
