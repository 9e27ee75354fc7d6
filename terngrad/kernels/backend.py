"""The operations the exchange runs on every step, behind one interface, and the checks every
backend shares.

Three backends implement :class:`Kernels`: :class:`~terngrad.kernels.reference.TorchKernels`
is the reference, step by step in torch (:mod:`terngrad.kernels.reference`);
:class:`~terngrad.kernels.fused_cpu.NumbaKernels` fuses each operation into one parallel pass on
CPU tensors (:mod:`terngrad.kernels.fused_cpu`), :class:`~terngrad.kernels.fused_gpu.TritonKernels`
on CUDA tensors (:mod:`terngrad.kernels.fused_gpu`). Given the same scales and draws they give the
same bytes (tested); their float64 statistics can round to scales one float32 ulp apart in rare
buckets (one-pass shifted sums in the fused backends, torch's ``std`` in the reference).

An exchange of a shared-grid quantizer (TernGrad, QSGD) calls, per bucket:

1. :meth:`Kernels.grid_prepare` — clip bounds and local scales (one pass, fused);
2. :meth:`Kernels.grid_pack` — clip, round and pack a range of the gradient into a payload;
3. :meth:`Kernels.sum_packed` — the shard owner's sum of N payloads, packed again;
4. :meth:`Kernels.decode_into` — ``s (d - offset) / divisor`` into the output buffer.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import torch

from terngrad.quantize import Layout, Moments, SymmetricGrid
from terngrad.quantize.random import Streams
from terngrad.wire import Codec

Draws = Streams | torch.Tensor


@dataclass
class GridInput:
    """A gradient prepared for the grid: the quantizer, the flat values and layout, the clip
    bound per bucket (``None``: no clipping) and this rank's local scale per bucket."""

    quantizer: SymmetricGrid
    flat: torch.Tensor
    layout: Layout
    bound: torch.Tensor | None
    local: torch.Tensor
    #: the reference backend's prepared values and digits, computed once per step
    cache: dict[str, Any] = field(default_factory=dict)


def _moments(count, shifted_sum, shifted_sumsq, sumsq, maxabs, shift) -> Moments:
    """:class:`Moments` from one-pass float64 sums per bucket, those of ``x - K`` shifted by
    the bucket's first element ``K`` (shifting keeps the variance accurate when the mean is
    large against the spread)."""
    mean = shifted_sum / count
    return Moments(
        count=count,
        mean=mean + shift,
        var=(shifted_sumsq - shifted_sum * mean).clamp(min=0) / count,
        sumsq=sumsq,
        maxabs=maxabs,
    )


def _check_payload(payload: torch.Tensor, codec: Codec, numel: int) -> None:
    """The kernels read exactly ``codec.nbytes(numel)`` bytes: refuse any other length."""
    if payload.dtype != torch.uint8 or payload.numel() != codec.nbytes(numel):
        raise ValueError(
            f"{codec} payload of {payload.numel()} bytes ({payload.dtype}) for {numel} digits; "
            f"expected {codec.nbytes(numel)} uint8 bytes (truncated data or a wrong count)"
        )


def _check_range(lo: int, count: int, layout: Layout, scales: torch.Tensor) -> None:
    """The kernels index ``[lo, lo + count)`` of ``layout`` and one scale per bucket."""
    if not 0 <= lo <= lo + count <= layout.numel:
        raise ValueError(f"elements [{lo}, {lo + count}) outside a layout of {layout.numel}")
    if scales.numel() != layout.n_buckets:
        raise ValueError(f"{scales.numel()} scales for {layout.n_buckets} buckets")


def _check_draws(draws: Draws, layout: Layout) -> None:
    if isinstance(draws, Streams):
        if len(draws.keys) != len(layout.segments):
            raise ValueError(
                f"{len(draws.keys)} random streams for {len(layout.segments)} segments"
            )
    elif draws.numel() != layout.numel:
        raise ValueError(f"{draws.numel()} uniform draws for {layout.numel} elements")


class Kernels(ABC):
    """The exchange's per-step operations on CPU tensors (the ``name`` goes in the config)."""

    name: str

    @abstractmethod
    def grid_prepare(self, q: SymmetricGrid, flat: torch.Tensor, layout: Layout) -> GridInput:
        """Clip bounds and local scales of ``flat`` (float32, finite or not: a NaN or Inf makes
        its bucket's scale non-finite)."""

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
        """Pack the digits ``j + m`` of ``flat[lo:hi]`` on the grid of the ``shared`` scales,
        rounded with ``draws`` (one stream per segment, or one uniform per element), into the
        uint8 tensor ``out`` of ``codec.nbytes(hi - lo)`` bytes."""

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
    ) -> None:
        """``out[j] = float32(d_j - offset) * s / divisor`` (float32, in that order; in a
        bucket whose ``s`` exceeds ``overflow_limit(offset)``, ``float32(d_j - offset) *
        (s / divisor)``: see ``quantize.grid.grid_decode``), ``d_j`` the payload's digits and
        ``s`` the scale of the bucket holding flat element ``lo + j``; ``ValueError`` if the
        payload is corrupt."""

    @abstractmethod
    def uniform(
        self, streams: Streams, layout: Layout, device: torch.device | str = "cpu"
    ) -> torch.Tensor:
        """Every draw of ``streams`` over ``layout`` (float32, on ``device``), for the
        quantizers rounded by the torch code."""
