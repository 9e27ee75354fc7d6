"""The operations the exchange runs on every step, behind one interface with two backends.

:class:`TorchKernels` is the reference: the quantizer layer's pure-torch code and the wire
layer's packers, step by step. :class:`NumbaKernels` fuses each operation into one parallel pass
(:mod:`terngrad.kernels.cpu`). Both give the same bytes for the same input; the tests check it.

An exchange of a shared-grid quantizer (TernGrad, QSGD) calls, per bucket:

1. :meth:`Kernels.grid_prepare` — clip bounds and local scales (one pass, fused);
2. :meth:`Kernels.grid_pack` — clip, round and pack a range of the gradient into a payload;
3. :meth:`Kernels.sum_packed` — the shard owner's sum of N payloads, packed again;
4. :meth:`Kernels.decode_into` — ``s (d - offset) / divisor`` into the output buffer.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from terngrad.kernels.random import Streams
from terngrad.quantize import Layout, Moments, SymmetricGrid
from terngrad.wire import Codec, word_layout

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
        """``out[j] = float32(d_j - offset) * s / divisor`` (float32, in that order), ``d_j``
        the payload's digits and ``s`` the scale of the bucket holding flat element ``lo + j``;
        ``ValueError`` if the payload is corrupt."""

    @abstractmethod
    def uniform(self, streams: Streams, layout: Layout) -> torch.Tensor:
        """Every draw of ``streams`` over ``layout`` (float32), for the torch quantizers."""


class TorchKernels(Kernels):
    """The reference: the quantizer and wire layers' torch code, unfused."""

    name = "torch"

    def grid_prepare(self, q, flat, layout):
        y, local = q.prepare(flat, layout)
        return GridInput(q, flat, layout, None, local, {"y": y})

    def grid_pack(self, grid, shared, draws, lo, hi, codec, out):
        _check_draws(draws, grid.layout)
        cached = grid.cache.get("digits")  # every range of one step rounds the same digits
        if cached is None or cached[0] is not shared or cached[1] is not draws:
            uniform = draws.uniform(grid.layout.segments) if isinstance(draws, Streams) else draws
            y = grid.cache["y"]
            digits = grid.quantizer.round_to_grid(y, grid.layout, shared, uniform.reshape(-1))
            cached = grid.cache["digits"] = (shared, draws, digits)
        out.copy_(codec.pack(cached[2][lo:hi]))

    def sum_packed(self, payloads, numel, codec, out_codec, out):
        total = sum(codec.unpack(p, numel).to(torch.int64) for p in payloads)
        out.copy_(out_codec.pack(total))

    def decode_into(self, out, payload, codec, offset, divisor, lo, layout, scales):
        digits = codec.unpack(payload, out.numel()).to(torch.int64) - offset
        s_el = layout.expand(scales)[lo : lo + out.numel()]
        out.copy_(digits.to(torch.float32) * s_el / divisor)

    def uniform(self, streams, layout):
        return streams.uniform(layout.segments)


# --------------------------------------------------------------------------- numba

_TARGET_CHUNK = 32768  # elements per parallel task: a few hundred KB of scratch, in L2


def _codec_args(codec: Codec) -> tuple[int, int, int, int]:
    """``(kind, param, k, w)`` for the kernels: kind 0 base-B (k digits per w-byte word),
    1 n-bit stream."""
    from terngrad.kernels import cpu

    if codec.kind == "base":
        k, w = word_layout(codec.param)
        return cpu.BASE, codec.param, k, w
    if codec.kind == "nbit":
        return cpu.NBIT, codec.param, 0, 0
    raise ValueError(f"the fused kernels pack digits, not {codec} floats")


def _chunk(*codecs: Codec) -> int:
    """Elements per task: a multiple of every codec's word (8 digits for bit streams)."""
    unit = 1
    for codec in codecs:
        unit = math.lcm(unit, word_layout(codec.param)[0] if codec.kind == "base" else 8)
    return unit * max(1, _TARGET_CHUNK // unit)


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().contiguous().numpy()


class NumbaKernels(Kernels):
    """Fused CPU kernels (numba), parallel over chunks with as many threads as torch uses."""

    name = "numba"

    def __init__(self) -> None:
        import numba  # noqa: F401  (ImportError here when numba is missing)

        from terngrad.kernels import cpu

        self._cpu = cpu

    @staticmethod
    def _threads() -> None:
        import numba

        numba.set_num_threads(max(1, min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS)))

    def grid_prepare(self, q, flat, layout):
        self._threads()
        x = _np(flat)
        starts = _np(layout.bucket_starts)
        raw = torch.from_numpy(self._cpu.bucket_moments(x, x.view(np.int32), starts, 1 << 16))
        count = raw[:, 0]
        mean = raw[:, 1] / count  # of x - K, K the bucket's first element
        moments = Moments(
            count=count,
            mean=mean + torch.from_numpy(x[starts[:-1]]).double(),
            var=(raw[:, 2] - raw[:, 1] * mean).clamp(min=0) / count,
            sumsq=raw[:, 3],
            maxabs=raw[:, 4],
        )
        bound = q.clip_bound(moments)
        return GridInput(q, flat, layout, bound, q.scale_from_moments(moments, bound))

    def grid_pack(self, grid, shared, draws, lo, hi, codec, out):
        _check_draws(draws, grid.layout)
        self._threads()
        layout = grid.layout
        bound = np.full(layout.n_buckets, np.inf, np.float32)
        if grid.bound is not None:  # a bucket whose bound is 0 (sigma = 0) is not clipped
            bound = np.where(_np(grid.bound) > 0, _np(grid.bound), bound)
        if isinstance(draws, Streams):
            keys, uniform = draws.key_array(), np.empty(0, np.float32)
        else:
            keys, uniform = np.zeros(len(layout.segments), np.uint64), _np(draws.reshape(-1))
        self._cpu.grid_pack(
            _np(grid.flat), lo, hi, _np(layout.bucket_starts), bound, _np(shared),
            grid.quantizer.m, _np(layout.segment_starts), keys, uniform,
            *_codec_args(codec), _chunk(codec), out.numpy(),
        )  # fmt: skip

    def sum_packed(self, payloads, numel, codec, out_codec, out):
        self._threads()
        rows = np.stack([_np(p) for p in payloads]) if payloads else np.empty((0, 0), np.uint8)
        ok = self._cpu.sum_packed(
            rows, numel, *_codec_args(codec), *_codec_args(out_codec), _chunk(codec, out_codec),
            out.numpy(),
        )  # fmt: skip
        if not ok:
            raise ValueError(f"{codec} payload holds an invalid word or padding (corrupted data)")

    def decode_into(self, out, payload, codec, offset, divisor, lo, layout, scales):
        self._threads()
        ok = self._cpu.decode_packed(
            _np(payload), out.numel(), *_codec_args(codec), offset, np.float32(divisor), lo,
            _np(layout.bucket_starts), _np(scales.to(torch.float32)), _chunk(codec), out.numpy(),
        )  # fmt: skip
        if not ok:
            raise ValueError(f"{codec} payload holds an invalid word or padding (corrupted data)")

    def uniform(self, streams, layout):
        self._threads()
        out = np.empty(layout.numel, np.float32)
        self._cpu.uniform_into(_np(layout.segment_starts), streams.key_array(), _TARGET_CHUNK, out)
        return torch.from_numpy(out)
