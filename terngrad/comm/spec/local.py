"""Local steps (DiLoCo, Douillard et al. 2023, Algorithm 1) as a part of a method: each replica
takes ``H`` inner steps on its own, then the ranks average what it moved (the pseudo-gradient
``Δ = anchor − replica``) through the method's exchange and an outer SGD steps the anchor:
``anchor ← anchor − outer_lr · Nesterov(outer_momentum)(Δ̄)``.

:class:`LocalSteps` is that part as one frozen, self-checking object: its defaults are written
here once (DiLoCo's paper's outer step), and every consumer (:class:`terngrad.diloco.DiLoCo`,
both framework callbacks, ``terngrad train`` and ``bench``) reads them from it. Its fields are
:func:`~terngrad.util.settings.setting` s, so ``terngrad train``'s flags are made from them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from terngrad.util.settings import (
    FRACTION,
    POSITIVE,
    POSITIVE_INT_OR_AUTO,
    SHARE,
    check_settings,
    setting,
)

#: ``H`` where neither a method nor ``local_steps=`` says it (``DiLoCo``)
LOCAL_STEPS = 16
#: DiLoCo's outer step (its paper's): SGD at this rate with Nesterov momentum 0.9
OUTER_LR = 0.7
OUTER_MOMENTUM = 0.9
#: ``local_steps="auto"``: the largest share of the time the outer exchange may take
MAX_COMM_SHARE = 0.1

_LOCAL = "local steps (DiLoCo)"


@dataclass(frozen=True)
class LocalSteps:
    """Local steps: ``every`` (``H``, the inner steps between two outer steps, or ``"auto"``:
    chosen at run time so that the exchange takes at most ``max_comm_share`` of the time),
    ``overlap`` (the outer exchange behind the next inner steps, its update one outer step
    late), ``across_nodes`` (each node of several ranks one replica, trained with DDP inside
    it, the outer exchange across nodes: :mod:`terngrad.comm.front.nodes`) and the outer SGD
    (``outer_lr``, ``outer_momentum``, ``nesterov``: Nesterov's wherever there is momentum
    unless ``False``; put in its one form where it is made, so ``nesterov`` is always a
    bool)."""

    every: int | str = setting(
        LOCAL_STEPS, "inner steps between outer steps: each rank trains its own replica H steps, "
        "then the ranks average what it moved through the exchange (DiLoCo); auto: H measured "
        "so that the exchange takes at most --max-comm-share of the time", _LOCAL,
        POSITIVE_INT_OR_AUTO, flag="--local-steps", metavar="H",
    )  # fmt: skip
    overlap: bool = setting(
        False, "with --local-steps: the outer exchange runs while the next H inner steps "
        "compute, its update applied one outer step late", _LOCAL, flag="--outer-overlap",
    )  # fmt: skip
    outer_lr: float = setting(OUTER_LR, "with --local-steps: the outer SGD's learning rate",
                              _LOCAL, POSITIVE)  # fmt: skip
    outer_momentum: float = setting(
        OUTER_MOMENTUM, "with --local-steps: the outer SGD's Nesterov momentum, [0, 1) (0: plain "
        "SGD, with --outer-lr 1 the replicas' average)", _LOCAL, FRACTION,
    )  # fmt: skip
    #: ``None`` where made: Nesterov's wherever there is momentum
    nesterov: bool | None = setting(
        None, "the outer momentum Nesterov's (else Polyak's heavy ball)", _LOCAL, flag="",
        optional=True,
    )  # fmt: skip
    max_comm_share: float = setting(
        MAX_COMM_SHARE, "with --local-steps auto: the largest share of the time the outer "
        "exchange may take", _LOCAL, SHARE,
    )  # fmt: skip
    across_nodes: bool = setting(
        False, "with --local-steps and --ranks-per-node: each node one replica, DDP inside it "
        "at every step, the outer exchange across nodes only", _LOCAL, flag="--across-nodes",
    )  # fmt: skip

    def __post_init__(self) -> None:
        if self.every != "auto" and (isinstance(self.every, bool) or not isinstance(self.every, int)
                                     or self.every < 1):  # fmt: skip
            raise ValueError(
                f"local_steps must be an integer of at least 1 (inner steps between outer "
                f"steps) or 'auto', got {self.every!r}"
            )
        check_settings(self)
        for name in ("overlap", "nesterov", "across_nodes"):
            value = getattr(self, name)
            if not isinstance(value, bool) and not (name == "nesterov" and value is None):
                raise ValueError(f"{name} must be True or False, got {value!r}")
        if self.nesterov and self.outer_momentum == 0:
            raise ValueError("nesterov needs outer_momentum > 0 (DiLoCo's is 0.9)")
        if self.nesterov is None:
            object.__setattr__(self, "nesterov", self.outer_momentum > 0)
        if self.every != "auto" and self.max_comm_share != MAX_COMM_SHARE:
            raise ValueError(
                f"max_comm_share is the share local_steps='auto' chooses H by; H is "
                f"{self.every} here: give local_steps='auto', or leave max_comm_share out"
            )

    @classmethod
    def of(cls, **keywords: Any) -> LocalSteps:
        """From the keywords ``DiLoCo`` and the callbacks take (``local_steps``: :attr:`every`);
        ``None`` for one left out."""
        fields = {KEYWORDS.get(k, k): v for k, v in keywords.items() if v is not None}
        return cls(**fields)

    def replace(self, **changes: Any) -> LocalSteps:
        """A copy with ``changes``, checked like a new one (``nesterov`` at its default, where
        it was and is not given, follows a new ``outer_momentum``)."""
        if "nesterov" not in changes and self.nesterov == (self.outer_momentum > 0):
            changes["nesterov"] = None
        return dataclasses.replace(self, **changes)

    def keywords(self) -> dict[str, Any]:
        """This object as the keywords ``DiLoCo`` takes (:meth:`of` reads them back)."""
        names = {v: k for k, v in KEYWORDS.items()}
        return {names.get(f.name, f.name): getattr(self, f.name)
                for f in dataclasses.fields(self)}  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


#: the keywords of ``DiLoCo`` and the callbacks that name a field otherwise
KEYWORDS = {"local_steps": "every"}
