"""``DiLoCo(local_steps="auto")``: ``H`` chosen once, at the :data:`AUTO_PROBE_STEPS`-th
inner step, from two measurements agreed over the ranks (their maximum): the seconds of one
outer exchange on this link (:func:`~terngrad.local_steps.time_exchange`, when DiLoCo is made)
and the seconds of an inner step (between calls of :meth:`AutoLocalSteps.tick`). ``H`` is the
smallest allowed value with ``exchange / (H · step + exchange) ≤ max_comm_share``
(:func:`~terngrad.local_steps.choose_local_steps`).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence

import torch
import torch.distributed as dist

from terngrad.comm.front.synchronizer import Synchronizer
from terngrad.local_steps import AUTO_PROBE_STEPS, choose_local_steps, time_exchange

__all__ = ["AutoLocalSteps"]


class AutoLocalSteps:
    """Times the inner steps and chooses ``H`` for ``exchange`` (the probe exchange runs here,
    a collective: every rank makes one at once)."""

    def __init__(
        self, exchange: Synchronizer, max_comm_share: float, choices: Sequence[int]
    ) -> None:
        self.exchange, self.max_comm_share, self.choices = exchange, max_comm_share, choices
        self.exchange_seconds = time_exchange(exchange)
        self._step_times: list[float] = []

    def tick(self) -> bool:
        """Record an inner step's end; whether enough are timed to :meth:`choose`."""
        self._step_times.append(time.perf_counter())
        return len(self._step_times) >= AUTO_PROBE_STEPS

    def restart(self) -> None:
        """Forget the steps timed so far (a run restored from a checkpoint)."""
        self._step_times = []

    def choose(self) -> dict[str, float]:
        """``H`` from the inner steps timed so far and the probe exchange, both agreed over
        the ranks as their maximum (one 16-byte all-reduce): what was measured and chosen
        (``"local_steps"``)."""
        gaps = [b - a for a, b in itertools.pairwise(self._step_times)]
        measured = torch.tensor([sum(gaps) / len(gaps), self.exchange_seconds],
                                dtype=torch.float64)  # fmt: skip
        dist.all_reduce(measured, op=dist.ReduceOp.MAX, group=self.exchange.reducer.link.group)
        step_s, exchange_s = measured.tolist()
        local_steps = choose_local_steps(step_s, exchange_s, self.max_comm_share, self.choices)
        self._step_times = []
        return {"inner_step_seconds": step_s, "exchange_seconds": exchange_s,
                "max_comm_share": self.max_comm_share, "local_steps": local_steps}  # fmt: skip
