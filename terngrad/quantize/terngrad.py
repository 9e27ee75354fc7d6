"""TernGrad (Wen et al., NIPS 2017): ternary gradients ``{-s, 0, +s}`` by stochastic rounding.

For each layer (or bucket of ``bucket_size`` elements):

1. Clip (paper Sec. 3.3, :mod:`terngrad.quantize.clipping`): ``y_k = sign(g_k) * min(|g_k|,
   c * sigma)``, ``sigma`` the standard deviation of the bucket's gradient, ``c = 2.5`` by
   default; ``clip=None`` turns clipping off.
2. Scale (paper Eq. 4): ``s = max_k |y_k|``, or the ``scale=`` the caller imposes (scalar
   sharing, Sec. 3.2: the max over workers); magnitudes above an imposed ``s`` saturate at ``s``.
3. Ternarize (Eq. 4-5): ``t_k = s * sign(y_k) * b_k`` with ``b_k ~ Bernoulli(|y_k| / s)``, so
   ``E[t] = y`` and ``E||t - y||^2 = s ||y||_1 - ||y||_2^2``.

The digit ``sign(y_k) b_k + 1`` travels in base 3 (5 per byte, 1.6 bits; ``packing="base3"``)
or in 2 bits (``packing="2bit"``, the paper's encoding), plus one float32 scale per bucket.
Without clipping TernGrad is unbiased; with it, ``E[t] = y``, which differs from ``g`` on the
few elements beyond ``c * sigma``.
"""

from __future__ import annotations

import torch

from terngrad.quantize.checks import check_bucket_size, check_choice
from terngrad.quantize.clipping import check_clip
from terngrad.quantize.grid import SymmetricGrid, bucket_max_abs
from terngrad.quantize.layout import Layout
from terngrad.wire import Codec

PACKINGS = ("base3", "2bit")


class TernGrad(SymmetricGrid, name="terngrad", method_id=2):
    """TernGrad: ``clip`` (c in c*sigma, or None), ``bucket_size`` (None = per tensor),
    ``packing`` ("base3" or "2bit")."""

    m = 1

    def __init__(
        self, clip: float | None = 2.5, bucket_size: int | None = None, packing: str = "base3"
    ) -> None:
        self.clip = check_clip(clip, "terngrad")
        self.bucket_size = check_bucket_size(bucket_size)
        self.packing = check_choice("terngrad: packing", packing, PACKINGS)

    @property
    def codec(self) -> Codec:
        return Codec.base(3) if self.packing == "base3" else Codec.nbit(2)

    def _scales(self, y: torch.Tensor, layout: Layout) -> torch.Tensor:
        return bucket_max_abs(y, layout)
