"""The exchange algorithms: the mean of a flat gradient over all ranks, through quantized bytes.

Every rank calls :meth:`Exchange.reduce` with its own gradient and the same layout; every rank
gets the same result, bit for bit. How the messages are combined depends on the quantizer:

* **Shared grid** (``terngrad``, ``qsgd``): scalar sharing first — one all-reduce (MAX) of the
  per-bucket scales — so every rank rounds onto the same grid ``s * j / m``. Codes are integers
  in ``[-m, m]``; the sum over N ranks is an integer in ``[-N m, N m]``, exact, and travels in
  base ``2 N m + 1``; the mean is ``s * sum / (N m)`` (TernGrad: ``s * sum / N``). Nothing is
  re-quantized, so the second phase adds no error.
* **Messages** (every other method): each rank's message is decoded to floats and averaged in
  rank order. Where the average must travel on (``sharded``, ``ps``), it is re-quantized with
  the same quantizer plus server-side error feedback (``aggregate="requantize"``: the second
  broadcast option of the optimal-quantization paper's Algorithm 2), or sent as fp16
  (``aggregate="fp16"``); the rank that did this uses the decoded message itself, like every
  other rank, so replicas stay bitwise identical.
* **Coherent levels** (``aggregate="coherent"``, the per-bucket level quantizers: Algorithm 2's
  first option, :mod:`terngrad.comm.exchanges.coherent`): the ranks agree on one set of levels per
  bucket, send digits only, and the average is rounded onto the same levels.

The topologies — ``sharded``, ``ps``, ``allgather`` and ``own-scales`` — are
:mod:`terngrad.comm.exchanges.topologies`; this module is their interface and what they share.

Which settings a topology combines with is said by its class: the quantizers it takes
(:attr:`Exchange.quantizers`), the aggregates and policies it serves; an aggregate or a policy
that needs a kind of quantizer says which (:data:`AGGREGATES`); :meth:`Exchange.check` reads
them, once, where the options are made.

The per-step work — on the grid path statistics, clip, rounding, packing, the owner's sum,
decoding into the output; elsewhere every message's ``encode`` and ``decode`` and the levels'
fit — runs on the exchange's :class:`~terngrad.kernels.Kernels` backend (fused numba or Triton
kernels, or the torch reference), passed to each; all give the same bytes.

A rank whose gradient holds a NaN or Inf is detected by every rank at the first collective
(the shared MAX of the scales propagates it; the message path all-reduces a flag; with its
own scales a flag byte travels after each message); then nothing is averaged and every rank gets
``Result(None, None)``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.distributed as dist

from terngrad import quantize
from terngrad.comm.errors import ExchangeMismatch
from terngrad.comm.exchanges.link import Link
from terngrad.kernels import Kernels, Streams, resolve
from terngrad.quantize import Encoded, Layout, LevelQuantizer, Quantizer, SymmetricGrid

Draws = Streams | torch.Tensor | None

#: how an aggregate off the shared grid travels on, and the quantizers each serves:
#: ``requantize`` and ``fp16`` any; ``coherent`` (levels agreed by all ranks, Algorithm 2's
#: first option) the per-bucket level quantizers
AGGREGATES: dict[str, type[Quantizer]] = {
    "requantize": Quantizer,
    "fp16": Quantizer,
    "coherent": LevelQuantizer,
}


@dataclass(frozen=True)
class ExchangeSettings:
    """What an exchange does beyond its topology and quantizer, in one object (the fields of
    the same names of :class:`~terngrad.comm.Options` make it: ``Options.exchange_settings``):
    ``aggregate``, how an aggregate off the shared grid travels on (:data:`AGGREGATES`);
    ``fit_scale``, ternary digits decoded to their least-squares value, not the scale (for
    error feedback, :func:`terngrad.quantize.check_fit_scale`)."""

    aggregate: str = "requantize"
    fit_scale: bool = False


#: an exchange's settings where none are given
PLAIN = ExchangeSettings()


@dataclass(frozen=True)
class Result:
    """``mean``: the averaged gradient (``None`` if some rank's gradient was not finite);
    ``own``: what this rank's own message decodes to (for worker-side error feedback)."""

    mean: torch.Tensor | None
    own: torch.Tensor | None


def shard_bounds(numel: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous shards of ``numel`` elements, sizes differing by at most one."""
    base, extra = divmod(numel, parts)
    bounds, start = [], 0
    for k in range(parts):
        stop = start + base + (k < extra)
        bounds.append((start, stop))
        start = stop
    return bounds


# --------------------------------------------------------------------------- exchanges


class Exchange(ABC):
    """Averages flat gradients over the ranks of ``link``; subclasses are the topologies, each
    registered by ``name`` and saying what it combines with: :attr:`quantizers` (the kinds of
    quantizer it can average), :attr:`policies` (``auto`` predicts exchanges with scalar
    sharing)."""

    name: ClassVar[str]
    registry: ClassVar[dict[str, type[Exchange]]] = {}
    quantizers: ClassVar[tuple[type[Quantizer], ...]] = (Quantizer,)
    policies: ClassVar[tuple[str, ...]] = ("quantize", "auto")

    def __init_subclass__(cls, *, name: str | None = None, **kw) -> None:
        super().__init_subclass__(**kw)
        if name:
            cls.name = name
            Exchange.registry[name] = cls

    @classmethod
    def check(cls, quantizer: Quantizer, aggregate: str, policy: str) -> None:
        """``ValueError`` with one line unless this topology averages ``quantizer`` with that
        ``aggregate`` and ``policy`` (``policy`` itself is checked against its quantizer kind
        by the options)."""
        if not isinstance(quantizer, cls.quantizers):
            raise ValueError(
                f"topology {cls.name!r} averages {_kinds(cls.quantizers)}; {quantizer.name} is "
                f"not one: choose another topology or quantizer"
            )
        if aggregate not in AGGREGATES:
            raise ValueError(
                f"unknown aggregate {aggregate!r}; choose one of: {', '.join(AGGREGATES)}"
            )
        needs = AGGREGATES[aggregate]
        if not isinstance(quantizer, needs):
            raise ValueError(
                f"aggregate {aggregate!r} serves {_kinds((needs,))}; {quantizer.name} is not "
                "one: use aggregate 'requantize'"
            )
        if policy not in cls.policies:
            raise ValueError(
                f"policy {policy!r} does not model topology {cls.name!r}: use policy "
                f"{cls.policies[0]!r}"
            )

    def __init__(
        self,
        quantizer: Quantizer,
        link: Link,
        settings: ExchangeSettings = PLAIN,
        kernels: Kernels | None = None,
    ) -> None:
        aggregate = settings.aggregate
        self.check(quantizer, aggregate, "quantize")
        if settings.fit_scale:
            check_fit_scale(quantizer)
        self.settings = settings
        #: digits decode to their least-squares value, not the scale (for error feedback)
        self.fit_scale = settings.fit_scale
        self.quantizer = quantizer
        self.link = link
        self.kernels = kernels if kernels is not None else resolve("torch")
        #: Algorithm 2's first option: levels coherent among the ranks (level quantizers)
        self.coherent = aggregate == "coherent"
        self.aggregator = quantize.get("fp16") if aggregate == "fp16" else quantizer
        #: server-side error feedback of re-quantized aggregates, by (bucket key, shard)
        self.server_residuals: dict[Hashable, torch.Tensor] = {}

    @abstractmethod
    def reduce(
        self,
        flat: torch.Tensor,
        layout: Layout,
        draws: Draws,
        generator: torch.Generator | None,
        key: Hashable = None,
        *,
        out: torch.Tensor | None = None,
        own: bool = True,
    ) -> Result:
        """The mean over all ranks of ``flat`` (float32, 1-D, in ``layout``), identical on every
        rank, written into ``out`` if given (float32, may be ``flat`` itself: it is read before
        it is written). ``draws`` are this rank's random draws for rounding ``flat``: a
        :class:`~terngrad.kernels.Streams` (one stream per segment), one uniform per element,
        or ``None`` (drawn from ``generator``); ``generator`` also draws any re-quantization
        of an aggregate; ``key`` names the bucket for server-side error feedback; ``own=False``
        skips decoding this rank's own message (needed only for worker-side error feedback)."""

    # --- helpers shared by the topologies

    def _all_finite(self, flat: torch.Tensor) -> bool:
        """True if every rank's gradient is finite (one all-reduce of a flag)."""
        flag = torch.tensor([0.0 if bool(torch.isfinite(flat).all()) else 1.0], device=flat.device)
        return float(self.link.all_reduce(flag, dist.ReduceOp.MAX)) == 0.0

    def _mean(self, values: list[torch.Tensor]) -> torch.Tensor:
        """Sum in rank order, then divide: the same bits wherever it is computed."""
        total = values[0].clone()
        for v in values[1:]:
            total += v
        return total / self.link.size

    def _encode(self, q: Quantizer, flat: torch.Tensor, generator, segments, uniform=None):
        """``q``'s message of ``flat`` on this exchange's kernels; ``uniform`` are draws this
        exchange generated, so their values are not scanned every step (``encode`` would)."""
        return q._encode_message(flat, generator, None, segments, uniform, self.kernels, False)

    def _decode(self, q: Quantizer, message: Encoded) -> torch.Tensor:
        """The flat values of ``q``'s ``message``, on this exchange's kernels."""
        return q.decode(message, kernels=self.kernels).reshape(-1)

    def _parse_message(self, frame: torch.Tensor, q: Quantizer, numel: int, sender: int):
        """The message in ``frame`` from ``sender``; :class:`ExchangeMismatch` unless it is
        ``q``'s of ``numel`` elements."""
        enc = Encoded.from_frame(frame)
        if enc.method != q.name or enc.numel != numel:
            raise ExchangeMismatch(
                f"rank {sender} sent a {enc.method} message of {enc.numel} elements; this rank "
                f"expected {q.name} with {numel}: the ranks disagree on the model, the bucket "
                "layout or the quantizer"
            )
        return enc

    def _read_message(self, frame: torch.Tensor, q: Quantizer, numel: int, sender: int):
        return self._decode(q, self._parse_message(frame, q, numel, sender))


def check_fit_scale(quantizer: Quantizer) -> None:
    """``ValueError`` with one line unless ``quantizer`` rounds onto a ternary grid, the one
    ``fit_scale`` fits (:func:`terngrad.comm.exchanges.grid_step.least_squares_values`)."""
    if not (isinstance(quantizer, SymmetricGrid) and quantizer.m == 1):
        what = quantizer.name
        if isinstance(quantizer, SymmetricGrid):
            what += f" with {quantizer.levels} levels"
        raise ValueError(
            f"fit_scale fits ternary digits (terngrad, qsgd with 3 levels); {what} is not: "
            "leave fit_scale off"
        )


def _kinds(kinds: tuple[type[Quantizer], ...]) -> str:
    """``"the shared-grid quantizers (terngrad, qsgd)"``: the registered quantizers of ``kinds``."""
    if kinds == (Quantizer,):
        return "every quantizer"
    names = [n for n in quantize.names() if isinstance(quantize.get(n), kinds)]
    words = {SymmetricGrid: "the shared-grid quantizers", LevelQuantizer: "the level quantizers"}
    return f"{' and '.join(words.get(k, k.__name__) for k in kinds)} ({', '.join(names)})"
