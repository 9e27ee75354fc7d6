"""The operations the exchange runs on every step, behind one interface with two backends.

:class:`TorchKernels` is the reference: the quantizer layer's pure-torch code and the wire
layer's packers, step by step. :class:`NumbaKernels` fuses each operation into one parallel pass
(:mod:`terngrad.kernels.cpu`), :class:`TritonKernels` for CUDA (:mod:`terngrad.kernels.gpu`).
Given the same scales and draws they give the same bytes (tested); their float64 statistics
can round to scales one float32 ulp apart in rare buckets (one-pass shifted sums here, torch's
``std`` in the reference).

An exchange of a shared-grid quantizer (TernGrad, QSGD) calls, per bucket:

1. :meth:`Kernels.grid_prepare` — clip bounds and local scales (one pass, fused);
2. :meth:`Kernels.grid_pack` — clip, round and pack a range of the gradient into a payload;
3. :meth:`Kernels.sum_packed` — the shard owner's sum of N payloads, packed again;
4. :meth:`Kernels.decode_into` — ``s (d - offset) / divisor`` into the output buffer.
"""

from __future__ import annotations

import math
import os
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from terngrad.kernels.random import Streams
from terngrad.quantize import Layout, Moments, SymmetricGrid
from terngrad.wire import BLOCK_WORDS, Codec, word_layout

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
        """``out[j] = float32(d_j - offset) * s / divisor`` (float32, in that order), ``d_j``
        the payload's digits and ``s`` the scale of the bucket holding flat element ``lo + j``;
        ``ValueError`` if the payload is corrupt."""

    @abstractmethod
    def uniform(
        self, streams: Streams, layout: Layout, device: torch.device | str = "cpu"
    ) -> torch.Tensor:
        """Every draw of ``streams`` over ``layout`` (float32, on ``device``), for the
        quantizers rounded by the torch code."""


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

    def uniform(self, streams, layout, device="cpu"):
        return streams.uniform(layout.segments).to(device)


# --------------------------------------------------------------------------- numba

_TARGET_CHUNK = 32768  # elements per parallel task: a few hundred KB of scratch, in L2


def _codec_args(codec: Codec) -> tuple[int, int, int, int]:
    """``(kind, param, k, w)`` for the kernels: kind 0 base-B (k digits per w-byte word),
    1 n-bit stream."""
    from terngrad.kernels import cpu

    base = _word_base(codec)
    if base is not None:
        return (cpu.BASE, base, *word_layout(base))
    if codec.kind == "nbit":
        return cpu.NBIT, codec.param, 0, 0
    raise ValueError(f"the fused kernels pack digits, not {codec} floats")


def _word_base(codec: Codec) -> int | None:
    """The base of a codec packed in planar words (an n-bit codec whose digits fill whole
    bytes is base 2**bits), or ``None``."""
    if codec.kind == "base":
        return codec.param
    if codec.kind == "nbit" and 8 % codec.param == 0:
        return 1 << codec.param
    return None


