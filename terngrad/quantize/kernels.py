"""The operations behind ``encode``/``decode`` and the exchange's per-step work, behind one
interface (:class:`Kernels`), the registry of its backends, and :func:`resolve`, the one place
that decides which backend runs.

The quantizer layer defines the interface and its reference, :class:`~terngrad.quantize.
reference.TorchKernels` (the quantizers' own torch code and the wire layer's packers, step by
step); the fused backends live a layer up (:mod:`terngrad.kernels`: numba on CPU tensors,
Triton on CUDA tensors) and register here when that package is imported (``import terngrad``
does), so nothing in this layer imports upward. Given the same scales and draws every backend
gives the reference's bytes (tested). What a backend asks of each family is a protocol here
(:class:`GridMethod`, :class:`LevelMethod`; the families' modules import this one), with the
one-pass :class:`Moments` a fused backend hands a grid quantizer.

A shared-grid quantizer (TernGrad, QSGD) runs, per bucket:

1. :meth:`Kernels.grid_prepare` — clip bounds and local scales (one pass, fused);
2. :meth:`Kernels.grid_pack` — clip, round and pack a range of the gradient into a payload;
3. :meth:`Kernels.sum_packed` — the shard owner's sum of N payloads, packed again (exchange);
4. :meth:`Kernels.decode_into` — ``s (d - offset) / divisor`` into the output buffer.

A level quantizer (Linear, ORQ, BinGrad-b/pb, scaled sign) runs :meth:`Kernels.level_fit`,
:meth:`Kernels.level_pack` and :meth:`Kernels.level_decode`.
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import torch

from terngrad.quantize.layout import Layout
from terngrad.quantize.random import Streams
from terngrad.wire import Codec

#: the ``kernels=`` choices: "auto" picks a fused backend where one can run, else "torch"
KERNELS = ("auto", "numba", "triton", "torch")

#: the random draws of stochastic rounding: one counter-based stream per segment, or one
#: uniform in [0, 1) per element
Draws = Streams | torch.Tensor

_BACKENDS: dict[str, type[Kernels]] = {}


@dataclass(frozen=True)
class Moments:
    """One-pass statistics of each bucket (float64, one value per bucket), from which a fused
    kernel derives the clip bound and the scale without a second pass over the gradient."""

    count: torch.Tensor
    mean: torch.Tensor
    var: torch.Tensor  # population variance
    sumsq: torch.Tensor
    maxabs: torch.Tensor  # NaN if the bucket holds a NaN


class GridMethod(Protocol):
    """What a backend asks of a shared-grid quantizer (a :class:`~terngrad.quantize.grid.
    SymmetricGrid`, whose module imports this one): the reference's two steps, and the clip
    bound and scale from one-pass :class:`Moments`."""

    m: int

    def prepare(self, flat: torch.Tensor, layout: Layout) -> tuple[torch.Tensor, torch.Tensor]: ...

    def round_to_grid(
        self, y: torch.Tensor, layout: Layout, scale: torch.Tensor, uniform: torch.Tensor
    ) -> torch.Tensor: ...

    def clip_bound(self, moments: Moments) -> torch.Tensor | None: ...

    def scale_from_moments(self, moments: Moments, bound: torch.Tensor | None) -> torch.Tensor: ...


class LevelMethod(Protocol):
    """What a backend asks of a level quantizer (a :class:`~terngrad.quantize.levels.
    LevelQuantizer`, whose module imports this one): its name, levels, codec and rounding, and
    the reference's fit, rounding and look-up."""

    @property
    def name(self) -> str: ...

    @property
    def levels(self) -> int: ...

    @property
    def codec(self) -> Codec: ...

    @property
    def stochastic(self) -> bool: ...

    def _scales_per_bucket(self, levels: int) -> int: ...

    def _fit(self, rows: torch.Tensor) -> torch.Tensor: ...

    def round_levels(
        self, y: torch.Tensor, layout: Layout, levels: torch.Tensor, uniform: torch.Tensor | None
    ) -> torch.Tensor: ...

    @staticmethod
    def gather_levels(
        levels: torch.Tensor, digits: torch.Tensor, layout: Layout
    ) -> torch.Tensor: ...


