"""The reference backend: the quantizer layer's pure-torch code and the wire layer's packers,
step by step, unfused. The fused backends are tested against its bytes."""

from __future__ import annotations

import torch

from terngrad.kernels.backend import GridInput, Kernels, _check_draws
from terngrad.quantize.grid import grid_decode
from terngrad.quantize.random import Streams


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
        out.copy_(grid_decode(digits, s_el, offset, divisor))

    def uniform(self, streams, layout, device="cpu"):
        return streams.uniform(layout.segments).to(device)
