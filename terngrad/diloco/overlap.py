"""The outer exchange in flight (``DiLoCo(overlap=True)``): the averaging of one outer step's
pseudo-gradients runs in a background thread while the next ``H`` inner steps compute (the
overlap of Streaming DiLoCo, Douillard et al. 2025, arXiv 2501.18512, with a delay of one
outer step); its update lands at the next outer step.

What a checkpoint taken before it lands needs is kept with it: this rank's pseudo-gradient as
sent, and the exchange's state before it (so that a restart sends it again, with the same
draws).
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from terngrad.comm.front.synchronizer import Synchronizer
from terngrad.comm.rank.stats import Stats
from terngrad.local_steps import cloned

__all__ = ["InFlight"]


class InFlight:
    """At most one outer exchange running in the background, on ``exchange``."""

    def __init__(self, exchange: Synchronizer) -> None:
        self.exchange = exchange
        self._executor = ThreadPoolExecutor(1, "terngrad-diloco")
        self._future: Future[bool] | None = None
        #: what it averages (the exchange averages in place), this rank's pseudo-gradient as
        #: sent, and the exchange's state before it
        self.deltas: list[torch.Tensor] = []
        self.sent: list[torch.Tensor] = []
        self.exchange_state: dict[str, Any] | None = None
        #: the exchange's counters before it (what :attr:`DiLoCo.stats` reads while it flies)
        self.stats_before: Stats = exchange.stats
        self.node_bytes_before = exchange.node_bytes_sent

    @property
    def pending(self) -> bool:
        """Whether an exchange was launched and not yet taken by :meth:`land`."""
        return self._future is not None

    def launch(self, deltas: list[torch.Tensor], sent: list[torch.Tensor]) -> None:
        """Start averaging ``deltas`` in the background (``sent``: a copy of them)."""
        self.exchange_state = cloned(self.exchange.state_dict())
        self.stats_before = self.exchange.stats
        self.node_bytes_before = self.exchange.node_bytes_sent
        self.sent, self.deltas = sent, deltas
        # grad mode is per thread: the exchange's thread runs under its own no_grad
        average = torch.no_grad()(self.exchange.average)  # (DiLoCo warns of a skip itself)
        self._future = self._executor.submit(average, deltas, False)

    def wait(self) -> None:
        """Block until the exchange in flight (if any) has arrived; it stays pending."""
        if self._future is not None:
            self._future.result()

    def land(self) -> tuple[list[torch.Tensor], bool]:
        """The averaged pseudo-gradients and whether a rank's were not finite (the outer step
        is then skipped), after waiting for them; nothing is pending after."""
        assert self._future is not None, "no outer exchange in flight"
        skipped = self._future.result()
        deltas = self.deltas
        self._future, self.deltas, self.sent, self.exchange_state = None, [], [], None
        return deltas, skipped
