"""Fused CPU kernels (numba) for the quantizers that choose their own levels per bucket
(:mod:`terngrad.quantize.levels`): Linear, ORQ, BinGrad-b, BinGrad-pb and scaled sign. Each
bucket's fit (its levels): :mod:`terngrad.kernels.level_fit_cpu`.

* :func:`round_pack` — clamp to ``[b_1, b_L]``, unbiased random rounding onto the bucket's
  levels (the draws of :mod:`terngrad.quantize.random`) or nearest rounding at the midpoints,
  and packing, in one pass.
* :func:`decode_levels` — unpack and look each digit's level up, into an output buffer.

Compiling and chunking (:mod:`terngrad.kernels.compile_cpu`), packing
(:mod:`~terngrad.kernels.packing_cpu`) and the draws (:mod:`~terngrad.kernels.draws_cpu`) are
those of the grid kernels; results are a function of the element (or bucket) index only, the
same for any thread count.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange, uint64

from terngrad.kernels.compile_cpu import _OPTS, _runs, kernel
from terngrad.kernels.draws_cpu import _fill_draws
from terngrad.kernels.level_fit_cpu import _search
from terngrad.kernels.packing_cpu import _chunk_bytes, _pack, _unpack

# --------------------------------------------------------------------------- rounding


@njit(inline="always", **_OPTS)
def _count_le(values, y):
    """How many of the sorted ``values`` are ``<= y`` (``searchsorted(..., right=True)``)."""
    n = values.size
    if n <= 16:  # a branch-free count
        count = 0
        for j in range(n):
            count += values[j] <= y
        return count
    return _search(values, y, True)


@njit(inline="always", **_OPTS)
def _stochastic_digit(g, lv, u):
    """``LevelQuantizer._round_rows``, stochastic: clamp ``g`` to ``[b_1, b_L]``; in its cell
    ``[b_i, b_{i+1}]`` round up with probability ``(y - b_i) / (b_{i+1} - b_i)`` (float64)."""
    n = lv.size
    y = max(min(g, lv[n - 1]), lv[0])
    idx = min(max(_count_le(lv, y) - 1, 0), n - 2)
    lo = np.float64(lv[idx])
    width = np.float64(lv[idx + 1]) - lo
    p = (np.float64(y) - lo) / width if width > 0 else 0.0
    return np.uint16(idx + (np.float64(u) < p))


@kernel()
def round_pack(
    x, bstarts, levels, mids, stochastic, sstarts, keys, uniform, kind, param, k, w, chunk, out
):
    """The digits of ``x`` on each bucket's ``levels`` (rows, sorted), packed into ``out``:
    random rounding with element ``i``'s draw from ``keys`` (one stream per segment of
    ``sstarts``, or ``uniform[i]`` if it is not empty) if ``stochastic``, else the number of the
    bucket's ``mids`` at or below the clamped value (nearest, a tie up)."""
    n = x.size
    nchunks = (n + chunk - 1) // chunk
    nbytes = _chunk_bytes(chunk, kind, param, k, w)
    given = uniform.size > 0
    top = levels.shape[1] - 1
    for c in prange(nchunks):
        a = c * chunk
        e = min(a + chunk, n)
        digits = np.empty(e - a, np.uint16)
        drawn = np.empty(e - a if stochastic and not given else 0, np.float32)
        runs = _runs(bstarts, sstarts, a, e)
        for r in range(runs.shape[0]):
            i, stop, b, s = runs[r, 0], runs[r, 1], runs[r, 2], runs[r, 3]
            xs = x[i:stop]
            ds = digits[i - a : stop - a]
            lv = levels[b]
            if not stochastic:
                md = mids[b]
                for j in range(xs.size):
                    ds[j] = np.uint16(_count_le(md, max(min(xs[j], lv[top]), lv[0])))
            elif given:
                us = uniform[i:stop]
                for j in range(xs.size):
                    ds[j] = _stochastic_digit(xs[j], lv, us[j])
            else:
                us = drawn[i - a : stop - a]
                _fill_draws(keys[s], uint64(i - sstarts[s]), us)
                for j in range(xs.size):
                    ds[j] = _stochastic_digit(xs[j], lv, us[j])
        _pack(digits, e - a, out[c * nbytes :], kind, param, k, w)


@kernel()
def decode_levels(payload, n, kind, param, k, w, bstarts, levels, chunk, out):
    """``out[i] = levels[b, d_i]`` for the ``n`` digits of ``payload`` (element ``i`` in
    bucket ``b``); False if the payload is corrupt."""
    nchunks = (n + chunk - 1) // chunk
    nbytes = _chunk_bytes(chunk, kind, param, k, w)
    ok = np.empty(max(nchunks, 1), np.bool_)
    for c in prange(nchunks):
        a = c * chunk
        e = min(a + chunk, n)
        digits = np.empty(e - a, np.uint16)
        ok[c] = _unpack(payload[c * nbytes :], e - a, e == n, kind, param, k, w, digits)
        b = np.searchsorted(bstarts, a, side="right") - 1
        i = a
        while i < e:
            while bstarts[b + 1] <= i:
                b += 1
            stop = min(e, bstarts[b + 1])
            ds = digits[i - a : stop - a]
            os = out[i:stop]
            lv = levels[b]
            for j in range(ds.size):
                os[j] = lv[ds[j]]
            i = stop
    good = True
    for c in range(nchunks):
        good &= ok[c]
    return good
