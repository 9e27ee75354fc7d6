"""TernGrad (Wen et al., NIPS 2017): ternary gradients ``{-s, 0, +s}`` by stochastic rounding.

For each layer (or bucket of ``bucket_size`` elements):

1. Clip (paper Sec. 3.3): ``y_k = sign(g_k) * min(|g_k|, c * sigma)``, ``sigma`` the standard
   deviation of the bucket's gradient (population, around its mean; accumulated in float64 and
   rounded to float32, so every implementation gets the same bits), ``c = 2.5`` by default;
   ``clip=None`` turns clipping off. A bucket with ``sigma = 0`` (constant values, e.g. a single
   element) is left unclipped: clipping it would zero it.
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

from terngrad.quantize.base import Layout, check_bucket_size, check_choice
from terngrad.quantize.grid import Moments, SymmetricGrid, bucket_max_abs
from terngrad.wire import Codec

PACKINGS = ("base3", "2bit")


class TernGrad(SymmetricGrid, name="terngrad", method_id=2):
    """TernGrad: ``clip`` (c in c*sigma, or None), ``bucket_size`` (None = per tensor),
    ``packing`` ("base3" or "2bit")."""

    m = 1

    def __init__(
        self, clip: float | None = 2.5, bucket_size: int | None = None, packing: str = "base3"
    ) -> None:
        if clip is not None and not (isinstance(clip, (int, float)) and clip > 0):
            raise ValueError(f"terngrad: clip must be a positive number or None, got {clip!r}")
        self.clip = None if clip is None else float(clip)
        self.bucket_size = check_bucket_size(bucket_size)
        self.packing = check_choice("terngrad: packing", packing, PACKINGS)

    @property
    def unbiased(self) -> bool:
        return self.clip is None

    @property
    def codec(self) -> Codec:
        return Codec.base(3) if self.packing == "base3" else Codec.nbit(2)

    def clip_bound(self, moments: Moments) -> torch.Tensor | None:
        return None if self.clip is None else self.clip * moments.var.sqrt().float()

    def _prepare(self, flat: torch.Tensor, layout: Layout) -> torch.Tensor:
        if self.clip is None:
            return flat
        sigma = layout.reduce(flat, lambda rows: rows.double().std(1, correction=0)).float()
        bound = layout.expand(self.clip * sigma)
        clipped = torch.sign(flat) * torch.minimum(flat.abs(), bound)
        return torch.where(bound > 0, clipped, flat)

    def _scales(self, y: torch.Tensor, layout: Layout) -> torch.Tensor:
        return bucket_max_abs(y, layout)
