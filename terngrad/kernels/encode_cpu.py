"""The fused CPU kernels (numba) of a shared-grid quantizer's encoding (TernGrad, QSGD):
its two passes over the gradient.

* :func:`bucket_moments` — per bucket, in one pass: the float64 sums that give the mean and
  standard deviation (shifted by the bucket's first element against cancellation), the sum of
  squares and ``max |g|``. TernGrad's local scale follows without a second pass:
  ``max_k |clip(g_k)| = min(max_k |g_k|, c sigma)``.
* :func:`grid_pack` — clip, stochastic rounding on the grid ``s j / m`` with counter-based
  draws (:mod:`terngrad.quantize.random`), and packing, for any range of the flat gradient.

Float arithmetic follows the reference (:mod:`terngrad.quantize.grid`) operation for
operation, in float32, so given the same scales the bytes are identical.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange, uint64

from terngrad.kernels.compile_cpu import _OPTS, _runs, kernel
from terngrad.kernels.draws_cpu import _fill_draws
from terngrad.kernels.packing_cpu import _chunk_bytes, _pack


@njit(inline="always", **_OPTS)
def _piece_moments(x, bits, starts, counts, owner, chunk, p, partial, top):
    """The sums of piece ``p`` (a chunk of bucket ``owner[p]``) into ``partial[p]``, ``top[p]``."""
    b = owner[p]
    lo = starts[b] + (p - counts[b]) * chunk
    hi = min(lo + chunk, starts[b + 1])
    if lo >= hi:
        partial[p, 0] = partial[p, 1] = partial[p, 2] = 0.0
        top[p] = 0
        return
    shift = np.float64(x[starts[b]])
    xs = x[lo:hi]
    bs = bits[lo:hi]
    s1 = 0.0
    s2 = 0.0
    sq = 0.0
    mx = np.int32(0)
    for i in range(xs.size):
        v = np.float64(xs[i])
        d = v - shift
        s1 += d
        s2 += d * d
        sq += v * v
        mx = max(mx, bs[i] & np.int32(0x7FFFFFFF))
    partial[p, 0] = s1
    partial[p, 1] = s2
    partial[p, 2] = sq
    top[p] = mx


@kernel(fastmath={"reassoc"})
def bucket_moments(x, bits, starts, chunk):
    """``(n_buckets, 5)`` float64 per bucket: count, ``sum(x - K)``, ``sum((x - K)**2)``,
    ``sum(x**2)``, ``max |x|`` (``K`` the bucket's first element; ``starts`` the bucket offsets
    then numel; ``bits`` is ``x`` viewed as int32). The maximum is taken over the bit patterns
    with the sign cleared, which orders like the magnitudes and puts NaN above Inf, so a NaN
    comes out as NaN. Sums may be reassociated (vectorized); they are added across chunks in
    chunk order, so the result does not depend on the thread count."""
    # no np.zeros/np.ones in these parallel functions: each becomes a parallel region of its
    # own, about 70 microseconds apiece on the workqueue layer (most of a small bucket's cost)
    nb = starts.size - 1
    counts = np.empty(nb + 1, np.int64)
    counts[0] = 0
    for b in range(nb):
        counts[b + 1] = counts[b] + max((starts[b + 1] - starts[b] + chunk - 1) // chunk, 1)
    npieces = counts[nb]
    owner = np.empty(npieces, np.int64)
    for b in range(nb):
        for p in range(counts[b], counts[b + 1]):  # a slice assignment here would become a
            owner[p] = b  # parallel region per bucket: 80 us each on the workqueue layer
    # tasks of consecutive pieces holding about ``chunk`` elements each, so that many small
    # buckets (QSGD's 512) do not make many tiny tasks
    first_piece = np.empty(npieces + 1, np.int64)
    ntasks = 0
    filled = chunk
    for p in range(npieces):
        if filled >= chunk:
            first_piece[ntasks] = p
            ntasks += 1
            filled = 0
        b = owner[p]
        filled += min(chunk, starts[b + 1] - starts[b] - (p - counts[b]) * chunk)
    first_piece[ntasks] = npieces
    partial = np.empty((npieces, 3), np.float64)
    top = np.empty(npieces, np.int32)
    for task in prange(ntasks):
        for p in range(first_piece[task], first_piece[task + 1]):
            _piece_moments(x, bits, starts, counts, owner, chunk, p, partial, top)
    out = np.empty((nb, 5), np.float64)
    tops = np.empty(nb, np.int32)
    for b in range(nb):
        for i in range(5):
            out[b, i] = 0.0
        tops[b] = 0
    for p in range(npieces):
        b = owner[p]
        out[b, 1] += partial[p, 0]
        out[b, 2] += partial[p, 1]
        out[b, 3] += partial[p, 2]
        tops[b] = max(tops[b], top[p])
    maxabs = tops.view(np.float32)
    for b in range(nb):
        out[b, 4] = maxabs[b]
    for b in range(nb):
        out[b, 0] = starts[b + 1] - starts[b]
    return out


@njit(inline="always", **_OPTS)
def _grid_digit(g, bound, scale, mf, u):
    """``m + sign(y) (floor(t) + [u < t - floor(t)])`` with ``y = sign(g) min(|g|, bound)``
    and ``t = min(|y| m / scale, m)``, in the reference's float32 operations and order; ``m``
    where ``t`` is NaN (as the integer arithmetic it replaces: ``floor(NaN)`` converts to
    ``-2**31``, which vanishes modulo ``2**16``). ``floor(t)``, the step and the digit are
    integers below ``2**16`` carried in float32 (exact), so the loop runs in 32-bit lanes: 8
    a vector on AVX2, against 4 for the int64 that numba's integer arithmetic widens to."""
    t = min((min(abs(g), bound) * mf) / scale, mf)
    whole = np.float32(np.int32(t))  # floor(t), t >= 0 (np.floor is a libm call: no vectorizing)
    step = whole + (np.float32(1) if u < t - whole else np.float32(0))
    digit = mf + step if g > 0 else mf - step
    return np.uint16(np.int32(digit)) if t == t else np.uint16(mf)


