"""The symmetric uniform grid shared by TernGrad and QSGD.

Values are quantized to ``s * j / m`` for integers ``j`` in ``[-m, m]`` (``2m + 1`` levels), one
scale ``s`` per bucket, by unbiased random rounding of the magnitude (sign kept)::

    t_k = m |y_k| / s,      j_k = sign(y_k) * (floor(t_k) + Bernoulli(t_k - floor(t_k)))

so ``E[s j_k / m] = y_k`` for ``|y_k| <= s``; a magnitude above an imposed ``s`` saturates at
``s``. The digit on the wire is ``j + m``. Because the grid is symmetric and fixed by ``s``,
workers that share ``s`` (scalar sharing) produce codes whose sum over N workers is an exact
integer in ``[-N m, N m]``, and ``s * sum / (N m)`` (:meth:`SymmetricGrid.decode_codes`) is
exactly the mean of their quantized gradients.

Per element, the rounding variance is ``(s/m)^2 f (1 - f)`` with ``f = t - floor(t)``; for
TernGrad (m = 1) this sums to ``s ||y||_1 - ||y||_2^2``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from terngrad.quantize.base import Quantizer
from terngrad.quantize.checks import check_finite, flat_gradient
from terngrad.quantize.clipping import clip_to_sigma
from terngrad.quantize.kernels import Draws, GridInput, Kernels, Moments
from terngrad.quantize.layout import Layout
from terngrad.quantize.message import Encoded
from terngrad.quantize.random import stochastic_round
from terngrad.wire import Codec

FLOAT32_MAX = torch.finfo(torch.float32).max


def overflow_limit(offset: int) -> float:
    """The largest scale ``s`` for which ``c * s`` is finite in float32 for every code
    ``|c| <= offset``: ``float32(FLOAT32_MAX / offset)``."""
    return float(torch.tensor(FLOAT32_MAX / max(offset, 1), dtype=torch.float32))


def grid_decode(codes: torch.Tensor, s_el: torch.Tensor, offset: int, divisor: int):
    """``(c * s) / divisor`` per element in float32 (``c = codes`` as float32, ``s`` the
    element's scale) — the one formula every decode uses, the fused kernels included — except
    where ``s`` exceeds :func:`overflow_limit` of ``offset`` (``|c| <= offset``): there
    ``c * (s / divisor)``, finite whenever ``offset <= divisor``, so a finite gradient near
    float32's range never decodes to inf or NaN."""
    c = codes.to(torch.float32)
    out = c * s_el / divisor
    limit = overflow_limit(offset)
    if s_el.numel() and bool((s_el > limit).any()):
        out = torch.where(s_el > limit, c * (s_el / divisor), out)
    return out


def _grid_values(
    scales: torch.Tensor, codes: torch.Tensor, layout: Layout, divisor: int
) -> torch.Tensor:
    """The mean of the grid values of signed ``codes`` (``|codes| <= divisor``), float32."""
    return grid_decode(codes, layout.expand(scales), divisor, divisor)


class SymmetricGrid(Quantizer):
    """Base of grid quantizers: subclasses give ``m``, the local scale and an optional clip."""

    stochastic = True
    accepts_scale = True
    nonnegative_scales = True
    m: int
    #: c in TernGrad's clipping at c * sigma (:mod:`terngrad.quantize.clipping`), or None
    clip: float | None = None

    @property
    def unbiased(self) -> bool:
        """Unbiased without clipping; with it, ``E[Q(g)] = clip(g)``."""
        return self.clip is None

    @property
    def levels(self) -> int:
        return 2 * self.m + 1

    @property
    def codec(self) -> Codec:
        return Codec.base(self.levels)

    def local_scales(self, grad: torch.Tensor, segments: Sequence[int] | None = None):
        """This worker's scale per bucket (float32, 1-D), before any sharing.

        Scalar sharing all-reduces these with MAX and passes the result as ``scale=``. Unlike
        ``encode``, a NaN or Inf in ``grad`` is not an error here: it makes its bucket's scale
        NaN or Inf, which the exchange sees after the all-reduce, on every rank at once.
        """
        flat = flat_gradient(grad)
        layout = Layout.of(flat.numel(), segments, self.bucket_size)
        if not flat.numel():
            return flat.new_empty(0)
        return self.prepare(flat, layout)[1]

    def prepare(self, flat: torch.Tensor, layout: Layout) -> tuple[torch.Tensor, torch.Tensor]:
        """``(y, s)``: the values to round (TernGrad: clipped) and their local scale per bucket.
        The exchange shares ``s`` and then calls :meth:`round_to_grid` on the same ``y``, so
        the gradient is clipped once."""
        y = self._prepare(flat, layout)
        return y, self._scales(y, layout)

    def round_to_grid(
        self, y: torch.Tensor, layout: Layout, scale: torch.Tensor, uniform: torch.Tensor
    ) -> torch.Tensor:
        """Digits ``j + m`` of prepared values ``y`` on the grid of per-bucket ``scale``."""
        t = self._position(y, layout.expand(scale))
        return (torch.sign(y) * stochastic_round(t, uniform)).to(torch.int64) + self.m

    def decode_codes(
        self, scales: torch.Tensor, codes: torch.Tensor, layout: Layout, count: int = 1
    ) -> torch.Tensor:
        """The mean of ``count`` workers' quantized gradients from the sum of their signed
        codes (shared scales): ``s * sum / (count * m)``, float32."""
        return _grid_values(scales, codes, layout, count * self.m)

    def clip_bound(self, moments: Moments) -> torch.Tensor | None:
        """Per-bucket magnitude bound that :meth:`prepare` clips to, ``c * sigma`` (float32; a
        bucket whose bound is 0 is not clipped), or ``None``: no clipping."""
        return None if self.clip is None else self.clip * moments.var.sqrt().float()

    def scale_from_moments(self, moments: Moments, bound: torch.Tensor | None) -> torch.Tensor:
        """The local scale :meth:`prepare` returns, from one-pass statistics (float32): by
        default ``max |y|``, which for clipped values is ``min(max |g|, bound)``."""
        top = moments.maxabs.float()
        return top if bound is None else torch.where(bound > 0, torch.minimum(top, bound), top)

    def _prepare(self, flat: torch.Tensor, layout: Layout) -> torch.Tensor:
        """The values to be rounded: ``flat`` clipped at ``clip * sigma`` where ``clip`` is set."""
        return clip_to_sigma(flat, layout, self.clip)

    def _scales(self, y: torch.Tensor, layout: Layout) -> torch.Tensor:
        """Per-bucket scale of the prepared values."""
        raise NotImplementedError

    def _position(self, y: torch.Tensor, s_el: torch.Tensor) -> torch.Tensor:
        """``t = m |y| / s`` per element, in [0, m] (saturating; 0 where s = 0)."""
        return torch.where(s_el > 0, y.abs() * self.m / s_el, 0.0).clamp(max=self.m)

    def _quantize(self, flat, layout, uniform, scale):
        y, local = self.prepare(flat, layout)
        s = local if scale is None else scale
        return s, self.round_to_grid(y, layout, s, uniform)

    def _dequantize(self, scales, values, layout, levels):
        m = (levels - 1) // 2
        return _grid_values(scales, values.to(torch.int64) - m, layout, m)

    def _encode(
        self,
        kernels: Kernels,
        flat: torch.Tensor,
        layout: Layout,
        draws: Draws | None,
        scale: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """On ``kernels``: the local scales (``grid_prepare``), then every digit ``j + m`` on
        the grid of the shared scales (the imposed ``scale``, else the local ones) packed in
        one ``grid_pack``; the payload and a dense float32 copy of the shared scales on the
        gradient's device."""
        grid = kernels.grid_prepare(self, flat, layout)
        if not bool(torch.isfinite(grid.local).all()):
            check_finite(flat)  # a NaN or Inf makes its bucket's scale non-finite: says which
        return self._pack(kernels, grid, grid.local if scale is None else scale, draws)

    def _pack(
        self, kernels: Kernels, grid: GridInput, shared: torch.Tensor, draws: Draws | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Every digit of ``grid``'s gradient rounded on the grid of ``shared`` and packed in
        one ``grid_pack``: the payload, and a dense float32 copy of ``shared``."""
        layout, device = grid.layout, grid.flat.device
        payload = torch.empty(self.codec.nbytes(layout.numel), dtype=torch.uint8, device=device)
        kernels.grid_pack(grid, shared, draws, 0, layout.numel, self.codec, payload)
        scales = torch.empty(layout.n_buckets, device=device)
        return scales.copy_(shared.reshape(-1)), payload

    def _decode(
        self,
        kernels: Kernels,
        encoded: Encoded,
        layout: Layout,
        out: torch.Tensor | None,
        accumulate: bool = False,
    ) -> torch.Tensor:
        """On ``kernels``: ``s (d - m) / m`` per element (``decode_into``), ``m`` from the
        message's levels, into ``out`` (added to it with ``accumulate``) or a new tensor on the
        payload's device."""
        device = encoded.payload.device if out is None else out.device
        payload = self._digit_payload(encoded, device)
        flat = torch.empty(layout.numel, device=device) if out is None else out
        m = (encoded.levels - 1) // 2
        scales = encoded.scales.to(device, torch.float32)
        kernels.decode_into(flat, payload, encoded.codec, m, m, 0, layout, scales, accumulate)
        return flat

    def _expected_sq_error(self, flat, layout, scale, kernels=None):
        y, local = self.prepare(flat, layout)
        s_el = layout.expand(local if scale is None else scale)
        t = self._position(y, s_el)
        frac = (t - t.floor()).double()
        s_el = s_el.double()
        rounding = (s_el / self.m).square() * frac * (1 - frac)
        saturated = torch.sign(y).double() * torch.minimum(y.abs().double(), s_el)
        return rounding.sum() + (saturated - flat.double()).square().sum()

    def _message_levels_problem(self, levels: int) -> str | None:
        """As :meth:`Quantizer._message_levels_problem`, and odd: ``2m + 1``."""
        problem = super()._message_levels_problem(levels)
        if problem is None and levels % 2 == 0:
            return f"{levels}, where {self.name} has an odd number (2m + 1)"
        return problem


def bucket_max_abs(y: torch.Tensor, layout: Layout) -> torch.Tensor:
    """``max_k |y_k|`` per bucket."""
    return layout.reduce(y, lambda rows: rows.abs().amax(1))
