"""terngrad: communication-efficient data-parallel training with ternary and other quantized
gradients over torch.distributed.

Layers, bottom to top (no layer imports one above it): ``wire`` (bytes), ``quantize`` (the
math), then the distributed, training and benchmark layers built on them.
"""

# importing terngrad.kernels registers the fused backends (numba, Triton) with
# terngrad.quantize.resolve(), so kernels="auto" finds them: keep this import
from terngrad import kernels, quantize, wire

__version__ = "0.1.0"

__all__ = ["__version__", "kernels", "quantize", "wire"]