#: draws hashed at a time in ``grid_pack``: 8 KB, in L1 when they are rounded
_DRAWS_PIECE = 2048


@kernel()
def grid_pack(
    x, lo, hi, bstarts, bound, scale, m, sstarts, keys, uniform, kind, param, k, w, chunk, out
):
    """The digits of ``x[lo:hi]`` on the grid (see :func:`_grid_digit`; ``t = 0`` where the
    scale is 0), packed into ``out``. ``u`` is the element's draw from ``keys`` (one stream per
    segment of ``sstarts``), or ``uniform[i]`` if ``uniform`` is not empty (the tests' way of
    giving the reference and the kernel the same draws)."""
    nchunks = (hi - lo + chunk - 1) // chunk
    nbytes = _chunk_bytes(chunk, kind, param, k, w)
    mf = np.float32(m)
    given = uniform.size > 0
    for c in prange(nchunks):
        a = lo + c * chunk
        e = min(a + chunk, hi)
        digits = np.empty(e - a, np.uint16)
        drawn = np.empty(0 if given else _DRAWS_PIECE, np.float32)
        runs = _runs(bstarts, sstarts, a, e)
        for r in range(runs.shape[0]):
            i, stop, b, s = runs[r, 0], runs[r, 1], runs[r, 2], runs[r, 3]
            xs = x[i:stop]
            ds = digits[i - a : stop - a]
            bnd = bound[b]
            sc = scale[b]
            if not sc > 0:  # as the reference: t = 0 unless s > 0 (NaN included)
                for j in range(ds.size):  # a loop, not ds[:] = m: no nested parallel region
                    ds[j] = m
            elif given:
                us = uniform[i:stop]
                for j in range(xs.size):
                    ds[j] = _grid_digit(xs[j], bnd, sc, mf, us[j])
            else:  # draws hashed a piece at a time, rounded while still in L1
                for p in range(i, stop, _DRAWS_PIECE):
                    q = min(p + _DRAWS_PIECE, stop)
                    us = drawn[: q - p]
                    _fill_draws(keys[s], uint64(p - sstarts[s]), us)
                    xp = x[p:q]
                    dp = digits[p - a : q - a]
                    for j in range(xp.size):
                        dp[j] = _grid_digit(xp[j], bnd, sc, mf, us[j])
        _pack(digits, e - a, out[c * nbytes :], kind, param, k, w)
