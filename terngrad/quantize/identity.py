"""The float baselines: ``fp32`` (identity, 32 bits per element) and ``fp16`` (a cast, 16 bits).

They let the same code path measure an uncompressed exchange; ``fp16`` is what PyTorch's
``fp16_compress_hook`` sends.
"""

from __future__ import annotations

import torch

from terngrad.quantize.base import Quantizer
from terngrad.wire import Codec

FP16_MAX = 65504.0


class FP32(Quantizer, name="fp32", method_id=0):
    """Identity: ``Q(g) = g`` in float32. Unbiased, zero variance, 32 bits per element."""

    unbiased = True
    levels = 0
    codec = Codec.raw32()

    def __init__(self) -> None:
        """No options."""

    def _quantize(self, flat, layout, uniform, scale):
        return flat.new_empty(0), flat

    def _dequantize(self, scales, values, layout, levels):
        return values.to(torch.float32)

    def _expected_sq_error(self, flat, layout, scale, kernels=None):
        return torch.zeros((), dtype=torch.float64)

    def _scales_per_bucket(self, levels: int) -> int:
        return 0


class FP16(FP32, name="fp16", method_id=1):
    """Cast to float16 (round to nearest even): 16 bits per element, deterministic.

    Biased by the rounding (relative error at most 2**-11 per element); magnitudes beyond
    float16's range saturate at +-65504 instead of becoming infinite.
    """

    unbiased = False
    codec = Codec.raw16()

    def _quantize(self, flat, layout, uniform, scale):
        return flat.new_empty(0), flat.clamp(-FP16_MAX, FP16_MAX).half()

    def _expected_sq_error(self, flat, layout, scale, kernels=None):
        cast = flat.clamp(-FP16_MAX, FP16_MAX).half().float()
        return (cast.double() - flat.double()).square().sum()