@dataclass
class GridInput:
    """A gradient prepared for the grid: the quantizer, the flat values and layout, the clip
    bound per bucket (``None``: no clipping) and this rank's local scale per bucket."""

    quantizer: GridMethod
    flat: torch.Tensor
    layout: Layout
    bound: torch.Tensor | None
    local: torch.Tensor
    #: the reference backend's prepared values and digits, computed once per step
    cache: dict[str, Any] = field(default_factory=dict)


def check_draws(draws: Draws, layout: Layout) -> None:
    """``ValueError`` unless ``draws`` cover ``layout``: one stream per segment, or one
    uniform per element."""
    if isinstance(draws, Streams):
        if len(draws.keys) != len(layout.segments):
            raise ValueError(
                f"{len(draws.keys)} random streams for {len(layout.segments)} segments"
            )
    elif draws.numel() != layout.numel:
        raise ValueError(f"{draws.numel()} uniform draws for {layout.numel} elements")


class Kernels(ABC):
    """The per-step operations of the quantizers, on the tensors of one kind of device.

    A backend registers by subclassing with its name (the ``kernels=`` string, recorded in the
    exchange's configuration) and the device types ``"auto"`` picks it for:
    ``class NumbaKernels(Kernels, name="numba", devices=("cpu",))``.
    """

    name: ClassVar[str]
    #: the device types ``kernels="auto"`` picks this backend for (where it can run)
    devices: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(
        cls, *, name: str | None = None, devices: tuple[str, ...] = (), **kw: Any
    ) -> None:
        super().__init_subclass__(**kw)
        if name is None:
            return  # not a backend of its own (a helper base, or a test's subclass)
        if name in _BACKENDS:
            raise RuntimeError(f"kernels {name!r} registered twice")
        cls.name, cls.devices = name, tuple(devices)
        _BACKENDS[name] = cls

    @classmethod
    def unavailable(cls, device: torch.device) -> str | None:
        """Why this backend cannot run on tensors on ``device`` here (one line, what
        :func:`resolve` raises), or ``None`` if it can."""
        return None

    @classmethod
    def for_device(cls, device: torch.device) -> Kernels:
        """A backend for tensors on ``device`` (:func:`resolve` keeps one per device)."""
        return cls()

    # ------------------------------------------------------------------ the shared grid

    @abstractmethod
    def grid_prepare(self, q: GridMethod, flat: torch.Tensor, layout: Layout) -> GridInput:
        """Clip bounds ``c σ`` and local scales of ``flat`` per bucket (float32, finite or not:
        a NaN or Inf makes its bucket's scale non-finite): ``q.prepare``, or one pass of
        float64 moments and ``q.clip_bound``/``q.scale_from_moments``."""

    @abstractmethod
    def grid_pack(
        self,
        grid: GridInput,
        shared: torch.Tensor,
        draws: Draws,
        lo: int,
        hi: int,
        codec: Codec,
        out: torch.Tensor,
    ) -> None:
        """Pack the digits ``j + m`` of ``flat[lo:hi]`` on the grid of the ``shared`` scales
        into the uint8 tensor ``out`` of ``codec.nbytes(hi - lo)`` bytes: ``y`` clipped,
        ``t = m |y| / s`` (saturating at ``m``), ``j = sign(y) (floor(t) + [u < t - floor(t)])``
        with ``u`` from ``draws`` (one stream per segment, or one uniform per element)."""

    @abstractmethod
    def sum_packed(
        self, payloads: list[torch.Tensor], numel: int, codec: Codec, out_codec: Codec,
        out: torch.Tensor,
    ) -> None:  # fmt: skip
        """Pack the element-wise sum of the digits of ``payloads`` into ``out``;
        ``ValueError`` if a payload is corrupt."""

    @abstractmethod
    def decode_into(
        self,
        out: torch.Tensor,
        payload: torch.Tensor,
        codec: Codec,
        offset: int,
        divisor: int,
        lo: int,
        layout: Layout,
        scales: torch.Tensor,
        accumulate: bool = False,
    ) -> None:
        """``out[j] = float32(d_j - offset) * s / divisor`` (float32, in that order; in a
        bucket whose ``s`` exceeds ``overflow_limit(offset)``, ``float32(d_j - offset) *
        (s / divisor)``: see ``quantize.grid.grid_decode``), ``d_j`` the payload's digits and
        ``s`` the scale of the bucket holding flat element ``lo + j``; ``ValueError`` if the
        payload is corrupt. With ``accumulate``, ``out[j] +=`` that value (float32): the bits
        of decoding into a buffer and adding it, in one pass over ``out``."""

    @abstractmethod
    def uniform(
        self, streams: Streams, layout: Layout, device: torch.device | str = "cpu"
    ) -> torch.Tensor:
        """Every draw of ``streams`` over ``layout`` (float32, on ``device``), for the
        quantizers rounded by the torch code."""

    # ------------------------------------------------------------------ per-bucket levels

    @abstractmethod
    def level_fit(self, q: LevelMethod, flat: torch.Tensor, layout: Layout) -> torch.Tensor | None:
        """The float32 scales ``(n_buckets, k)`` that ``q`` fits to each bucket of the
        prepared (clipped) ``flat``, ``k = q._scales_per_bucket(q.levels)``: ``q._fit(rows)``
        per bucket (Linear ``(min, max)``; ORQ its ``L`` levels; BinGrad the 2-means or the
        partially biased pair; scaled sign ``mean |g|``), float64 sums left to right; ``None``
        if ``flat`` holds a NaN or an Inf."""

    @abstractmethod
    def level_pack(
        self,
        q: LevelMethod,
        flat: torch.Tensor,
        layout: Layout,
        levels: torch.Tensor,
        draws: Draws | None,
    ) -> torch.Tensor:
        """The uint8 payload (``q.codec``, on ``flat``'s device) of the digits of ``flat`` on
        each bucket's sorted ``levels`` (float32 rows ``b_1 <= ... <= b_L``): ``y`` clamped to
        ``[b_1, b_L]``; stochastic rounding: ``i + [u < (y - b_i) / (b_{i+1} - b_i)]`` (in
        float64) in its cell ``[b_i, b_{i+1}]``, ``u`` from ``draws``; nearest rounding: the
        number of midpoints ``(b_i + b_{i+1}) / 2`` (float32) at or below ``y``."""

    @abstractmethod
    def level_decode(
        self,
        q: LevelMethod,
        payload: torch.Tensor,
        codec: Codec,
        layout: Layout,
        levels: torch.Tensor,
        out: torch.Tensor,
    ) -> None:
        """``out[j] = levels[b, d_j]`` (float32), ``d_j`` the payload's digits and ``b`` the
        bucket of element ``j``; ``ValueError`` if the payload is corrupt (an invalid word or
        padding, or a digit beyond the ``L`` levels)."""


