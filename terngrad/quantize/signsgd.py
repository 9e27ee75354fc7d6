"""Scaled sign (signSGD with a magnitude; Bernstein et al. 2018, Karimireddy et al. 2019).

``Q(g) = (||g||_1 / d) sign(g)`` per bucket of d elements, with ``sign(0) = +1`` so that one
bit per element suffices. Deterministic and biased: ``E||Q(g) - g||^2 = ||g||_2^2 -
||g||_1^2 / d`` (the scale is the least-squares magnitude for the sign pattern). One float32
scale per bucket; 1 bit per element. Pair it with error feedback.
"""

from __future__ import annotations

import torch

from terngrad.quantize.checks import check_bucket_size
from terngrad.quantize.clipping import check_clip
from terngrad.quantize.levels import LevelQuantizer, ordered_sum


class SignSGD(LevelQuantizer, name="signsgd", method_id=8):
    """Scaled sign: ``bucket_size`` (None = one scale per tensor), ``clip`` (c in clipping at
    c * sigma first, or None: it lowers the scale, not the signs)."""

    unbiased = False
    rounding = "nearest"
    levels = 2
    nonnegative_scales = True  # the scale is mean |g|: a negative one would flip the signs

    def __init__(self, bucket_size: int | None = None, clip: float | None = None) -> None:
        self.bucket_size = check_bucket_size(bucket_size)
        self.clip = check_clip(clip, "signsgd")

    def _fit(self, rows: torch.Tensor) -> torch.Tensor:
        # in float64: a float32 sum of a large bucket of large values would overflow
        return ordered_sum(rows.double().abs()) / rows.shape[1]

    def _levels(self, scales: torch.Tensor, levels: int) -> torch.Tensor:
        return torch.cat([-scales, scales], dim=1)
