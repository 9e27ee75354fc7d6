"""The fused backends of :class:`~terngrad.quantize.kernels.Kernels` and the counter-based random
draws they share with the reference.

Importing this package registers :class:`NumbaKernels` (fused CPU kernels) and
:class:`TritonKernels` (CUDA tensors) with :func:`resolve`, the one place that chooses a
backend: ``kernels="auto"`` (the default of ``Quantizer.encode``/``decode``, the DDP hook and
``Synchronizer``) takes numba for CPU tensors and Triton for CUDA tensors, and falls back to the
torch reference (:class:`TorchKernels`) where the package they need is missing;
``kernels="torch"`` forces the reference; ``kernels="numba"`` or ``"triton"`` insist on one.
``import terngrad`` imports this package. See docs/performance.md for what each costs.
"""

from __future__ import annotations

import torch

from terngrad.kernels.fused_cpu import NumbaKernels, numba_available
from terngrad.kernels.fused_gpu import TritonKernels, triton_available
from terngrad.quantize.kernels import KERNELS, GridInput, Kernels, resolve
from terngrad.quantize.random import Streams, counter_uniform, stream_seed
from terngrad.quantize.reference import TorchKernels


def warm_up(levels: bool = False, threads: int | None = None) -> None:
    """Compile the fused CPU kernels now (about 20 s the first time on one core, 25 s more with
    ``levels``), or load them from numba's cache (under ``terngrad/kernels/__pycache__``; about
    a second). ``levels`` adds the level quantizers' kernels (Linear, ORQ, BinGrad, scaled
    sign). ``threads``: the torch threads of the processes that will run them — 1 (a training
    rank) takes the kernels' serial build, more their parallel one; ``None``: both. A launcher
    calls this before it starts its workers, so they load the kernels instead of each compiling
    them at its first step."""
    if not numba_available():
        return
    before = torch.get_num_threads()
    try:
        for count in (1, max(before, 2)) if threads is None else (threads,):
            torch.set_num_threads(count)
            _exercise(levels)
    finally:
        torch.set_num_threads(before)


def _exercise(levels: bool) -> None:
    """Every numba kernel once, on a tiny input."""
    from terngrad import quantize
    from terngrad.quantize import Layout
    from terngrad.wire import Codec

    kernels, q = resolve("numba"), quantize.get("terngrad")
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
            level_q.decode(level_q.encode(grad, kernels=kernels), kernels=kernels)


__all__ = [
    "KERNELS",
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
