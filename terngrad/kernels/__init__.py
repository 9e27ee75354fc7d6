"""Fused encode/decode kernels and the counter-based random draws they share with the reference.

``kernels="auto"`` (the default of the DDP hook and ``Synchronizer``) takes the fused CPU
kernels (numba) for CPU tensors and falls back to the torch reference where numba is missing
or the tensors live on a GPU; ``kernels="torch"`` forces the reference, ``kernels="numba"``
insists on the fused kernels. See docs/performance.md for what each costs.
"""

from __future__ import annotations

import torch

from terngrad.kernels.backend import GridInput, Kernels, NumbaKernels, TorchKernels
from terngrad.kernels.random import Streams, counter_uniform, stream_seed

KERNELS = ("auto", "numba", "torch")


def numba_available() -> bool:
    """True if the fused CPU kernels can run here."""
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True


def resolve(kernels: str = "auto", device: torch.device | str = "cpu") -> Kernels:
    """The backend for tensors on ``device``: ``ValueError`` for an unknown name or a request
    this machine cannot serve."""
    if kernels not in KERNELS:
        raise ValueError(f"kernels must be one of {', '.join(map(repr, KERNELS))}, got {kernels!r}")
    cpu = torch.device(device).type == "cpu"
    if kernels == "torch" or (kernels == "auto" and not (cpu and numba_available())):
        return TorchKernels()
    if not cpu:
        raise ValueError(
            f"kernels='numba' runs on CPU tensors; these are on {torch.device(device)}: "
            "use kernels='auto' or 'torch'"
        )
    if not numba_available():
        raise ValueError("kernels='numba' needs the numba package: pip install numba")
    return NumbaKernels()


__all__ = [
    "KERNELS",
    "GridInput",
    "Kernels",
    "NumbaKernels",
    "Streams",
    "TorchKernels",
    "counter_uniform",
    "numba_available",
    "resolve",
    "stream_seed",
]
