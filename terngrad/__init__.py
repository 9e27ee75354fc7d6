"""terngrad: communication-efficient data-parallel training with ternary and other quantized
gradients over torch.distributed.

Layers, bottom to top (no layer imports one above it): ``wire`` (bytes), ``quantize`` (the
math), then the distributed, training and benchmark layers built on them.
"""

import importlib
from types import ModuleType

# importing terngrad.kernels registers the fused backends (numba, Triton) with
# terngrad.quantize.resolve(), so kernels="auto" finds them: keep this import
from terngrad import kernels, quantize, wire

__version__ = "0.1.0"

__all__ = ["__version__", "kernels", "quantize", "wire"]

#: the front doors, reached after a plain ``import terngrad`` (``terngrad.ddp.register``,
#: ``terngrad.diloco.DiLoCo``) and imported at first use: who never uses one pays nothing for
#: its imports (torch.distributed's, the frameworks')
LAZY = ("comm", "ddp", "diloco", "fsdp", "integrations", "optim")


def __getattr__(name: str) -> ModuleType:
    if name in LAZY:
        return importlib.import_module(f"terngrad.{name}")
    raise AttributeError(f"module 'terngrad' has no attribute {name!r}")