def _chunk(*codecs: Codec) -> int:
    """Elements per task: a multiple of every codec's planar block (8 digits for a bit
    stream), so that every task starts at a block."""
    unit = 1
    for codec in codecs:
        base = _word_base(codec)
        unit = math.lcm(unit, BLOCK_WORDS * word_layout(base)[0] if base else 8)
    return unit * max(1, _TARGET_CHUNK // unit)


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().contiguous().numpy()


_launch = threading.Lock()


class NumbaKernels(Kernels):
    """Fused CPU kernels (numba), parallel over chunks with as many threads as torch uses.

    Numba's thread pool is its ``workqueue`` layer unless ``NUMBA_THREADING_LAYER`` says
    otherwise: the OpenMP layer's threads spin while they wait, and with one training process
    per core that spinning took the cores from the other processes (measured: LeNet with 4
    workers on 2 cores ran 4.5x slower). Launches are serialised by a lock, as the workqueue
    layer must not be entered from two threads at once.
    """

    name = "numba"

    def __init__(self) -> None:
        import numba  # ImportError here when numba is missing

        if "NUMBA_THREADING_LAYER" not in os.environ:
            numba.config.THREADING_LAYER = "workqueue"
        from terngrad.kernels import cpu

        self._cpu = cpu

    @staticmethod
    def _run(kernel, *args):
        """``kernel(*args)`` on as many threads as torch uses, one launch at a time."""
        import numba

        with _launch:
            numba.set_num_threads(
                max(1, min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS))
            )
            return kernel(*args)

    def grid_prepare(self, q, flat, layout):
        x = _np(flat)
        starts = _np(layout.bucket_starts)
        raw = torch.from_numpy(
            self._run(self._cpu.bucket_moments, x, x.view(np.int32), starts, 1 << 16)
        )
        shift = torch.from_numpy(x[starts[:-1]]).double()
        moments = _moments(raw[:, 0], raw[:, 1], raw[:, 2], raw[:, 3], raw[:, 4], shift)
        bound = q.clip_bound(moments)
        return GridInput(q, flat, layout, bound, q.scale_from_moments(moments, bound))

    def grid_pack(self, grid, shared, draws, lo, hi, codec, out):
        _check_range(lo, hi - lo, grid.layout, shared)
        _check_draws(draws, grid.layout)
        _check_payload(out, codec, hi - lo)
        layout = grid.layout
        bound = np.full(layout.n_buckets, np.inf, np.float32)
        if grid.bound is not None:  # a bucket whose bound is 0 (sigma = 0) is not clipped
            bound = np.where(_np(grid.bound) > 0, _np(grid.bound), bound)
        if isinstance(draws, Streams):
            keys, uniform = draws.key_array(), np.empty(0, np.float32)
        else:
            keys, uniform = np.zeros(len(layout.segments), np.uint64), _np(draws.reshape(-1))
        self._run(
            self._cpu.grid_pack,
            _np(grid.flat), lo, hi, _np(layout.bucket_starts), bound, _np(shared),
            grid.quantizer.m, _np(layout.segment_starts), keys, uniform,
            *_codec_args(codec), _chunk(codec), out.numpy(),
        )  # fmt: skip

    def sum_packed(self, payloads, numel, codec, out_codec, out):
        for p in payloads:
            _check_payload(p, codec, numel)
        _check_payload(out, out_codec, numel)
        rows = np.stack([_np(p) for p in payloads]) if payloads else np.empty((0, 0), np.uint8)
        ok = self._run(
            self._cpu.sum_packed, rows, numel, *_codec_args(codec), *_codec_args(out_codec),
            _chunk(codec, out_codec), out.numpy(),
        )  # fmt: skip
        if not ok:
            raise ValueError(f"{codec} payload holds an invalid word or padding (corrupted data)")

    def decode_into(self, out, payload, codec, offset, divisor, lo, layout, scales):
        _check_range(lo, out.numel(), layout, scales)
        _check_payload(payload, codec, out.numel())
        ok = self._run(
            self._cpu.decode_packed, _np(payload), out.numel(), *_codec_args(codec), offset,
            np.float32(divisor), lo, _np(layout.bucket_starts), _np(scales.to(torch.float32)),
            _chunk(codec), out.numpy(),
        )  # fmt: skip
        if not ok:
            raise ValueError(f"{codec} payload holds an invalid word or padding (corrupted data)")

    def uniform(self, streams, layout, device="cpu"):
        _check_draws(streams, layout)
        out = np.empty(layout.numel, np.float32)
        self._run(
            self._cpu.uniform_into, _np(layout.segment_starts), streams.key_array(), _TARGET_CHUNK,
            out,
        )  # fmt: skip
        return torch.from_numpy(out)


# --------------------------------------------------------------------------- triton

_BLOCK = 256


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _triton_codec(codec: Codec) -> tuple[int, int, int] | None:
    """``(BASE, K, W)`` for the Triton kernels, or ``None`` where they do not apply: an n-bit
    stream whose digits straddle bytes (bits not dividing 8) or raw floats."""
    if codec.kind == "base":
        return (codec.param, *word_layout(codec.param))
    if codec.kind == "nbit" and 8 % codec.param == 0:
        return 1 << codec.param, 8 // codec.param, 1
    return None