@functools.cache
def _instance(cls: type[Kernels], device: torch.device) -> Kernels:
    """One backend per class and device, made at first use."""
    return cls.for_device(device)


def resolve(kernels: str | Kernels | None = "auto", device: torch.device | str = "cpu") -> Kernels:
    """The backend that runs for tensors on ``device``: a :class:`Kernels` instance as given;
    ``"auto"`` (or ``None``) the first fused backend registered for the device type that can
    run here (numba for CPU tensors, Triton for CUDA tensors), else the reference;
    ``"torch"`` the reference; ``"numba"``/``"triton"`` that backend or a ``ValueError``
    saying why it cannot run (also for an unknown name). Backends are made once per device."""
    if isinstance(kernels, Kernels):
        return kernels
    name = "auto" if kernels is None else kernels
    if not isinstance(name, str) or name not in KERNELS:
        raise ValueError(f"kernels must be one of {', '.join(map(repr, KERNELS))}, got {kernels!r}")
    where = torch.device(device)
    if name == "auto":
        for cls in _BACKENDS.values():
            if where.type in cls.devices and cls.unavailable(where) is None:
                return _instance(cls, where)
        name = "torch"
    cls = _BACKENDS.get(name)
    if cls is None:  # registered by terngrad.kernels, which `import terngrad` imports
        raise ValueError(f"kernels={name!r} is not registered: import terngrad.kernels first")
    reason = cls.unavailable(where)
    if reason is not None:
        raise ValueError(reason)
    return _instance(cls, where)
