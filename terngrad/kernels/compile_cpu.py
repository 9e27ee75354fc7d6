"""How the fused CPU kernels (numba) are compiled and cut into tasks.

* ``_OPTS`` — the options of every kernel and helper: numba's on-disk cache (``cache=True``,
  under ``terngrad/kernels/__pycache__``), no GIL, numpy's error model.
* :func:`kernel` — a kernel compiled twice (:class:`Kernel`): in parallel over its chunks, and
  as one serial loop for a caller with one thread — a training rank — which then pays no
  parallel launch (on a thread pool of numba's ``workqueue`` layer, about 0.3 ms a call here,
  more than the work on a small bucket).
* :func:`_runs` and :func:`_all_true` — what a task's loop needs: the runs of its elements
  inside one bucket and one segment, and one success flag per task.

Work is cut into fixed chunks of whole packing words and run in parallel over chunks; every
result is a function of the element index only, so it is the same for any thread count.
Loops run over zero-based views with a ``range(n)`` index: numba then knows every index is
non-negative, drops its negative-index wrap-around check, and LLVM vectorizes the loop (an
offset index such as ``x[lo + j]`` made the same loops about eight times slower).
numba's cache checks only the source file of the function it caches: a kernel built over a
helper of another module (:mod:`~terngrad.kernels.packing_cpu`,
:mod:`~terngrad.kernels.draws_cpu`) is not rebuilt when only that module changes; clear
``terngrad/kernels/__pycache__`` after editing one.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numba import njit

_OPTS = {"cache": True, "nogil": True, "error_model": "numpy"}


@dataclass(frozen=True)
class Kernel:
    """One kernel compiled twice: ``parallel`` over its chunks (``prange``) and ``serial`` (the
    same source, ``prange`` a plain loop): the same results, as every result is a function of
    the element index only."""

    parallel: Callable
    serial: Callable


def kernel(**options) -> Callable[[Callable], Kernel]:
    """Compile a function with ``prange`` loops both ways (:class:`Kernel`). The serial one is a
    copy under its own name, so numba's cache keeps the two apart."""

    def compile_both(fn: Callable) -> Kernel:
        twin = types.FunctionType(
            fn.__code__, fn.__globals__, fn.__name__ + "_serial", fn.__defaults__, fn.__closure__
        )
        twin.__qualname__ = fn.__qualname__ + "_serial"
        twin.__doc__ = fn.__doc__
        return Kernel(
            njit(parallel=True, **options, **_OPTS)(fn),
            njit(parallel=False, **options, **_OPTS)(twin),
        )

    return compile_both


@njit(**_OPTS)
def _runs(bstarts, sstarts, a, e):
    """The runs of elements ``[a, e)`` inside one bucket (of ``bstarts``) and one segment (of
    ``sstarts``): rows ``(start, stop, bucket, segment)``, in order."""
    b = np.searchsorted(bstarts, a, side="right") - 1
    s = np.searchsorted(sstarts, a, side="right") - 1
    most = np.searchsorted(bstarts, e) - b + np.searchsorted(sstarts, e) - s
    runs = np.empty((max(most, 1), 4), np.int64)
    count = 0
    i = a
    while i < e:
        while bstarts[b + 1] <= i:
            b += 1
        while sstarts[s + 1] <= i:
            s += 1
        stop = min(e, bstarts[b + 1], sstarts[s + 1])
        runs[count, 0] = i
        runs[count, 1] = stop
        runs[count, 2] = b
        runs[count, 3] = s
        count += 1
        i = stop
    return runs[:count]


@njit(**_OPTS)
def _all_true(count):
    """One ``True`` flag per task (a loop: ``np.ones`` would be a parallel region)."""
    flags = np.empty(max(count, 1), np.bool_)
    for c in range(flags.size):
        flags[c] = True
    return flags
