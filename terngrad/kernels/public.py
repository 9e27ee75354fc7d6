"""The public API on the fused kernels: ``Quantizer.encode`` and ``decode`` of every quantizer
that packs digits run numba kernels on CPU tensors (TernGrad and QSGD: Triton kernels on CUDA
tensors), with the reference's bytes for the same draws (the counter-based streams ``encode``
keys from its generator, or the given ``uniform``). Installed into :mod:`terngrad.quantize`
when this package is imported (``import terngrad`` does), so the quantizer layer needs nothing
from above it.

* the shared-grid quantizers (TernGrad, QSGD) run the kernels the exchange runs
  (:mod:`terngrad.kernels.cpu`, :mod:`terngrad.kernels.gpu`), the payload and scales on the
  gradient's device as the reference leaves them;
* the level quantizers (Linear, ORQ, BinGrad-b, BinGrad-pb, scaled sign) fit their levels and
  round onto them in :mod:`terngrad.kernels.levels_cpu`; the levels themselves are built from
  the fitted float32 scales by the quantizer's own ``_levels`` (a few values per bucket), so
  encoder, decoder and reference share them exactly. The fit also serves ``variance``.

Elsewhere — the float baselines, the level quantizers on CUDA tensors, a 2-bit TernGrad
message (a 2-bit field can hold a digit the message's 3 levels do not allow, which only the
reference checks), a payload the kernels find corrupt (the reference then says what is wrong),
or no numba (or Triton) — ``None`` is returned and the reference code runs.
"""

from __future__ import annotations

from functools import cache

import torch

from terngrad.quantize import Quantizer, SymmetricGrid
from terngrad.quantize.base import FastPath
from terngrad.quantize.bingrad import PB_SWEEPS, BinGradB, BinGradPB
from terngrad.quantize.levels import LevelQuantizer
from terngrad.quantize.linear import Linear
from terngrad.quantize.orq import ORQ
from terngrad.quantize.signsgd import SignSGD
from terngrad.wire import Codec


@cache
def _backend():
    """The fused CPU backend, made once (``None`` without numba)."""
    from terngrad.kernels import NumbaKernels, numba_available

    return NumbaKernels() if numba_available() else None


@cache
def _grid_backend(kernels: str, device: torch.device):
    """The fused backend for the shared grid on ``device`` — numba for CPU tensors, Triton for
    CUDA tensors, as ``kernels="auto"`` picks them in the exchange — or ``None`` (only the
    reference can serve: the package is missing or the device has no fused backend)."""
    from terngrad.kernels import TorchKernels, resolve

    try:
        chosen = resolve(kernels, device)
    except ValueError:
        return None
    return None if isinstance(chosen, TorchKernels) else chosen


def _method(q: Quantizer) -> int | None:
    """The level kernels' code for ``q``'s method (its exact class: a subclass may change the
    fit), or ``None``."""
    from terngrad.kernels import levels_cpu as lc

    codes = {Linear: lc.LINEAR, ORQ: lc.ORQ, BinGradB: lc.BINGRAD_B, BinGradPB: lc.BINGRAD_PB}
    return {**codes, SignSGD: lc.SIGNSGD}.get(type(q))


class Fused(FastPath):
    """Fused encode, decode and level fit of the digit-packing quantizers.

    ``kernels`` chooses the shared grid's backend as the exchange's option does: ``"auto"``
    (numba for CPU tensors, Triton for CUDA tensors), ``"numba"`` or ``"triton"`` (on CPU
    tensors too under ``TRITON_INTERPRET=1``: how the tests check the Triton path here). The
    level quantizers run numba on CPU tensors (no Triton level kernels yet) unless ``kernels``
    is ``"triton"``."""

    def __init__(self, kernels: str = "auto") -> None:
        if kernels not in ("auto", "numba", "triton"):
            raise ValueError(f"kernels must be 'auto', 'numba' or 'triton', got {kernels!r}")
        self.kernels = kernels

    def _levels_served(self, q: Quantizer, device: torch.device) -> bool:
        return (
            self.kernels != "triton"
            and device.type == "cpu"
            and _backend() is not None
            and _method(q) is not None
        )

    # ------------------------------------------------------------------ the shared grid

    def _grid_encode(self, kernels, q, flat, layout, draws, scale):
        grid = kernels.grid_prepare(q, flat, layout)
        if not bool(torch.isfinite(grid.local).all()):
            return None  # a NaN or Inf: the reference says which and how many
        shared = grid.local if scale is None else scale
        payload = torch.empty(q.codec.nbytes(layout.numel), dtype=torch.uint8, device=flat.device)
        kernels.grid_pack(grid, shared, draws, 0, layout.numel, q.codec, payload)
        scales = torch.empty(layout.n_buckets, device=flat.device)
        return scales.copy_(shared.reshape(-1)), payload  # a dense copy

    def _grid_decode(self, kernels, encoded, layout, out):
        m = (encoded.levels - 1) // 2
        kernels.decode_into(out, encoded.payload, encoded.codec, m, m, 0, layout, encoded.scales)
        return out

    # ------------------------------------------------------------------ per-bucket levels

    def fit(self, q, flat, layout):
        if not isinstance(q, LevelQuantizer) or not self._levels_served(q, flat.device):
            return None
        sweeps = q.sweeps if isinstance(q, ORQ) else PB_SWEEPS
        k = q._scales_per_bucket(q.levels)
        # None for a NaN or an Inf: the reference then says what is wrong
        return _backend().level_fit(_method(q), flat, layout, q.levels, sweeps, k)

    def _levels_encode(self, q, flat, layout, draws):
        flat = q.prepare(flat, layout)  # clipped at clip * sigma where the quantizer clips
        scales = self.fit(q, flat, layout)
        if scales is None:
            return None
        levels = q._levels(scales, q.levels).to(torch.float32).contiguous()
        payload = _backend().level_pack(flat, layout, levels, q.stochastic, draws, q.codec)
        return scales.reshape(-1), payload

    def _levels_decode(self, q, encoded, layout, out):
        k = q._scales_per_bucket(encoded.levels)
        scales = encoded.scales.to(torch.float32).view(layout.n_buckets, k)
        levels = q._levels(scales, encoded.levels).to(torch.float32).contiguous()
        flat = torch.empty(layout.numel) if out is None else out
        ok = _backend().level_decode(encoded.payload, encoded.codec, layout, levels, flat)
        return flat if ok else None  # corrupt: the reference says what is wrong

    # ------------------------------------------------------------------ the interface

    def encode(self, q, flat, layout, draws, scale):
        if isinstance(q, SymmetricGrid):
            kernels = _grid_backend(self.kernels, flat.device)
            if kernels is None:
                return None
            return self._grid_encode(kernels, q, flat, layout, draws, scale)
        if not self._levels_served(q, flat.device):
            return None
        return self._levels_encode(q, flat, layout, draws)

    def decode(self, q, encoded, layout, out=None):
        codec: Codec = encoded.codec
        device = encoded.payload.device if out is None else out.device
        if not isinstance(q, SymmetricGrid) and _method(q) is None:
            return None  # the float baselines
        if codec != Codec.base(encoded.levels):
            return None
        if device.type == "cpu" and encoded.payload.device.type != "cpu":
            return None  # a device payload into a host buffer: the reference copies
        if isinstance(q, SymmetricGrid):
            kernels = _grid_backend(self.kernels, device)
            if kernels is None:
                return None
            flat = torch.empty(layout.numel, device=device) if out is None else out
            return self._grid_decode(kernels, encoded, layout, flat)
        if not self._levels_served(q, device):
            return None
        return self._levels_decode(q, encoded, layout, out)
