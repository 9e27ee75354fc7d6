"""The public API on the fused kernels: ``Quantizer.encode`` and ``decode`` of the shared-grid
quantizers (TernGrad, QSGD) on CPU tensors run the numba kernels the exchange runs, with the
reference's bytes for the same draws (the counter-based streams ``encode`` keys from its
generator, or the given ``uniform``). Installed into :mod:`terngrad.quantize` when this package
is imported (``import terngrad`` does), so the quantizer layer needs nothing from above it.

Elsewhere — other quantizers, CUDA tensors (their frames live on the host), a 2-bit TernGrad
message (a 2-bit field can hold a digit the message's 3 levels do not allow, which only the
reference checks), or no numba — ``None`` is returned and the reference code runs.
"""

from __future__ import annotations

from functools import cache

import torch

from terngrad.quantize import Quantizer, SymmetricGrid
from terngrad.quantize.base import FastPath
from terngrad.wire import Codec


@cache
def _backend():
    """The fused CPU backend, made once (``None`` without numba)."""
    from terngrad.kernels import NumbaKernels, numba_available

    return NumbaKernels() if numba_available() else None


def _served(q: Quantizer, flat_device: torch.device) -> bool:
    return isinstance(q, SymmetricGrid) and flat_device.type == "cpu" and _backend() is not None


class FusedGrid(FastPath):
    """Encode and decode of :class:`~terngrad.quantize.SymmetricGrid` quantizers, fused."""

    def encode(self, q, flat, layout, draws, scale):
        if not _served(q, flat.device):
            return None
        kernels = _backend()
        grid = kernels.grid_prepare(q, flat, layout)
        if not bool(torch.isfinite(grid.local).all()):
            return None  # a NaN or Inf: the reference says which and how many
        shared = grid.local if scale is None else scale
        payload = torch.empty(q.codec.nbytes(layout.numel), dtype=torch.uint8)
        kernels.grid_pack(grid, shared, draws, 0, layout.numel, q.codec, payload)
        scales = torch.empty(layout.n_buckets).copy_(shared.reshape(-1))  # a dense copy
        return scales, payload

    def decode(self, q, encoded, layout, out=None):
        codec: Codec = encoded.codec
        if not _served(q, encoded.payload.device) or codec != Codec.base(encoded.levels):
            return None
        if out is not None and out.device.type != "cpu":
            return None
        m = (encoded.levels - 1) // 2
        out = torch.empty(layout.numel) if out is None else out
        _backend().decode_into(out, encoded.payload, codec, m, m, 0, layout, encoded.scales)
        return out
