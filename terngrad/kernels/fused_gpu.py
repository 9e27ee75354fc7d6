"""The fused GPU backend: each of the exchange's operations in one pass over CUDA tensors,
through the Triton kernels of :mod:`terngrad.kernels.gpu` (or on CPU tensors under Triton's
interpreter, ``TRITON_INTERPRET=1``). Codecs those kernels do not cover go to the reference, and
so do the level quantizers' operations (no Triton level kernels yet).

triton is imported when a :class:`TritonKernels` is made, not when this module is.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import os
from dataclasses import dataclass

import numpy as np
import torch

from terngrad.kernels.checks import _check_out, _check_payload, _check_range, _moments
from terngrad.quantize import Layout, TorchKernels
from terngrad.quantize.grid import overflow_limit
from terngrad.quantize.kernels import GridInput, Kernels, check_draws
from terngrad.quantize.random import Streams
from terngrad.wire import BLOCK_WORDS, Codec, word_layout

_BLOCK = 256


@functools.cache
def triton_available() -> bool:
    """True if the Triton kernels can be compiled (or interpreted) here."""
    return importlib.util.find_spec("triton") is not None


def _interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


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


class TritonKernels(Kernels, name="triton", devices=("cuda",)):
    """Fused Triton kernels for CUDA tensors (tested on CPU through Triton's interpreter).
    Payloads may live on the host (frames are assembled there): they are copied to and from
    the gradient's device around the kernel. The level quantizers' operations are the
    reference's."""

    def __init__(self, device: torch.device | str = "cuda") -> None:
        from terngrad.kernels import gpu  # ImportError here when triton is missing

        self._gpu = gpu
        self._reference = TorchKernels()
        #: where the kernels run; payloads read from host frames are copied here
        self.device = torch.device(device)

    @classmethod
    def unavailable(cls, device: torch.device) -> str | None:
        if device.type != "cuda" and not (device.type == "cpu" and _interpreted()):
            return (
                f"kernels='triton' runs on CUDA tensors (or on CPU under TRITON_INTERPRET=1); "
                f"these are on {device}: use kernels='auto'"
            )
        if not triton_available():
            return "kernels='triton' needs the triton package: pip install triton"
        return None

    @classmethod
    def for_device(cls, device: torch.device) -> TritonKernels:
        return cls(device)

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
        check_draws(draws, grid.layout)
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

    def decode_into(
        self, out, payload, codec, offset, divisor, lo, layout, scales, accumulate=False
    ):
        if accumulate:  # the Triton kernel writes: decode into a buffer, then add it
            values = torch.empty_like(out)
            self.decode_into(values, payload, codec, offset, divisor, lo, layout, scales)
            out += values
            return
        _check_out(out, out.device)
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
                payload.reshape(-1).to(device), n, offset, float(divisor),
                overflow_limit(offset), lo, tables.starts,
                tables.bucket0, tables.bucket_size, tables.count,
                scales.to(device, torch.float32), out, bad,
                BASE=spec[0], K=spec[1], W=spec[2], L=BLOCK_WORDS, STEPS=tables.steps,
                BLOCK=_BLOCK,
            )  # fmt: skip
        if int(bad.item()):
            raise ValueError(f"{codec} payload holds an invalid word or padding (corrupted data)")

    def uniform(self, streams, layout, device="cpu"):
        check_draws(streams, layout)
        tables = _SegmentTables.of(layout, torch.device(device))
        out = torch.empty(layout.numel, device=device)
        keys = torch.tensor(list(streams.keys), dtype=torch.int64, device=device)
        if layout.numel:
            self._gpu.uniform_kernel[(_cdiv(layout.numel, _BLOCK),)](
                tables.starts, tables.count, keys, out, layout.numel,
                STEPS=tables.steps, BLOCK=_BLOCK,
            )  # fmt: skip
        return out

    # --- the level quantizers: no Triton kernels yet, the reference's operations

    def level_fit(self, q, flat, layout):
        return self._reference.level_fit(q, flat, layout)

    def level_pack(self, q, flat, layout, levels, draws):
        return self._reference.level_pack(q, flat, layout, levels, draws)

    def level_decode(self, q, payload, codec, layout, levels, out):
        self._reference.level_decode(q, payload, codec, layout, levels, out)
