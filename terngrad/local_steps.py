"""Local steps (:class:`terngrad.diloco.DiLoCo`) at run time: the settings a consumer runs
(:func:`local_of`; the settings themselves: :class:`~terngrad.comm.spec.local.LocalSteps`), the
outer optimizer, and the choice of ``H`` for ``local_steps="auto"`` from the measured inner
step and outer exchange."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from typing import Any

import torch

from terngrad.comm.front.synchronizer import Synchronizer
from terngrad.comm.spec import methods
from terngrad.comm.spec.local import KEYWORDS, LOCAL_STEPS, LocalSteps
from terngrad.comm.spec.over import over

__all__ = ["AUTO_MAX_LOCAL_STEPS", "AUTO_PROBE_STEPS", "LOCAL_STEPS", "LocalSteps",
           "auto_h_choices", "choose_local_steps", "cloned", "local_of", "outer_sgd",
           "time_exchange"]  # fmt: skip

#: ``local_steps="auto"`` decides ``H`` at this inner step, from the seconds between the
#: :meth:`DiLoCo.step` calls before it (the first step, with its warm-up, left out)
AUTO_PROBE_STEPS = 4
#: ``local_steps="auto"`` without ``auto_choices``: any ``H`` from 1 to this (DiLoCo's largest)
AUTO_MAX_LOCAL_STEPS = 500


def outer_sgd(anchor: list[torch.Tensor], local: LocalSteps) -> torch.optim.SGD:
    """DiLoCo's outer optimizer over the ``anchor``: SGD at ``local.outer_lr`` with
    ``local.outer_momentum``, Nesterov's where ``local.nesterov`` (plain SGD at momentum 0)."""
    return torch.optim.SGD(anchor, lr=local.outer_lr, momentum=local.outer_momentum,
                           nesterov=local.nesterov)  # fmt: skip


def choose_local_steps(
    step_seconds: float, exchange_seconds: float, max_comm_share: float, choices: Sequence[int]
) -> int:
    """The smallest ``H`` of ``choices`` whose outer exchange takes at most ``max_comm_share``
    of the time: ``exchange / (H · step + exchange) ≤ share``, i.e.
    ``H ≥ exchange · (1 − share) / (share · step)``; the largest choice if none does.

    >>> choose_local_steps(0.05, 0.5, 0.1, range(1, 501))  # 0.5 s a step's 10x: H = 90
    90
    """
    need = exchange_seconds * (1 - max_comm_share) / (max_comm_share * step_seconds)
    fitting = [h for h in choices if h >= need * (1 - 1e-9)]
    return min(fitting) if fitting else max(choices)


def local_of(settings: dict[str, Any], default: int, **given: Any) -> LocalSteps:
    """The local steps a consumer (``DiLoCo``, both callbacks) runs: those of the method
    ``settings["method"]`` (a name or a :class:`~terngrad.comm.spec.method_spec.Method`) with
    the keywords ``given`` over it (:func:`~terngrad.comm.spec.over.over`: one the method sets
    otherwise is refused in one line naming both), else the keywords' own, ``H = default``
    where none is given. ``settings["method"]`` is left the method without its local steps:
    the exchange of the pseudo-gradients. A keyword left out is ``None``."""
    given = {KEYWORDS.get(k, k): v for k, v in given.items() if v is not None}
    name = settings.get("method")
    m = None if name is None else methods.get(name)
    if m is None or m.local is None:
        return LocalSteps(**{"every": default, **given})
    m = over(m, local=given, spell=lambda name: _KEYWORD_OF.get(name, name))
    settings["method"] = dataclasses.replace(m, local=None)
    assert m.local is not None
    return m.local


#: a field of :class:`LocalSteps` by its keyword (``every``: ``local_steps``)
_KEYWORD_OF = {v: k for k, v in KEYWORDS.items()}


def replicas_apart(inner_steps: int, local_steps: int | str) -> str:
    """What training that ended between two outer steps (``inner_steps`` not a multiple of
    ``local_steps``, or ``"auto"`` before it chose) says: the replicas differ."""
    n = inner_steps
    if local_steps == "auto":
        return (
            f"terngrad: training ended at inner step {n}, before local_steps='auto' chose H (at "
            f"inner step {AUTO_PROBE_STEPS}): each rank's replica holds its own {n} steps and "
            f"they differ; train at least {AUTO_PROBE_STEPS} steps, or give H"
        )
    since = n % int(local_steps)
    return (
        f"terngrad: training ended at inner step {n}, {since} steps after the last outer step "
        f"(local_steps {local_steps}): each rank's replica holds its own last {since} steps and "
        f"they differ (rank 0's checkpoint holds its own); end after a multiple of "
        f"{local_steps} steps (max_steps), or use local_steps=1"
    )


def auto_h_choices(choices: Sequence[int] | None) -> list[int]:
    """The values ``local_steps="auto"`` may take, sorted; one line for a bad list."""
    if choices is None:
        return list(range(1, AUTO_MAX_LOCAL_STEPS + 1))
    values = list(choices) if isinstance(choices, Sequence | range) else None
    if not values or any(isinstance(h, bool) or not isinstance(h, int) or h < 1 for h in values):
        raise ValueError(
            f"auto_choices must be a non-empty list of positive integers, got {choices!r}"
        )
    return sorted(set(values))


def time_exchange(exchange: Synchronizer) -> float:
    """Seconds of one outer exchange on ``exchange``'s link (a collective): two exchanges of
    zeros of the parameters' shapes (the first warms the kernels up), the second timed; the
    exchange's state (generator, residuals, counters) is put back after them."""
    state = cloned(exchange.state_dict())
    seconds = math.inf
    for _ in range(2):
        zeros = [torch.zeros_like(p) for p in exchange.params]
        began = time.perf_counter()
        exchange.average(zeros)
        seconds = time.perf_counter() - began
    exchange.load_state_dict(state)
    return seconds


def cloned(state: Any) -> Any:
    """``state`` with every tensor cloned (a snapshot that later steps do not change)."""
    if isinstance(state, torch.Tensor):
        return state.clone()
    if isinstance(state, dict):
        return {k: cloned(v) for k, v in state.items()}
    if isinstance(state, list | tuple):
        return type(state)(cloned(v) for v in state)
    return state
