"""The symmetric uniform grid shared by TernGrad and QSGD.

Values are quantized to ``s * j / m`` for integers ``j`` in ``[-m, m]`` (``2m + 1`` levels), one
scale ``s`` per bucket, by unbiased random rounding of the magnitude (sign kept)::

    t_k = m |y_k| / s,      j_k = sign(y_k) * (floor(t_k) + Bernoulli(t_k - floor(t_k)))

so ``E[s j_k / m] = y_k`` for ``|y_k| <= s``; a magnitude above an imposed ``s`` saturates at
``s``. The digit on the wire is ``j + m``. Because the grid is symmetric and fixed by ``s``,
workers that share ``s`` (scalar sharing) produce codes whose sum is an exact integer.

Per element, the rounding variance is ``(s/m)^2 f (1 - f)`` with ``f = t - floor(t)``; for
TernGrad (m = 1) this sums to ``s ||y||_1 - ||y||_2^2``.
"""

from __future__ import annotations

import torch

from terngrad.quantize.base import (
    Encoded,
    Quantizer,
    bucket_expand,
    bucket_reduce,
    check_gradient,
    stochastic_round,
)
from terngrad.wire import Codec


class SymmetricGrid(Quantizer):
    """Base of grid quantizers: subclasses give ``m``, the local scale and an optional clip."""

    stochastic = True
    accepts_scale = True
    m: int

    @property
    def levels(self) -> int:
        return 2 * self.m + 1

    @property
    def codec(self) -> Codec:
        return Codec.base(self.levels)

    def local_scales(self, grad: torch.Tensor) -> torch.Tensor:
        """This worker's scale per bucket (float32, 1-D), before any sharing.

        Scalar sharing all-reduces these with MAX and passes the result as ``scale=``.
        """
        flat = check_gradient(grad)
        if not flat.numel():
            return flat.new_empty(0)
        return self._scales(self._prepare(flat))

    def _prepare(self, flat: torch.Tensor) -> torch.Tensor:
        """The values to be rounded (TernGrad clips here); identity by default."""
        return flat

    def _scales(self, y: torch.Tensor) -> torch.Tensor:
        """Per-bucket scale of the prepared values."""
        raise NotImplementedError

    def _grid_position(self, flat: torch.Tensor, scale: torch.Tensor | None):
        """``(y, s, t)``: prepared values, per-bucket scales, and ``t = m |y| / s`` in [0, m]."""
        y = self._prepare(flat)
        s = self._scales(y) if scale is None else scale
        s_el = bucket_expand(s, y.numel(), self.bucket_size)
        t = torch.where(s_el > 0, y.abs() * self.m / s_el, 0.0).clamp(max=self.m)
        return y, s, t

    def _quantize(self, flat, uniform, scale):
        y, s, t = self._grid_position(flat, scale)
        codes = torch.sign(y) * stochastic_round(t, uniform)
        return s, codes.to(torch.int64) + self.m

    def _dequantize(self, encoded: Encoded, scales, values):
        m = (encoded.levels - 1) // 2
        s_el = bucket_expand(scales, encoded.numel, encoded.bucket_size)
        return (values.to(torch.float32) - m) * s_el / m

    def _expected_sq_error(self, flat, scale):
        y, s, t = self._grid_position(flat, scale)
        s_el = bucket_expand(s, y.numel(), self.bucket_size).double()
        frac = (t - t.floor()).double()
        rounding = (s_el / self.m).square() * frac * (1 - frac)
        saturated = torch.sign(y).double() * torch.minimum(y.abs().double(), s_el)
        return rounding.sum() + (saturated - flat.double()).square().sum()

    def _check_message_levels(self, levels: int) -> None:
        if levels < 3 or levels % 2 == 0:
            raise ValueError(
                f"{self.name} message needs an odd number of levels >= 3, got {levels}"
            )


def bucket_max_abs(y: torch.Tensor, bucket_size: int | None) -> torch.Tensor:
    """``max_k |y_k|`` per bucket."""
    return bucket_reduce(y, bucket_size, lambda rows: rows.abs().amax(1))
