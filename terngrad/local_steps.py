"""The settings of local steps (:class:`terngrad.diloco.DiLoCo`): their checks, and the choice
of ``H`` for ``local_steps="auto"`` from the measured inner step and outer exchange."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from typing import Any

import torch

from terngrad.comm.front.synchronizer import Synchronizer
from terngrad.comm.spec import methods
from terngrad.util.settings import FRACTION, POSITIVE

__all__ = ["AUTO_MAX_LOCAL_STEPS", "AUTO_PROBE_STEPS", "MAX_COMM_SHARE", "OUTER_LR",
           "OUTER_MOMENTUM", "check_outer_settings", "choose_local_steps", "cloned",
           "local_steps_of", "outer_sgd", "time_exchange"]  # fmt: skip

#: ``H``, the inner steps between two outer steps, where neither a method nor ``local_steps=``
#: says it (``DiLoCo``)
LOCAL_STEPS = 16
#: DiLoCo's outer step (its paper's): SGD at this rate with Nesterov momentum 0.9 — the one
#: place these defaults are written (``DiLoCo``, ``terngrad train``, both callbacks)
OUTER_LR = 0.7
OUTER_MOMENTUM = 0.9
#: ``local_steps="auto"``: the largest share of the time the outer exchange may take
MAX_COMM_SHARE = 0.1

#: ``local_steps="auto"`` decides ``H`` at this inner step, from the seconds between the
#: :meth:`DiLoCo.step` calls before it (the first step, with its warm-up, left out)
AUTO_PROBE_STEPS = 4
#: ``local_steps="auto"`` without ``auto_choices``: any ``H`` from 1 to this (DiLoCo's largest)
AUTO_MAX_LOCAL_STEPS = 500


def outer_sgd(
    anchor: list[torch.Tensor], outer_lr: float, outer_momentum: float,
    nesterov: bool | None = None,
) -> torch.optim.SGD:  # fmt: skip
    """DiLoCo's outer optimizer over the ``anchor``: SGD at ``outer_lr`` with
    ``outer_momentum``, Nesterov's (``nesterov=None``: wherever there is momentum; at
    ``outer_momentum=0`` plain SGD)."""
    nesterov = outer_momentum > 0 if nesterov is None else nesterov
    return torch.optim.SGD(anchor, lr=outer_lr, momentum=outer_momentum, nesterov=nesterov)


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


def check_outer_settings(
    local_steps: int | str = LOCAL_STEPS,
    outer_lr: float = OUTER_LR,
    outer_momentum: float = OUTER_MOMENTUM,
    nesterov: bool | None = None,
    overlap: bool = False,
    max_comm_share: float = MAX_COMM_SHARE,
    auto_choices: Sequence[int] | None = None,
) -> list[int]:
    """``ValueError`` with one line for the first of :class:`DiLoCo`'s own settings out of
    range (no collective: the framework callbacks check them when they are made); returns
    the values ``local_steps="auto"`` may take."""
    if local_steps != "auto" and (
        isinstance(local_steps, bool) or not isinstance(local_steps, int) or local_steps < 1
    ):
        raise ValueError(
            f"local_steps must be an integer of at least 1 (inner steps between outer "
            f"steps) or 'auto', got {local_steps!r}"
        )
    for name, value, rule in (("outer_lr", outer_lr, POSITIVE),
                              ("outer_momentum", outer_momentum, FRACTION)):  # fmt: skip
        if not rule.accepts(value):
            raise ValueError(f"{name} must be {rule.words}, got {value!r}")
    for name, value in (("nesterov", nesterov), ("overlap", overlap)):
        if not isinstance(value, bool) and not (name == "nesterov" and value is None):
            raise ValueError(f"{name} must be True or False, got {value!r}")
    if nesterov and outer_momentum == 0:
        raise ValueError("nesterov needs outer_momentum > 0 (DiLoCo's is 0.9)")
    if not (POSITIVE.accepts(max_comm_share) and max_comm_share < 1):
        raise ValueError(
            f"max_comm_share must be a share of the time in (0, 1), got {max_comm_share!r}"
        )
    return _auto_choices(auto_choices)


def local_steps_of(
    settings: dict[str, Any],
    local_steps: int | str | None,
    overlap: bool | None,
    unset: tuple[Any, Any] = (1, False),
) -> tuple[int | str | None, bool | None]:
    """``local_steps`` and ``overlap`` where ``settings["method"]`` names them
    (``method="terngrad-local16"``): the method's, and ``settings["method"]`` then the same
    method without them (the exchange of the pseudo-gradients). A value given (other than its
    ``unset`` one: the caller's default) that is not the method's is refused in one line naming
    both; with a method of one step, or none, the values given stand (keywords add local steps
    as without a method). The one rule of ``DiLoCo`` and both callbacks."""
    name = settings.get("method")
    m = None if name is None else methods.get(name)
    if m is None or m.local_steps == 1:
        return local_steps, overlap
    for key, given, own, none in (("local_steps", local_steps, m.local_steps, unset[0]),
                                  ("overlap", overlap, m.outer_overlap, unset[1])):  # fmt: skip
        if given not in (none, own):
            raise ValueError(
                f"{key}={given!r} is not what method {m.name} runs ({key}={own!r}): give the "
                "method alone, or a method of these local steps (docs/methods.md)"
            )
    settings["method"] = dataclasses.replace(m, local_steps=1, outer_overlap=False)
    return m.local_steps, m.outer_overlap


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


def _auto_choices(choices: Sequence[int] | None) -> list[int]:
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
