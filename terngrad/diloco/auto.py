"""``DiLoCo(local_steps="auto")``: ``H`` chosen once, at the :data:`AUTO_PROBE_STEPS`-th
inner step, from two measurements agreed over the ranks (their maximum): the seconds of one
outer exchange on this link (:func:`~terngrad.local_steps.time_exchange`, when DiLoCo is made)
and the seconds of an inner step (between calls of :meth:`AutoLocalSteps.tick`). ``H`` is the
smallest allowed value with ``exchange / (H · step + exchange) ≤ max_comm_share``
(:func:`~terngrad.local_steps.choose_local_steps`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

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
        #: the seconds of the inner steps timed so far (kept in a saved state, so that a run
        #: restored before the choice still chooses at the same inner step)
        self.gaps: list[float] = []
        self._last: float | None = None

    def tick(self, inner_steps: int) -> bool:
        """Record the end of inner step ``inner_steps``; whether it is the one to
        :meth:`choose` at (the :data:`AUTO_PROBE_STEPS`-th)."""
        now = time.perf_counter()
        if self._last is not None:
            self.gaps.append(now - self._last)
        self._last = now
        return inner_steps >= AUTO_PROBE_STEPS

    def restore(self, gaps: Sequence[float]) -> None:
        """Go on from a saved state's ``gaps`` (a restored run: the next step is not timed
        from the last one before the save)."""
        self.gaps, self._last = [float(g) for g in gaps], None

    def choose(self) -> dict[str, float]:
        """``H`` from the inner steps timed so far and the probe exchange, both agreed over
        the ranks as their maximum (one 16-byte all-reduce): what was measured and chosen
        (``"local_steps"``). At least one step is timed: from :data:`AUTO_PROBE_STEPS` ticks,
        or from those a restore kept and the ticks after it."""
        gaps = self.gaps
        measured = torch.tensor([sum(gaps) / len(gaps), self.exchange_seconds],
                                dtype=torch.float64)  # fmt: skip
        self.exchange.agree_max(measured)
        step_s, exchange_s = measured.tolist()
        local_steps = choose_local_steps(step_s, exchange_s, self.max_comm_share, self.choices)
        self.gaps, self._last = [], None
        return {"inner_step_seconds": step_s, "exchange_seconds": exchange_s,
                "max_comm_share": self.max_comm_share, "local_steps": local_steps}  # fmt: skip
