"""What the fused backends share: the moments of their one-pass sums, and the checks of the
ranges and payloads their kernels index (the kernels themselves do not check bounds). The
interface they implement is :class:`terngrad.quantize.kernels.Kernels`."""

from __future__ import annotations

import torch

from terngrad.quantize import Layout, Moments
from terngrad.quantize.checks import check_out
from terngrad.wire import Codec


def _moments(count, shifted_sum, shifted_sumsq, sumsq, maxabs, shift) -> Moments:
    """:class:`Moments` from one-pass float64 sums per bucket, those of ``x - K`` shifted by
    the bucket's first element ``K`` (shifting keeps the variance accurate when the mean is
    large against the spread)."""
    mean = shifted_sum / count
    return Moments(
        count=count,
        mean=mean + shift,
        var=(shifted_sumsq - shifted_sum * mean).clamp(min=0) / count,
        sumsq=sumsq,
        maxabs=maxabs,
    )


def _check_payload(payload: torch.Tensor, codec: Codec, numel: int) -> None:
    """The kernels read exactly ``codec.nbytes(numel)`` bytes: refuse any other length."""
    if payload.dtype != torch.uint8 or payload.numel() != codec.nbytes(numel):
        raise ValueError(
            f"{codec} payload of {payload.numel()} bytes ({payload.dtype}) for {numel} digits; "
            f"expected {codec.nbytes(numel)} uint8 bytes (truncated data or a wrong count)"
        )


def _check_out(out: torch.Tensor, device: torch.device) -> None:
    """The kernels write ``out`` through its raw memory: a contiguous float32 tensor on
    ``device`` that does not require grad (:func:`~terngrad.quantize.checks.check_out`)."""
    check_out(out, out.numel() if isinstance(out, torch.Tensor) else 0, device)


def _check_range(lo: int, count: int, layout: Layout, scales: torch.Tensor) -> None:
    """The kernels index ``[lo, lo + count)`` of ``layout`` and one scale per bucket."""
    if not 0 <= lo <= lo + count <= layout.numel:
        raise ValueError(f"elements [{lo}, {lo + count}) outside a layout of {layout.numel}")
    if scales.numel() != layout.n_buckets:
        raise ValueError(f"{scales.numel()} scales for {layout.n_buckets} buckets")
