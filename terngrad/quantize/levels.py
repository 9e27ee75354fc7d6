"""Quantizers that pick their own sorted levels ``b_1 <= ... <= b_L`` per bucket.

Linear, ORQ, BinGrad and scaled sign differ only in how they choose the levels (``_fit``) and
in how a value is rounded onto them:

* ``"stochastic"``: a value ``y`` in the cell ``[b_i, b_{i+1}]`` becomes ``b_{i+1}`` with
  probability ``(y - b_i) / (b_{i+1} - b_i)`` and ``b_i`` otherwise, so ``E = y`` with variance
  ``(b_{i+1} - y)(y - b_i)``;
* ``"nearest"``: the closest level (threshold at the midpoints; a tie goes up).

Values outside ``[b_1, b_L]`` are clamped to the end levels first (a bias; none occurs when
``b_1 = min`` and ``b_L = max`` of the bucket). The digit on the wire is the level index, in
base L; the bucket's scales are whatever ``_levels`` needs to rebuild the levels (Linear: min
and max; ORQ: all L levels), in float32. Encoder and decoder both build the levels from those
float32 scales, so they agree exactly.

With ``clip=c`` the bucket is first clipped at ``c * sigma`` (TernGrad's clipping,
:mod:`terngrad.quantize.clipping`) and the levels are fitted to, and the values rounded from,
the clipped gradient: the unbiased methods then have ``E[Q(g)] = clip(g)``.

Every float64 sum in a fit is accumulated left to right (:func:`ordered_sum`, ``cumsum``), an
order the fused kernels (:mod:`terngrad.kernels.levels_cpu`) repeat operation for operation, so
their scales are these bits; signed zeros are made ``+0.0`` (:func:`canonical`) wherever a sort
or a min/max could pick either.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import ClassVar

import torch

from terngrad.quantize.base import Quantizer
from terngrad.quantize.checks import check_finite
from terngrad.quantize.clipping import clip_to_sigma
from terngrad.quantize.kernels import Draws, Kernels, resolve
from terngrad.quantize.layout import Layout
from terngrad.quantize.message import Encoded
from terngrad.wire import Codec


def ordered_sum(x: torch.Tensor) -> torch.Tensor:
    """Row sums ``(rows, 1)`` of a float64 ``(rows, n)`` tensor, accumulated left to right
    (``cumsum``'s last column): a fixed order, where ``sum`` reduces pairwise in one torch does
    not promise."""
    return x.cumsum(1)[:, -1:]


def canonical(x: torch.Tensor) -> torch.Tensor:
    """``x`` with ``-0.0`` made ``+0.0`` (``x + 0.0``): the bits of a sort's or a min's result
    then do not depend on which of two equal zeros it picked."""
    return x + 0.0


class LevelQuantizer(Quantizer):
    """Base of the per-bucket level quantizers."""

    rounding: ClassVar[str] = "stochastic"
    #: c in TernGrad's clipping at c * sigma before the fit, or None (no clipping)
    clip: float | None = None

    def prepare(self, flat: torch.Tensor, layout: Layout) -> torch.Tensor:
        """The values the levels are fitted to and rounded from: ``flat`` clipped at
        ``clip * sigma`` per bucket where ``clip`` is set, else ``flat`` itself."""
        return clip_to_sigma(flat, layout, self.clip)

    @property
    def stochastic(self) -> bool:  # type: ignore[override]
        return self.rounding == "stochastic"

    @property
    def codec(self) -> Codec:
        return Codec.base(self.levels)

    @abstractmethod
    def _fit(self, rows: torch.Tensor) -> torch.Tensor:
        """The scales of each bucket (one row of ``rows`` each): a ``(rows, k)`` tensor."""

    @abstractmethod
    def _levels(self, scales: torch.Tensor, levels: int) -> torch.Tensor:
        """Sorted levels ``(rows, levels)`` from float32 scales ``(rows, k)``."""

    def scales(
        self, flat: torch.Tensor, layout: Layout, kernels: str | Kernels | None = None
    ) -> torch.Tensor:
        """The float32 scales ``(n_buckets, k)`` of a finite flat gradient: ``_fit`` per
        bucket, run by ``kernels`` (:func:`~terngrad.quantize.kernels.resolve`; every backend
        gives the same bits); ``ValueError`` naming the values that are not finite."""
        return self._fitted(resolve(kernels, flat.device), flat, layout, flat)

    def _fitted(
        self, kernels: Kernels, y: torch.Tensor, layout: Layout, original: torch.Tensor
    ) -> torch.Tensor:
        """``kernels.level_fit`` of the prepared ``y``; the reference's error, counted on the
        ``original`` gradient, if it holds a NaN or an Inf."""
        scales = kernels.level_fit(self, y, layout)
        if scales is None:
            check_finite(original)  # the fit refuses NaN and Inf alone: this raises
            raise ValueError(f"{kernels.name} kernels refused to fit {self.name}'s levels")
        return scales

    def _bucket_levels(self, flat: torch.Tensor, layout: Layout, kernels: Kernels):
        """Per bucket block: ``(rows, float32 scales, levels)``."""
        scales, start = self.scales(flat, layout, kernels), 0
        for rows in layout.rows(flat):
            sc = scales[start : start + rows.shape[0]]
            start += rows.shape[0]
            yield rows, sc, self._levels(sc, self.levels)

    @staticmethod
    def _cell(y: torch.Tensor, levels: torch.Tensor):
        """For clamped values ``y``: the cell index ``i`` and its ends ``b_i``, ``b_{i+1}``."""
        idx = (torch.searchsorted(levels, y, right=True) - 1).clamp(0, levels.shape[1] - 2)
        return idx, levels.gather(1, idx), levels.gather(1, idx + 1)

    # --- levels shared by several workers (Algorithm 2's "coherent" levels, comm.coherent)

    def coherent_scales(self, stacked: torch.Tensor) -> torch.Tensor:
        """One set of float32 scales ``(n_buckets, k)`` for every worker, from each worker's
        own ``stacked`` as ``(workers, n_buckets, k)``: by default their mean (float64, summed
        in worker order, so every rank computes the same bits). Methods whose end levels are
        a bucket's min and max override it so that no worker's value falls outside them."""
        return (stacked.double().cumsum(0)[-1] / stacked.shape[0]).float()

    def round_onto(
        self,
        y: torch.Tensor,
        layout: Layout,
        scales: torch.Tensor,
        uniform: torch.Tensor | None,
        rounding: str | None = None,
    ) -> torch.Tensor:
        """The digits (int64, flat order) of prepared values ``y`` on the levels of given
        float32 ``scales`` ``(n_buckets, k)``: the method's own rounding, or ``rounding``
        (``"stochastic"``, ``"nearest"``); ``uniform`` are the draws of stochastic rounding."""
        return self.round_levels(y, layout, self._levels(scales, self.levels), uniform, rounding)

    def round_levels(
        self,
        y: torch.Tensor,
        layout: Layout,
        levels: torch.Tensor,
        uniform: torch.Tensor | None,
        rounding: str | None = None,
    ) -> torch.Tensor:
        """The digits (int64, flat order) of prepared values ``y`` on each bucket's sorted
        ``levels`` (one row per bucket), as :meth:`round_onto`."""
        digits, start = [], 0
        u_rows = layout.rows(uniform) if uniform is not None else None
        for i, rows in enumerate(layout.rows(y)):
            lv = levels[start : start + rows.shape[0]]
            start += rows.shape[0]
            u = None if u_rows is None else u_rows[i]
            digits.append(self._round_rows(rows, lv, u, rounding).reshape(-1))
        return torch.cat(digits) if digits else torch.zeros(0, dtype=torch.int64)

    def _round_rows(
        self,
        rows: torch.Tensor,
        levels: torch.Tensor,
        uniform: torch.Tensor | None,
        rounding: str | None = None,
    ) -> torch.Tensor:
        y = torch.maximum(torch.minimum(rows, levels[:, -1:]), levels[:, :1]).contiguous()
        if (rounding or self.rounding) == "nearest":
            mids = ((levels[:, 1:] + levels[:, :-1]) / 2).contiguous()
            return torch.searchsorted(mids, y, right=True)
        idx, lo, hi = self._cell(y, levels)
        width = hi.double() - lo.double()  # float64: two levels can be further apart than
        p = torch.where(width > 0, (y.double() - lo.double()) / width, 0.0)  # float32 spans
        return idx + (uniform.double() < p)

    @staticmethod
    def gather_levels(levels: torch.Tensor, digits: torch.Tensor, layout: Layout) -> torch.Tensor:
        """``levels[b, d_j]`` for each digit ``d_j`` (flat order) of bucket ``b``: the flat
        values of a message on the levels (one row per bucket)."""
        out, start = [], 0
        for rows in layout.rows(digits):
            out.append(levels[start : start + rows.shape[0]].gather(1, rows.long()).reshape(-1))
            start += rows.shape[0]
        return torch.cat(out)

    def _quantize(self, flat, layout, uniform, scale):
        y = self.prepare(flat, layout)
        scales = self.scales(y, layout, "torch")  # the unpacked form: the reference
        return scales.reshape(-1), self.round_onto(y, layout, scales, uniform)

    def _dequantize(self, scales, values, layout, levels):
        k = self._scales_per_bucket(levels)
        table = self._levels(scales.reshape(layout.n_buckets, k), levels)
        return self.gather_levels(table, values, layout)

    def _encode(
        self,
        kernels: Kernels,
        flat: torch.Tensor,
        layout: Layout,
        draws: Draws | None,
        scale: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """On ``kernels``: clip (:meth:`prepare`), fit each bucket's scales (``level_fit``),
        build the levels from the float32 scales (``_levels``, a few values a bucket), then
        round onto them and pack (``level_pack``)."""
        y = self.prepare(flat, layout)
        scales = self._fitted(kernels, y, layout, flat)
        levels = self._levels(scales, self.levels).to(torch.float32).contiguous()
        return scales.reshape(-1), kernels.level_pack(self, y, layout, levels, draws)

    def _decode(
        self, kernels: Kernels, encoded: Encoded, layout: Layout, out: torch.Tensor | None
    ) -> torch.Tensor:
        """On ``kernels``: the levels from the message's scales, then each digit's level
        (``level_decode``), into ``out`` or a new tensor on the payload's device."""
        device = encoded.payload.device if out is None else out.device
        payload = self._digit_payload(encoded, device)
        k = self._scales_per_bucket(encoded.levels)
        scales = encoded.scales.to(device, torch.float32).view(layout.n_buckets, k)
        levels = self._levels(scales, encoded.levels).to(torch.float32).contiguous()
        flat = torch.empty(layout.numel, device=device) if out is None else out
        kernels.level_decode(self, payload, encoded.codec, layout, levels, flat)
        return flat

    def _expected_sq_error(self, flat, layout, scale, kernels=None):
        total = torch.zeros((), dtype=torch.float64)
        prepared = self._bucket_levels(
            self.prepare(flat, layout), layout, resolve(kernels, flat.device)
        )
        for g, (rows, _, lv) in zip(layout.rows(flat), prepared, strict=True):
            if self.rounding == "nearest":
                q = lv.gather(1, self._round_rows(rows, lv, None))
                total += (q.double() - g.double()).square().sum()
            else:
                y = torch.maximum(torch.minimum(rows, lv[:, -1:]), lv[:, :1]).contiguous()
                _, lo, hi = self._cell(y, lv)
                y64 = y.double()
                rounding = (hi.double() - y64) * (y64 - lo.double())
                total += rounding.sum() + (y64 - g.double()).square().sum()
        return total
