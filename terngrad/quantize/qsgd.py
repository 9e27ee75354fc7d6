"""QSGD (Alistarh et al., NIPS 2017): stochastic uniform quantization of ``g / ||g||``.

With ``levels = 2m + 1`` distinct values (counted as the optimal-quantization paper counts them:
``levels=3`` is ``{-1, 0, 1} * n``, ``levels=5`` is ``{-1, -1/2, 0, 1/2, 1} * n``), each bucket
of ``bucket_size`` elements is scaled by its norm ``n`` and rounded at random to the grid
``n * j / m``::

    Q(g_k) = n * sign(g_k) * xi_k / m,   xi_k = floor(t_k) + Bernoulli(t_k - floor(t_k)),
    t_k = m |g_k| / n

(QSGD's Eq. for ``Q_s`` with ``s = m``). ``norm="max"`` (default: ``n = max_k |g_k|``, what
QSGD's experiments used) or ``norm="l2"`` (``n = ||g||_2``, its theory). Unbiased. The variance
is ``sum_k (n/m)^2 f_k (1 - f_k)``; with the L2 norm it is at most
``min(d / m^2, sqrt(d) / m) ||g||^2`` for a bucket of d elements (QSGD Lemma 3.1).
Digits ``j + m`` travel in base ``2m + 1``, one float32 norm per bucket. With ``levels=3`` and
``norm="max"`` QSGD is TernGrad without clipping. ``clip=c`` clips at ``c * sigma`` first, as
TernGrad does (:mod:`terngrad.quantize.clipping`; with ``norm="max"`` only); then
``E[Q(g)] = clip(g)``.
"""

from __future__ import annotations

import torch

from terngrad.quantize.checks import check_bucket_size, check_choice, check_levels
from terngrad.quantize.clipping import check_clip
from terngrad.quantize.grid import FLOAT32_MAX, SymmetricGrid, bucket_max_abs
from terngrad.quantize.kernels import Moments
from terngrad.quantize.layout import Layout

NORMS = ("max", "l2")


class QSGD(SymmetricGrid, name="qsgd", method_id=3):
    """QSGD: ``levels`` (odd, >= 3), ``bucket_size`` (None = per tensor), ``norm``, ``clip``
    (c in TernGrad's clipping at c * sigma before scaling, or None: the default)."""

    def __init__(
        self,
        levels: int = 5,
        bucket_size: int | None = 512,
        norm: str = "max",
        clip: float | None = None,
    ) -> None:
        check_levels(levels, "qsgd")
        if levels % 2 == 0:
            raise ValueError(
                f"qsgd: levels must be odd (2m + 1: m steps each side of zero, zero included), "
                f"got {levels}; use 'linear' for an even number of levels"
            )
        self.m = (levels - 1) // 2
        self.bucket_size = check_bucket_size(bucket_size)
        self.norm = check_choice("qsgd: norm", norm, NORMS)
        self.clip = check_clip(clip, "qsgd")
        if self.clip is not None and self.norm == "l2":
            raise ValueError(
                "qsgd: clip works with norm='max' (the scale is then max |clip(g)|); the L2 "
                "norm of clipped values is not kept by the fused kernels: use norm='max' or "
                "clip=None"
            )

    def scale_from_moments(self, moments: Moments, bound: torch.Tensor | None) -> torch.Tensor:
        if self.norm == "max":
            return super().scale_from_moments(moments, bound)
        return _finite_norm(moments.sumsq.sqrt())

    def _scales(self, y: torch.Tensor, layout: Layout) -> torch.Tensor:
        if self.norm == "max":
            return bucket_max_abs(y, layout)
        return _finite_norm(layout.reduce(y, lambda rows: rows.double().norm(dim=1)))


def _finite_norm(norm: torch.Tensor) -> torch.Tensor:
    """A float64 L2 norm as a float32 scale, at most float32's largest value (the norm of a
    large bucket of large values exceeds it; every element's magnitude does not, so the scale
    still bounds them and rounding stays unbiased)."""
    return norm.clamp(max=FLOAT32_MAX).float()
