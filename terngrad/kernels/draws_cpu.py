"""The counter-based random draws of stochastic rounding, in numba (those of
:mod:`terngrad.quantize.random`: splitmix64, two 24-bit draws a hash).

* :func:`_fill_draws` — a run of one stream's draws into a buffer: what the rounding kernels
  (:mod:`~terngrad.kernels.encode_cpu`, :mod:`~terngrad.kernels.levels_cpu`) hash a piece at a
  time.
* :func:`uniform_into` — every draw of a flat gradient, for quantizers rounded by the torch
  reference.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange, uint64

from terngrad.kernels.compile_cpu import _OPTS, kernel

_GOLDEN = uint64(0x9E3779B97F4A7C15)
_MIX1 = uint64(0xBF58476D1CE4E5B9)
_MIX2 = uint64(0x94D049BB133111EB)
_TWO_M24 = np.float32(2.0**-24)
_FIELD = uint64(0xFFFFFF)


@njit(inline="always", **_OPTS)
def _finish(z):
    """splitmix64's output for its state ``z`` (see :mod:`terngrad.quantize.random`)."""
    z = (z ^ (z >> uint64(30))) * _MIX1
    z = (z ^ (z >> uint64(27))) * _MIX2
    return z ^ (z >> uint64(31))


@njit(inline="always", **_OPTS)
def _mix(key, pair):
    """splitmix64's output ``pair`` of the stream ``key``: its state ``key + (pair + 1) G``."""
    return _finish(key + (pair + uint64(1)) * _GOLDEN)


@njit(inline="always", **_OPTS)
def _draw(field):
    """``field / 2**24`` in float32 (a 24-bit field: exact through int32, which vectorizes)."""
    return np.float32(np.int32(field)) * _TWO_M24


@njit(**_OPTS)
def _fill_draws(key, first, out):
    """Draws ``first .. first + out.size - 1`` of the stream ``key`` into ``out`` (float32):
    one hash per pair of draws (:mod:`terngrad.quantize.random`). The state of pair ``p + 1``
    is that of pair ``p`` plus ``G``: an addition per pair in place of a 64-bit multiply
    (which AVX2 does in three 32-bit ones), the loop's cost cut by about 40% here."""
    n = out.size
    if n == 0:
        return
    lead = 0
    if first & uint64(1):  # an odd first draw: the second field of its pair
        out[0] = _draw((_mix(key, first >> uint64(1)) >> uint64(16)) & _FIELD)
        lead = 1
    o = out[lead:]
    pair0 = (first + uint64(lead)) >> uint64(1)
    pairs = o.size // 2
    state = key + (pair0 + uint64(1)) * _GOLDEN
    for p in range(pairs):
        z = _finish(state)
        state += _GOLDEN
        o[2 * p] = _draw(z >> uint64(40))
        o[2 * p + 1] = _draw((z >> uint64(16)) & _FIELD)
    if o.size % 2:
        o[o.size - 1] = _draw(_mix(key, pair0 + uint64(pairs)) >> uint64(40))


@kernel()
def uniform_into(sstarts, keys, chunk, out):
    """Every draw of a flat gradient of segments ``sstarts`` into ``out`` (float32)."""
    n = out.size
    for c in prange((n + chunk - 1) // chunk):
        a = c * chunk
        e = min(a + chunk, n)
        s = np.searchsorted(sstarts, a, side="right") - 1
        i = a
        while i < e:
            while sstarts[s + 1] <= i:
                s += 1
            stop = min(e, sstarts[s + 1])
            _fill_draws(keys[s], uint64(i - sstarts[s]), out[i:stop])
            i = stop
