"""Fused encode/decode kernels and the counter-based random draws they share with the reference.

``kernels="auto"`` (the default of the DDP hook and ``Synchronizer``) takes the fused CPU
kernels (numba) for CPU tensors and the Triton kernels for CUDA tensors, and falls back to the
torch reference where the package they need is missing; ``kernels="torch"`` forces the
reference; ``kernels="numba"`` or ``"triton"`` insist on one. See docs/performance.md for what
each costs.
"""

from __future__ import annotations

import importlib.util
import os

import torch

from terngrad.kernels.backend import GridInput, Kernels
from terngrad.kernels.fused_cpu import NumbaKernels
from terngrad.kernels.fused_gpu import TritonKernels
from terngrad.kernels.public import Fused
from terngrad.kernels.reference import TorchKernels
from terngrad.quantize.base import install_fast_path
from terngrad.quantize.random import Streams, counter_uniform, stream_seed

install_fast_path(Fused())  # Quantizer.encode/decode on the fused kernels where they exist

KERNELS = ("auto", "numba", "triton", "torch")


def numba_available() -> bool:
    """True if the fused CPU kernels can run here."""
    return importlib.util.find_spec("numba") is not None


def triton_available() -> bool:
    """True if the Triton kernels can be compiled (or interpreted) here."""
    return importlib.util.find_spec("triton") is not None


def _interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def warm_up(levels: bool = False) -> None:
    """Compile the fused CPU kernels now (about 20 s the first time on one core, 25 s more with
    ``levels``), or load them from numba's cache (under ``terngrad/kernels/__pycache__``; about
    a second). ``levels`` adds the level quantizers' kernels (Linear, ORQ, BinGrad, scaled
    sign). A launcher calls this before it starts its workers, so they load the kernels
    instead of each compiling them at its first step."""
    if not numba_available():
        return
    from terngrad import quantize
    from terngrad.quantize import Layout
    from terngrad.wire import Codec

    kernels, q = NumbaKernels(), quantize.get("terngrad")
    grad, layout, streams = torch.linspace(-1, 1, 64), Layout.of(64), Streams((0,))
    grid = kernels.grid_prepare(q, grad, layout)
    packed = torch.empty(q.codec.nbytes(64), dtype=torch.uint8)
    kernels.grid_pack(grid, grid.local, streams, 0, 64, q.codec, packed)
    total = torch.empty(Codec.base(5).nbytes(64), dtype=torch.uint8)
    kernels.sum_packed([packed, packed], 64, q.codec, Codec.base(5), total)
    kernels.decode_into(torch.empty(64), total, Codec.base(5), 2, 2, 0, layout, grid.local)
    kernels.uniform(streams, layout)
    if levels:
        for name in ("orq", "bingrad-b"):  # stochastic and nearest rounding: every kernel
            level_q = quantize.get(name, bucket_size=16)
            level_q.decode(level_q.encode(grad))


def resolve(kernels: str = "auto", device: torch.device | str = "cpu") -> Kernels:
    """The backend for tensors on ``device``: ``ValueError`` for an unknown name or a request
    this machine cannot serve."""
    if kernels not in KERNELS:
        raise ValueError(f"kernels must be one of {', '.join(map(repr, KERNELS))}, got {kernels!r}")
    kind = torch.device(device).type
    if kernels == "auto":
        if kind == "cpu" and numba_available():
            return NumbaKernels()
        if kind == "cuda" and triton_available():
            return TritonKernels(device)
        return TorchKernels()
    if kernels == "torch":
        return TorchKernels()
    if kernels == "numba":
        if kind != "cpu":
            raise ValueError(
                f"kernels='numba' runs on CPU tensors; these are on {torch.device(device)}: "
                "use kernels='auto', 'triton' or 'torch'"
            )
        if not numba_available():
            raise ValueError("kernels='numba' needs the numba package: pip install numba")
        return NumbaKernels()
    if kind != "cuda" and not (kind == "cpu" and _interpreted()):
        raise ValueError(
            f"kernels='triton' runs on CUDA tensors (or on CPU under TRITON_INTERPRET=1); "
            f"these are on {torch.device(device)}: use kernels='auto'"
        )
    if not triton_available():
        raise ValueError("kernels='triton' needs the triton package: pip install triton")
    return TritonKernels(device)


__all__ = [
    "KERNELS",
    "Fused",
    "GridInput",
    "Kernels",
    "NumbaKernels",
    "Streams",
    "TorchKernels",
    "TritonKernels",
    "counter_uniform",
    "numba_available",
    "resolve",
    "stream_seed",
    "triton_available",
    "warm_up",
]
