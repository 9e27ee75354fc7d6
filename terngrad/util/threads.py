"""The compute threads of a training process, the same on every thread of it.

``torch.set_num_threads`` sets OpenMP's and MKL's thread counts for the calling thread only.
torch.distributed runs a comm hook's callbacks on the process group's own threads, where MKL
keeps its process-wide count (the cores). PyTorch's ``powerSGD_hook`` decompresses, ``P Qᵀ``
(an MKL matmul), in such a callback: on the main thread where the all-reduce had finished
before the callback was attached, on gloo's thread otherwise, so with two counts of threads
whose results differ in the last bits. The ranks then hold other parameters after a step (seen
in 5 of 16 two-rank LeNet runs of 12 steps, PyTorch 2.13 on an AMD EPYC). :func:`use_threads`
sets MKL's process-wide count too, so every thread computes alike.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from pathlib import Path

import torch


def use_threads(count: int) -> None:
    """Compute with ``count`` threads on every thread of this process: torch's
    (``torch.set_num_threads``) and MKL's process-wide count, where torch carries MKL."""
    torch.set_num_threads(count)
    set_mkl_threads = _mkl_process_threads()
    if set_mkl_threads is not None:
        set_mkl_threads(ctypes.c_int(count))


@functools.cache
def _mkl_process_threads() -> Callable[[ctypes.c_int], object] | None:
    """MKL's ``mkl_set_num_threads`` (the process-wide count) as linked into torch's CPU
    library, or ``None`` for a torch without MKL (then no thread computes with MKL)."""
    if not torch.backends.mkl.is_available():
        return None
    library = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
    try:
        return ctypes.CDLL(str(library)).mkl_serv_set_num_threads
    except (OSError, AttributeError):  # another platform's name, or MKL linked another way
        return None