@dataclass(frozen=True)
class _SegmentTables:
    """What a kernel needs to find an element's segment and bucket: segment offsets (with
    numel last), each segment's first bucket and bucket length, and binary-search steps."""

    starts: torch.Tensor
    bucket0: torch.Tensor
    bucket_size: torch.Tensor
    count: int
    steps: int

    @classmethod
    def of(cls, layout: Layout, device: torch.device) -> _SegmentTables:
        sizes, counts = [], []
        for n in layout.segments:
            size = layout.bucket_size if layout.bucket_size and layout.bucket_size < n else n
            sizes.append(max(size, 1))
            counts.append(-(-n // size) if n else 0)
        bucket0 = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        count = len(layout.segments)
        return cls(
            starts=layout.segment_starts.to(device),
            bucket0=torch.from_numpy(bucket0).to(device),
            bucket_size=torch.tensor(sizes, dtype=torch.int64, device=device),
            count=count,
            steps=max(1, math.ceil(math.log2(count)) + 1),
        )


class TritonKernels(Kernels):
    """Fused Triton kernels for CUDA tensors (tested on CPU through Triton's interpreter).
    Payloads may live on the host (frames are assembled there): they are copied to and from
    the gradient's device around the kernel."""

    name = "triton"

    def __init__(self, device: torch.device | str = "cuda") -> None:
        from terngrad.kernels import gpu  # ImportError here when triton is missing

        self._gpu = gpu
        self._reference = TorchKernels()
        #: where the kernels run; payloads read from host frames are copied here
        self.device = torch.device(device)

    def grid_prepare(self, q, flat, layout):
        device = flat.device
        starts = layout.bucket_starts.numpy()
        lengths = np.diff(starts)
        chunks = np.maximum(-(-lengths // (1 << 16)), 1)
        owner = np.repeat(np.arange(lengths.size), chunks)
        first = np.concatenate([[0], np.cumsum(chunks)[:-1]])
        piece_lo = starts[owner] + (np.arange(owner.size) - first[owner]) * (1 << 16)
        piece_hi = np.minimum(piece_lo + (1 << 16), starts[owner + 1])
        partial = torch.zeros((owner.size, 4), dtype=torch.float64, device=device)
        if owner.size:
            x = flat.contiguous()
            self._gpu.moments_kernel[(owner.size,)](
                x, x.view(torch.int32),
                torch.from_numpy(piece_lo).to(device), torch.from_numpy(piece_hi).to(device),
                torch.from_numpy(starts[owner]).to(device), partial, TILE=1024,
            )  # fmt: skip
        part = partial.cpu().numpy()
        sums = np.zeros((lengths.size, 3))
        np.add.at(sums, owner, part[:, :3])
        tops = np.zeros(lengths.size, np.int32)
        np.maximum.at(tops, owner, part[:, 3].astype(np.int32))
        sums_t = torch.from_numpy(sums)
        moments = _moments(
            torch.from_numpy(lengths.astype(np.float64)), sums_t[:, 0], sums_t[:, 1],
            sums_t[:, 2], torch.from_numpy(tops.view(np.float32).astype(np.float64)),
            flat[layout.bucket_starts[:-1].to(device)].double().cpu(),
        )  # fmt: skip
        bound = q.clip_bound(moments)
        local = q.scale_from_moments(moments, bound).to(device)
        return GridInput(q, flat, layout, None if bound is None else bound.to(device), local)

    def grid_pack(self, grid, shared, draws, lo, hi, codec, out):
        _check_range(lo, hi - lo, grid.layout, shared)
        _check_draws(draws, grid.layout)
        spec = _triton_codec(codec)
        if spec is None:
            ref = self._reference.grid_prepare(grid.quantizer, grid.flat, grid.layout)
            self._reference.grid_pack(ref, shared, draws, lo, hi, codec, out)
            return
        _check_payload(out, codec, hi - lo)
        base, k, w = spec
        device = grid.flat.device
        layout = grid.layout
        tables = _SegmentTables.of(layout, device)
        bound = torch.full((layout.n_buckets,), float("inf"), device=device)
        if grid.bound is not None:
            bound = torch.where(grid.bound > 0, grid.bound, bound)
        given = not isinstance(draws, Streams)
        keys = torch.tensor(
            [0] * tables.count if given else list(draws.keys), dtype=torch.int64, device=device
        )
        uniform = draws.reshape(-1).to(device) if given else grid.flat
        nwords = -(-(hi - lo) // k)
        target = out if out.device == device else torch.empty_like(out, device=device)
        if nwords:
            self._gpu.grid_pack_kernel[(_cdiv(nwords, _BLOCK),)](
                grid.flat, lo, hi, tables.starts, tables.bucket0, tables.bucket_size,
                tables.count, bound, shared.to(device, torch.float32), keys, uniform,
                grid.quantizer.m, target, nwords,
                GIVEN=given, BASE=base, K=k, W=w, L=BLOCK_WORDS, STEPS=tables.steps,
                BLOCK=_BLOCK,
            )  # fmt: skip
        if target is not out:
            out.copy_(target)

    def sum_packed(self, payloads, numel, codec, out_codec, out):
        spec, out_spec = _triton_codec(codec), _triton_codec(out_codec)
        if spec is None or out_spec is None or not payloads:
            self._reference.sum_packed(payloads, numel, codec, out_codec, out)
            return
        for p in payloads:
            _check_payload(p, codec, numel)
        _check_payload(out, out_codec, numel)
        device = self.device
        rows = torch.stack([p.reshape(-1) for p in payloads]).to(device)
        target = torch.empty_like(out, device=device)
        bad = torch.zeros(1, dtype=torch.int32, device=device)
        nwords = -(-numel // out_spec[1])
        if nwords:
            self._gpu.sum_kernel[(_cdiv(nwords, _BLOCK),)](
                rows, rows.shape[1], rows.shape[0], numel, target, nwords, bad,
                BASE=spec[0], K=spec[1], W=spec[2],
                OUT_BASE=out_spec[0], OUT_K=out_spec[1], OUT_W=out_spec[2], L=BLOCK_WORDS,
                BLOCK=_BLOCK,
            )  # fmt: skip
        if int(bad.item()):
            raise ValueError(f"{codec} payload holds an invalid word or padding (corrupted data)")
        out.copy_(target)

    def decode_into(self, out, payload, codec, offset, divisor, lo, layout, scales):
        _check_range(lo, out.numel(), layout, scales)
        spec = _triton_codec(codec)
        if spec is None:
            self._reference.decode_into(out, payload, codec, offset, divisor, lo, layout, scales)
            return
        _check_payload(payload, codec, out.numel())
        device = out.device
        tables = _SegmentTables.of(layout, device)
        bad = torch.zeros(1, dtype=torch.int32, device=device)
        n = out.numel()
        if n:
            self._gpu.decode_kernel[(_cdiv(n, _BLOCK),)](
                payload.reshape(-1).to(device), n, offset, float(divisor), lo, tables.starts,
                tables.bucket0, tables.bucket_size, tables.count,
                scales.to(device, torch.float32), out, bad,
                BASE=spec[0], K=spec[1], W=spec[2], L=BLOCK_WORDS, STEPS=tables.steps,
                BLOCK=_BLOCK,
            )  # fmt: skip
        if int(bad.item()):
            raise ValueError(f"{codec} payload holds an invalid word or padding (corrupted data)")

    def uniform(self, streams, layout, device="cpu"):
        _check_draws(streams, layout)
        tables = _SegmentTables.of(layout, torch.device(device))
        out = torch.empty(layout.numel, device=device)
        keys = torch.tensor(list(streams.keys), dtype=torch.int64, device=device)
        if layout.numel:
            self._gpu.uniform_kernel[(_cdiv(layout.numel, _BLOCK),)](
                tables.starts, tables.count, keys, out, layout.numel,
                STEPS=tables.steps, BLOCK=_BLOCK,
            )  # fmt: skip
        return out
