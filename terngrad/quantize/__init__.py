"""Gradient quantizers: the math of turning a gradient into a few bits per element.

>>> from terngrad import quantize
>>> q = quantize.get("terngrad", clip=2.5)
>>> enc = q.encode(grad, generator=torch.Generator().manual_seed(0))
>>> out = q.decode(enc)          # same shape, float32
>>> enc.nbytes                    # exact bytes on the wire

``names()`` lists the methods; ``docs/quantizers.md`` gives each one's formula, bias, variance
and bits per element. ``encode``/``decode`` take ``kernels=``, the backend that runs
(:func:`resolve`: by default the fused kernels where they run, ``"torch"`` the reference; the
same bytes either way).
"""

from __future__ import annotations

from typing import Any

import torch

from terngrad.quantize import bingrad, identity, linear, orq, qsgd, signsgd, terngrad  # noqa: F401
from terngrad.quantize.base import Quantizer
from terngrad.quantize.grid import SymmetricGrid
from terngrad.quantize.kernels import Kernels, Moments, resolve
from terngrad.quantize.layout import Layout
from terngrad.quantize.levels import LevelQuantizer
from terngrad.quantize.message import Encoded, lookup, registered_names
from terngrad.quantize.reference import TorchKernels  # registers the reference backend


def names() -> list[str]:
    """The registered quantizer names, in method-id order."""
    return registered_names()


def get(name: str, **options: Any) -> Quantizer:
    """The quantizer ``name`` configured with ``options``; ``ValueError`` naming any unknown
    name or option (with the valid ones)."""
    cls = lookup(name)
    valid = cls.option_names()
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise ValueError(
            f"quantizer {name!r} has no option {', '.join(map(repr, unknown))}; "
            f"its options are: {', '.join(valid) or 'none'}"
        )
    return cls(**options)


def decode(
    message: Encoded | torch.Tensor | bytes, kernels: str | Kernels | None = None
) -> torch.Tensor:
    """Decode an :class:`Encoded` or a frame with whichever method produced it (``kernels``
    as in :meth:`Quantizer.decode`)."""
    encoded = message if isinstance(message, Encoded) else Encoded.from_frame(message)
    return lookup(encoded.method)().decode(encoded, kernels=kernels)


__all__ = [
    "Encoded",
    "Kernels",
    "Layout",
    "LevelQuantizer",
    "Moments",
    "Quantizer",
    "SymmetricGrid",
    "TorchKernels",
    "decode",
    "get",
    "names",
    "resolve",
]
