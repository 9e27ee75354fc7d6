"""The reference backend: the quantizers' own torch code and the wire layer's packers, step by
step, unfused. The fused backends (:mod:`terngrad.kernels`) are tested against its bytes, and
:func:`~terngrad.quantize.kernels.resolve` falls back to it where none of them can run."""

from __future__ import annotations

import torch

from terngrad.quantize.checks import check_digits
from terngrad.quantize.grid import grid_decode
from terngrad.quantize.kernels import GridInput, Kernels, check_draws
from terngrad.quantize.random import Streams


class TorchKernels(Kernels, name="torch"):
    """The reference: the quantizer and wire layers' torch code, unfused, on any device."""

    # ------------------------------------------------------------------ the shared grid

    def grid_prepare(self, q, flat, layout):
        y, local = q.prepare(flat, layout)
        return GridInput(q, flat, layout, None, local, {"y": y})

    def grid_pack(self, grid, shared, draws, lo, hi, codec, out):
        check_draws(draws, grid.layout)
        cached = grid.cache.get("digits")  # every range of one step rounds the same digits
        if cached is None or cached[0] is not shared or cached[1] is not draws:
            y = grid.cache["y"]
            uniform = (
                draws.uniform(grid.layout.segments).to(y.device)
                if isinstance(draws, Streams)
                else draws
            )
            digits = grid.quantizer.round_to_grid(y, grid.layout, shared, uniform.reshape(-1))
            cached = grid.cache["digits"] = (shared, draws, digits)
        out.copy_(codec.pack(cached[2][lo:hi]))

    def sum_packed(self, payloads, numel, codec, out_codec, out):
        total = sum(codec.unpack(p, numel).to(torch.int64) for p in payloads)
        out.copy_(out_codec.pack(total))

    def decode_into(
        self, out, payload, codec, offset, divisor, lo, layout, scales, accumulate=False
    ):
        digits = codec.unpack(payload, out.numel()).to(torch.int64) - offset
        s_el = layout.expand(scales)[lo : lo + out.numel()]
        values = grid_decode(digits, s_el, offset, divisor)
        if accumulate:
            out += values
        else:
            out.copy_(values)

    def uniform(self, streams, layout, device="cpu"):
        return streams.uniform(layout.segments).to(device)

    # ------------------------------------------------------------------ per-bucket levels

    def level_fit(self, q, flat, layout):
        if not bool(torch.isfinite(flat).all()):
            return None
        return torch.cat([q._fit(rows).to(torch.float32) for rows in layout.rows(flat)])

    def level_pack(self, q, flat, layout, levels, draws):
        uniform = (
            draws.uniform(layout.segments).to(flat.device) if isinstance(draws, Streams) else draws
        )
        return q.codec.pack(q.round_levels(flat, layout, levels, uniform))

    def level_decode(self, q, payload, codec, layout, levels, out):
        digits = codec.unpack(payload, layout.numel)
        check_digits(q.name, digits, levels.shape[1])
        out.copy_(q.gather_levels(levels, digits, layout))
