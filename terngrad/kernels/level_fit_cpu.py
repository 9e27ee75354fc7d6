"""Fused CPU kernel (numba) of the level quantizers' fit (:mod:`terngrad.quantize.levels`):
every bucket's scales for Linear, ORQ, BinGrad-b, BinGrad-pb and scaled sign, in parallel over
buckets, by the reference's algorithm in the reference's float64 operations and order (sums left
to right, as ``quantize.levels.ordered_sum``; first index on ties, as ``argmin``/``argmax``), so
the float32 scales are the reference's bits. ORQ's level search runs over the values of the two
cells it places a level between (a sorted bucket's values inside ``[lo, hi]`` are a contiguous
run; the reference's masked zeros outside it add nothing to its prefix sums), where the
reference sweeps the whole bucket.

Rounding onto the fitted levels and decoding: :mod:`terngrad.kernels.levels_cpu`.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from terngrad.kernels.compile_cpu import _OPTS, kernel
from terngrad.quantize.bingrad import PB_STARTS

LINEAR, ORQ, BINGRAD_B, BINGRAD_PB, SIGNSGD = 0, 1, 2, 3, 4


# --------------------------------------------------------------------------- fits


@njit(inline="always", **_OPTS)
def _ordered_sum(x):
    s = 0.0
    for i in range(x.size):
        s += x[i]
    return s


@njit(**_OPTS)
def _sorted(bits):
    """The float32 values whose bit patterns are ``bits`` (uint32), sorted ascending, as
    float64: a least-significant-byte-first radix sort of the patterns mapped to unsigned keys
    that order like the values (sign bit set: all bits flipped; clear: the sign bit set), four
    passes of 8 bits, a pass skipped where every key shares its byte. Converting a sorted
    float32 array is the same as sorting the converted values (exact and monotone); ``-0.0``
    sorts below ``+0.0``, and the caller makes both ``+0.0``."""
    n = bits.size
    keys = np.empty(n, np.uint32)
    counts = np.zeros((4, 256), np.int64)
    for i in range(n):
        b = np.uint32(bits[i])
        key = b ^ np.uint32(0xFFFFFFFF) if b >> np.uint32(31) else b | np.uint32(0x80000000)
        keys[i] = key
        for p in range(4):
            counts[p, (key >> np.uint32(8 * p)) & np.uint32(255)] += 1
    spare = np.empty(n, np.uint32)
    for p in range(4):
        shift = np.uint32(8 * p)
        if counts[p, (keys[0] >> shift) & np.uint32(255)] == n:
            continue
        offsets = np.empty(256, np.int64)
        total = 0
        for d in range(256):
            offsets[d] = total
            total += counts[p, d]
        for i in range(n):
            d = (keys[i] >> shift) & np.uint32(255)
            spare[offsets[d]] = keys[i]
            offsets[d] += 1
        keys, spare = spare, keys
    out = np.empty(n, np.float64)
    values = keys.view(np.float32)
    for i in range(n):
        key = keys[i]
        keys[i] = (
            key & np.uint32(0x7FFFFFFF) if key >> np.uint32(31) else key ^ np.uint32(0xFFFFFFFF)
        )
        out[i] = np.float64(values[i])
    return out


@njit(**_OPTS)
def _centred(xs, mean):
    """``xs - mean + 0.0`` (sorted if ``xs`` is: rounding is monotone)."""
    out = np.empty(xs.size)
    for i in range(xs.size):
        out[i] = (xs[i] - mean) + 0.0
    return out


@njit(**_OPTS)
def _centred_sorted(x, bits):
    """``quantize.bingrad._centred_sorted`` of one bucket (``x`` float32, ``bits`` its
    patterns): its values minus their mean (float64), sorted; the mean."""
    mean = 0.0
    for i in range(x.size):
        mean += np.float64(x[i])
    mean /= x.size
    return _centred(_sorted(bits), mean), mean


@njit(inline="always", **_OPTS)
def _search(xs, v, right):
    """``np.searchsorted(xs, v, side)``: the values ``< v`` (``<= v`` if ``right``)."""
    lo, hi = 0, xs.size
    while lo < hi:
        mid = (lo + hi) >> 1
        if xs[mid] < v or (right and xs[mid] == v):
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(**_OPTS)
def _best_level(xs, lo, hi, left1, left2, right1, right2):
    """``quantize.orq.best_level`` for one sorted row: the value ``b`` in ``[lo, hi]``
    minimising the variance of rounding the row's values in ``[lo, hi]`` onto ``{lo, b, hi}``
    (``left1`` .. ``right2``: scratch of the row's length). The prefix sums from the left and
    from the right are two independent sequential chains, run in one loop so that each hides
    the other's latency; the scores then vectorize."""
    i0 = _search(xs, lo, False)
    m = _search(xs, hi, True) - i0
    cells = xs[i0 : i0 + m]
    a1 = 0.0
    a2 = 0.0
    z1 = 0.0
    z2 = 0.0
    for t in range(m):
        a = cells[t] - lo
        a1 += a
        a2 += a * a
        left1[t] = a1 - a
        left2[t] = a2 - a * a
        r = m - 1 - t
        z = hi - cells[r]
        z1 += z
        z2 += z * z
        right1[r] = z1 - z
        right2[r] = z2 - z * z
    best = 0
    best_v = np.inf
    for t in range(m):
        a = cells[t] - lo
        z = hi - cells[t]
        v = a * left1[t] - left2[t] + z * right1[t] - right2[t]
        if v < best_v:
            best, best_v = t, v
    return cells[best]


@njit(**_OPTS)
def _orq_levels(bits, levels, sweeps, out):
    """``quantize.orq.optimal_levels`` for one bucket (its float32 bit patterns), as float32
    into ``out``; False (nothing written) if the bucket holds a NaN or an Inf."""
    xs = _centred(_sorted(bits), 0.0)  # + 0.0: -0.0 made +0.0
    n = xs.size
    if not (np.isfinite(xs[0]) and np.isfinite(xs[n - 1])):  # NaN and Inf sort to the ends
        return False
    left1 = np.empty(n)
    left2 = np.empty(n)
    right1 = np.empty(n)
    right2 = np.empty(n)
    b = np.empty(levels)
    b[0] = xs[0]
    b[levels - 1] = xs[n - 1]
    # the neighbours each level was last placed between: placing it again between the same
    # two gives the same value (best_level is a function of them), so it is not recomputed
    below = np.full(levels, np.nan)
    above = np.full(levels, np.nan)
    pending = [(0, levels - 1)]  # greedy recursive placement
    while len(pending):
        i, j = pending.pop()
        if j - i < 2:
            continue
        mid = (i + j) // 2
        b[mid] = _best_level(xs, b[i], b[j], left1, left2, right1, right2)
        below[mid], above[mid] = b[i], b[j]
        pending.append((i, mid))
        pending.append((mid, j))
    for _ in range(sweeps):  # coordinate descent until no level moves
        moved = False
        for j in range(1, levels - 1):
            if b[j - 1] == below[j] and b[j + 1] == above[j]:
                continue
            new = _best_level(xs, b[j - 1], b[j + 1], left1, left2, right1, right2)
            below[j], above[j] = b[j - 1], b[j + 1]
            moved |= new != b[j]
            b[j] = new
        if not moved:
            break
    for j in range(levels):
        out[j] = np.float32(b[j])
    return True


@njit(**_OPTS)
def _two_means(xs, mean):
    """``quantize.bingrad.two_means`` given a bucket's centred sorted values ``xs`` and their
    ``mean``: the two cluster means, ascending."""
    n = xs.size
    if n == 1:
        return xs[0] + mean, xs[0] + mean
    sums = np.empty(n)
    c = 0.0
    for i in range(n):
        c += xs[i]
        sums[i] = c
    total = sums[n - 1]
    best, best_score = 0, -np.inf
    for i in range(n - 1):
        k = np.float64(i + 1)
        prefix = sums[i]
        rest = total - prefix
        score = (prefix * prefix) / k + (rest * rest) / (np.float64(n) - k)
        if score > best_score or i == 0:
            best, best_score = i, score
    kk = np.float64(best + 1)
    left = sums[best]
    return left / kk + mean, (total - left) / (np.float64(n) - kk) + mean


@njit(**_OPTS)
def _prefix_sums(xs):
    """``quantize.bingrad._PrefixSums``: ``p1``, ``p2`` (n + 1 each, a leading 0) and
    ``upper`` (the next value, ``inf`` after the last)."""
    n = xs.size
    p1 = np.empty(n + 1)
    p2 = np.empty(n + 1)
    p1[0] = p2[0] = 0.0
    c1 = 0.0
    c2 = 0.0
    for i in range(n):
        c1 += xs[i]
        c2 += xs[i] * xs[i]
        p1[i + 1] = c1
        p2[i + 1] = c2
    upper = np.empty(n)
    for i in range(n - 1):
        upper[i] = xs[i + 1]
    upper[n - 1] = np.inf
    return p1, p2, upper


@njit(inline="always", **_OPTS)
def _objective(p1, p2, n, b1, b2, i1, i2):
    """``_PrefixSums.objective`` for one pair: ``f(b_1, b_2)`` given the counts ``i1``, ``i2``."""
    s1 = p1[i1]
    s2 = p1[i2]
    q1 = p2[i1]
    q2 = p2[i2]
    n1 = np.float64(i1)
    n2 = np.float64(i2)
    left = n1 * b1 * b1 - 2.0 * b1 * s1 + q1
    middle = -(q2 - q1) + (b1 + b2) * (s2 - s1) - b1 * b2 * (n2 - n1)
    right = (p2[n] - q2) - 2.0 * b2 * (p1[n] - s2) + (np.float64(n) - n2) * b2 * b2
    return left + middle + right


@njit(inline="always", **_OPTS)
def _piece(p1, upper, k, i2, b2):
    """``_PrefixSums._piece``: piece ``k``'s stationary point, right end and slope there."""
    in_cell = np.float64(max(i2 - k, 0))
    s_k = p1[k]
    r = in_cell * b2 - (p1[i2] - s_k) * (1.0 if in_cell > 0 else 0.0)
    kf = np.float64(k)
    end = min(upper[k - 1], b2)
    return (s_k + r / 2.0) / kf, end, 2.0 * (kf * end - s_k) - r


@njit(**_OPTS)
def _best_low(xs, p1, upper, b2):
    """``_PrefixSums.best_low`` for one row: the ``b_1 <= b_2`` minimising ``f(., b_2)``, the
    stationary point of the first piece whose right-end slope is non-negative (bisection)."""
    i2 = _search(xs, b2, True)
    lo, hi = 1, max(i2, 1)
    while lo < hi:
        mid = (lo + hi) // 2
        if _piece(p1, upper, mid, i2, b2)[2] >= 0:
            hi = mid
        else:
            lo = mid + 1
    stationary, end, _ = _piece(p1, upper, lo, i2, b2)
    return min(max(stationary, xs[lo - 1]), end)


@njit(**_OPTS)
def _pb_levels(row, bits, sweeps, out):
    """``quantize.bingrad.partially_biased_levels`` for one bucket, as float32 into ``out``;
    False (nothing written) if the bucket holds a NaN or an Inf."""
    xs, mean = _centred_sorted(row, bits)
    if not np.isfinite(mean):
        return False
    n = xs.size
    p1, p2, upper = _prefix_sums(xs)
    mirrored = -xs[::-1]
    m1, _, mupper = _prefix_sums(mirrored)
    again = _ordered_sum(xs) / n  # the reference centres and sorts xs again: no sort needed
    starts = [_two_means(_centred(xs, again), again)]
    last = -1
    for q in PB_STARTS:  # ascending: distinct indices in order, as the reference's sorted set
        i = int(q * n)
        if i != last:
            starts.append((xs[i], xs[n - 1 - i]))
            last = i
    best1, best2, best_f = 0.0, 0.0, np.inf
    for s in range(len(starts)):
        b1, b2 = starts[s]
        for _ in range(sweeps):
            new1 = _best_low(xs, p1, upper, b2)
            new2 = -_best_low(mirrored, m1, mupper, -new1)
            same_b2 = new2 == b2
            b1, b2 = new1, new2
            if same_b2:  # the next round would find these again (each level is a function
                break  # of the other) and stop: the reference's result, one round sooner
        f = _objective(p1, p2, n, b1, b2, _search(xs, b1, False), _search(xs, b2, True))
        if s == 0 or f < best_f:
            best1, best2, best_f = b1, b2, f
    out[0] = np.float32(best1 + mean)
    out[1] = np.float32(best2 + mean)
    return True


@kernel()
def fit(x, bits, bstarts, method, levels, sweeps, out):
    """The scales of every bucket of ``x`` (float32, ``bits`` its patterns as uint32;
    ``bstarts`` the bucket offsets then numel) into ``out`` (float32, one row per bucket) for
    ``method`` (``LINEAR`` .. ``SIGNSGD``). Returns False if some value is NaN or Inf, found on
    the way (no pass of its own): a NaN or Inf makes a float64 sum non-finite, a sort puts
    them at the ends, and ``v * 0`` is NaN for them alone."""
    nb = bstarts.size - 1
    finite = np.empty(max(nb, 1), np.bool_)
    for b in prange(nb):
        row = x[bstarts[b] : bstarts[b + 1]]
        pattern = bits[bstarts[b] : bstarts[b + 1]]
        o = out[b]
        if method == LINEAR:  # min and max, +0.0 for -0.0
            lo = row[0]
            hi = row[0]
            probe = np.float32(0.0)
            for i in range(row.size):
                lo = min(lo, row[i])
                hi = max(hi, row[i])
                probe += row[i] * np.float32(0.0)
            o[0] = lo + np.float32(0.0)
            o[1] = hi + np.float32(0.0)
            finite[b] = probe == 0
        elif method == SIGNSGD:  # the mean |g|, in float64
            s = 0.0
            for i in range(row.size):
                s += abs(np.float64(row[i]))
            o[0] = np.float32(s / row.size)
            finite[b] = np.isfinite(s)
        elif method == ORQ:
            finite[b] = _orq_levels(pattern, levels, sweeps, o)
        elif method == BINGRAD_B:
            xs, mean = _centred_sorted(row, pattern)
            m1, m2 = _two_means(xs, mean)
            o[0] = np.float32(m1)
            o[1] = np.float32(m2)
            finite[b] = np.isfinite(mean)
        else:
            finite[b] = _pb_levels(row, pattern, sweeps, o)
    ok = True
    for b in range(nb):
        ok &= finite[b]
    return ok
