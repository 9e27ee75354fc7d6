"""TernGrad's gradient clipping (Wen et al. 2017, Sec. 3.3), shared by every quantizer that
takes ``clip=``.

Per bucket (or layer), ``clip(g_k) = sign(g_k) * min(|g_k|, c * sigma)``, with ``sigma`` the
bucket's standard deviation (population, around its mean, accumulated in float64 and rounded to
float32, so every implementation gets the same bits) and ``c`` the ``clip`` option (TernGrad's
2.5). A bucket with ``sigma = 0`` (constant values, e.g. a single element) is left unclipped:
clipping it would zero it. The optimal-quantization paper (Xu et al. 2020, Sec. 4) applies the
same clipping before ORQ and BinGrad.

A quantizer that is unbiased without clipping is unbiased *for the clipped gradient* with it:
``E[Q(g)] = clip(g)``, which differs from ``g`` on the few elements beyond ``c * sigma``.
"""

from __future__ import annotations

from typing import Any

import torch

from terngrad.quantize.layout import Layout


def check_clip(clip: Any, name: str) -> float | None:
    """``None`` (no clipping) or ``c`` as a positive finite float."""
    if clip is None:
        return None
    number = isinstance(clip, int | float) and not isinstance(clip, bool)
    if not (number and 0 < clip < float("inf")):
        raise ValueError(
            f"{name}: clip must be a positive number (c in c*sigma) or None, got {clip!r}"
        )
    return float(clip)


def bucket_sigma(flat: torch.Tensor, layout: Layout) -> torch.Tensor:
    """Each bucket's population standard deviation, float64 sums rounded to float32."""
    return layout.reduce(flat, lambda rows: rows.double().std(1, correction=0)).float()


def clip_to_sigma(flat: torch.Tensor, layout: Layout, c: float | None) -> torch.Tensor:
    """``sign(g) * min(|g|, c * sigma)`` per bucket of ``layout`` (``flat`` itself if ``c`` is
    ``None``); buckets with ``sigma = 0`` unchanged."""
    if c is None or not flat.numel():
        return flat
    bound = layout.expand(c * bucket_sigma(flat, layout))
    clipped = torch.sign(flat) * torch.minimum(flat.abs(), bound)
    return torch.where(bound > 0, clipped, flat)
