"""Fused CPU kernels (numba): one pass over the gradient for each of the exchange's operations.

* :func:`bucket_moments` — per bucket, in one pass: the float64 sums that give the mean and
  standard deviation (shifted by the bucket's first element against cancellation), the sum of
  squares and ``max |g|``. TernGrad's local scale follows without a second pass:
  ``max_k |clip(g_k)| = min(max_k |g_k|, c sigma)``.
* :func:`grid_pack` — clip, stochastic rounding on the grid ``s j / m`` with counter-based
  draws (:mod:`terngrad.kernels.random`), and packing, for any range of the flat gradient.
* :func:`sum_packed` — the shard owner's work: unpack N payloads, add, repack in base 2Nm + 1.
* :func:`decode_packed` — unpack ``s (d - offset) / divisor`` straight into an output buffer
  (the DDP bucket).
* :func:`uniform_into` — the draws themselves, for quantizers rounded by the torch reference.

Work is cut into fixed chunks of whole packing words and run in parallel over chunks; every
result is a function of the element index only, so it is the same for any thread count. Float
arithmetic follows the reference (:mod:`terngrad.quantize.grid`) operation for operation, in
float32, so given the same scales the bytes are identical. Packed layouts are those of
:mod:`terngrad.wire.pack`: ``kind`` 0 is base-B with ``k`` digits per ``w``-byte word, 1 is
an n-bit stream.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange, uint64

BASE, NBIT = 0, 1

_GOLDEN = uint64(0x9E3779B97F4A7C15)
_MIX1 = uint64(0xBF58476D1CE4E5B9)
_MIX2 = uint64(0x94D049BB133111EB)
_TWO_M24 = np.float32(2.0**-24)

_OPTS = {"cache": True, "nogil": True, "error_model": "numpy"}


@njit(inline="always", **_OPTS)
def _draw(key, index):
    """Draw ``index`` of the stream ``key`` as float32 (see :mod:`terngrad.kernels.random`)."""
    z = key + (uint64(index) + uint64(1)) * _GOLDEN
    z = (z ^ (z >> uint64(30))) * _MIX1
    z = (z ^ (z >> uint64(27))) * _MIX2
    z = z ^ (z >> uint64(31))
    return np.float32(z >> uint64(40)) * _TWO_M24


# Loops run over zero-based views with a ``range(n)`` index: numba then knows every index is
# non-negative, drops its negative-index wrap-around check, and LLVM vectorizes the loop (an
# offset index such as ``x[lo + j]`` made the same loops about eight times slower).


@njit(**_OPTS)
def _pack(digits, n, out, kind, param, k, w):
    """Pack ``digits[:n]`` into ``out`` (a view starting at the chunk's first byte); ``n`` is a
    whole number of words except in the message's last chunk."""
    if kind == BASE:
        start = 0
        if k == 5 and w == 1 and param == 3:  # base 3, the common case: 5 trits per byte
            start = n // 5
            d = digits[: 5 * start].reshape(start, 5)
            for j in range(start):
                out[j] = d[j, 0] + 3 * (d[j, 1] + 3 * (d[j, 2] + 3 * (d[j, 3] + 3 * d[j, 4])))
        base = uint64(param)
        full = n // k
        if start < full:  # whole words, loops interchanged so that the inner one vectorizes
            d = digits[start * k : full * k].reshape(full - start, k)
            o = out[start * w : full * w].reshape(full - start, w)
            words = np.zeros(full - start, np.uint64)
            for t in range(k - 1, -1, -1):
                for j in range(words.size):
                    words[j] = words[j] * base + uint64(d[j, t])
            for b in range(w):
                for j in range(words.size):
                    o[j, b] = np.uint8((words[j] >> uint64(8 * b)) & uint64(255))
            start = full
        for j in range(start, (n + k - 1) // k):  # the message's last, partial word
            word = uint64(0)
            for t in range(k - 1, -1, -1):
                i = j * k + t
                word = word * base + (uint64(digits[i]) if i < n else uint64(0))
            for b in range(w):
                out[j * w + b] = np.uint8((word >> uint64(8 * b)) & uint64(255))
        return
    bits = param
    start = 0
    if bits == 2:
        start = n // 4
        d = digits[: 4 * start].reshape(start, 4)
        for j in range(start):
            out[j] = d[j, 0] | (d[j, 1] << 2) | (d[j, 2] << 4) | (d[j, 3] << 6)
    rest = digits[4 * start : n] if bits == 2 else digits[:n]
    tail = out[start:]
    acc = uint64(0)
    nb = 0
    o = 0
    for i in range(rest.size):
        acc |= uint64(rest[i]) << uint64(nb)
        nb += bits
        while nb >= 8:
            tail[o] = np.uint8(acc & uint64(255))
            o += 1
            acc >>= uint64(8)
            nb -= 8
    if nb > 0:
        tail[o] = np.uint8(acc & uint64(255))


@njit(**_OPTS)
def _digits_of(values, digits, first, count, base):
    """Digits ``first .. first + count - 1`` (least significant first) of the float64
    ``values`` (integers below 2**48) into ``digits[:, first:]``; ``values`` end as the
    quotients. A reciprocal estimate, corrected by one step, replaces the division: exact,
    since every quantity stays an integer below 2**53."""
    fb = np.float64(base)
    inv = 1.0 / fb
    for t in range(first, first + count):
        for j in range(values.size):
            v = values[j]
            q = np.floor(v * inv)
            r = v - q * fb
            q += np.float64(r >= fb) - np.float64(r < 0)
            r = v - q * fb
            digits[j, t] = np.uint16(r)
            values[j] = q


@njit(**_OPTS)
def _unpack_words(words_bytes, digits, base, limit):
    """Whole words (rows of ``words_bytes``, little-endian) to rows of ``digits``; False if a
    word exceeds ``limit - 1``."""
    nw, w = words_bytes.shape
    k = digits.shape[1]
    words = np.zeros(nw, np.uint64)
    for b in range(w - 1, -1, -1):
        for j in range(nw):
            words[j] = (words[j] << uint64(8)) | uint64(words_bytes[j, b])
    bad = 0
    for j in range(nw):
        bad |= words[j] >= limit
    if w <= 4:  # below 2**32: float64 digit extraction at once
        values = np.empty(nw, np.float64)
        for j in range(nw):
            values[j] = np.float64(words[j])
        _digits_of(values, digits, 0, k, base)
    else:  # split each word at base**h so both parts stay below 2**53
        h = k // 2
        split = uint64(1)
        for _ in range(h):
            split *= uint64(base)
        low = np.empty(nw, np.float64)
        high = np.empty(nw, np.float64)
        for j in range(nw):
            q = words[j] // split
            low[j] = np.float64(words[j] - q * split)
            high[j] = np.float64(q)
        _digits_of(low, digits, 0, h, base)
        _digits_of(high, digits, h, k - h, base)
    return bad == 0


@njit(**_OPTS)
def _unpack(payload, n, last, kind, param, k, w, digits):
    """Unpack ``n`` digits from ``payload`` (a view at the chunk's first byte) into ``digits``;
    False for a word beyond ``B**k - 1`` or, in the ``last`` chunk, non-zero padding."""
    ok = True
    if kind == BASE:
        start = 0
        if k == 5 and w == 1 and param == 3:
            start = n // 5
            d = digits[: 5 * start].reshape(start, 5)
            bad = 0
            for j in range(start):
                v = payload[j]
                bad |= v >= 243
                d[j, 0] = v % 3
                d[j, 1] = (v // 3) % 3
                d[j, 2] = (v // 9) % 3
                d[j, 3] = (v // 27) % 3
                d[j, 4] = (v // 81) % 3
            ok = bad == 0
        base = uint64(param)
        limit = uint64(1)
        for _ in range(k):
            limit *= base
        full = n // k
        if start < full:
            ok &= _unpack_words(
                payload[start * w : full * w].reshape(full - start, w),
                digits[start * k : full * k].reshape(full - start, k),
                param,
                limit,
            )
            start = full
        for j in range(start, (n + k - 1) // k):  # the message's last, partial word
            word = uint64(0)
            for b in range(w - 1, -1, -1):
                word = (word << uint64(8)) | uint64(payload[j * w + b])
            ok &= word < limit
            for t in range(k):
                i = j * k + t
                d = word % base
                word //= base
                if i < n:
                    digits[i] = d
                elif last:
                    ok &= d == 0
        return ok
    bits = param
    mask = uint64((1 << bits) - 1)
    start = 0
    if bits == 2:
        start = n // 4
        d = digits[: 4 * start].reshape(start, 4)
        for j in range(start):
            v = payload[j]
            d[j, 0] = v & 3
            d[j, 1] = (v >> 2) & 3
            d[j, 2] = (v >> 4) & 3
            d[j, 3] = v >> 6
    rest = digits[4 * start : n] if bits == 2 else digits[:n]
    src = payload[start:]
    acc = uint64(0)
    nb = 0
    o = 0
    for i in range(rest.size):
        while nb < bits:
            acc |= uint64(src[o]) << uint64(nb)
            o += 1
            nb += 8
        rest[i] = acc & mask
        acc >>= uint64(bits)
        nb -= bits
    return not (last and acc != 0)


def _chunk_bytes(chunk, kind, param, k, w):
    return chunk // k * w if kind == BASE else chunk * param // 8


_chunk_bytes = njit(inline="always", **_OPTS)(_chunk_bytes)


@njit(parallel=True, fastmath={"reassoc"}, **_OPTS)
def bucket_moments(x, bits, starts, chunk):
    """``(n_buckets, 5)`` float64 per bucket: count, ``sum(x - K)``, ``sum((x - K)**2)``,
    ``sum(x**2)``, ``max |x|`` (``K`` the bucket's first element; ``starts`` the bucket offsets
    then numel; ``bits`` is ``x`` viewed as int32). The maximum is taken over the bit patterns
    with the sign cleared, which orders like the magnitudes and puts NaN above Inf, so a NaN
    comes out as NaN. Sums may be reassociated (vectorized); they are added across chunks in
    chunk order, so the result does not depend on the thread count."""
    nb = starts.size - 1
    counts = np.zeros(nb + 1, np.int64)
    for b in range(nb):
        counts[b + 1] = counts[b] + max((starts[b + 1] - starts[b] + chunk - 1) // chunk, 1)
    npieces = counts[nb]
    owner = np.empty(npieces, np.int64)
    for b in range(nb):
        owner[counts[b] : counts[b + 1]] = b
    partial = np.zeros((npieces, 3), np.float64)
    top = np.zeros(npieces, np.int32)
    for p in prange(npieces):
        b = owner[p]
        lo = starts[b] + (p - counts[b]) * chunk
        hi = min(lo + chunk, starts[b + 1])
        if lo < hi:
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
    out = np.zeros((nb, 5), np.float64)
    tops = np.zeros(nb, np.int32)
    for p in range(npieces):
        b = owner[p]
        out[b, 1] += partial[p, 0]
        out[b, 2] += partial[p, 1]
        out[b, 3] += partial[p, 2]
        tops[b] = max(tops[b], top[p])
    out[:, 4] = tops.view(np.float32)
    for b in range(nb):
        out[b, 0] = starts[b + 1] - starts[b]
    return out


@njit(inline="always", **_OPTS)
def _grid_digit(g, bound, scale, mf, m, u):
    """``m + sign(y) (floor(t) + [u < t - floor(t)])`` with ``y = sign(g) min(|g|, bound)``
    and ``t = min(|y| m / scale, m)``, in the reference's float32 operations and order."""
    t = min((min(abs(g), bound) * mf) / scale, mf)
    fl = np.floor(t)
    step = np.int32(fl) + np.int32(u < t - fl)
    return np.uint16(m + step if g > 0 else m - step)


@njit(parallel=True, **_OPTS)
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
        b = np.searchsorted(bstarts, a, side="right") - 1
        s = np.searchsorted(sstarts, a, side="right") - 1
        i = a
        while i < e:
            while bstarts[b + 1] <= i:
                b += 1
            while sstarts[s + 1] <= i:
                s += 1
            stop = min(e, bstarts[b + 1], sstarts[s + 1])
            xs = x[i:stop]
            ds = digits[i - a : stop - a]
            bnd = bound[b]
            sc = scale[b]
            if sc <= 0:
                ds[:] = m
            elif given:
                us = uniform[i:stop]
                for j in range(xs.size):
                    ds[j] = _grid_digit(xs[j], bnd, sc, mf, m, us[j])
            else:
                key = keys[s]
                first = uint64(i - sstarts[s])
                for j in range(xs.size):
                    ds[j] = _grid_digit(xs[j], bnd, sc, mf, m, _draw(key, first + uint64(j)))
            i = stop
        _pack(digits, e - a, out[c * nbytes :], kind, param, k, w)


@njit(parallel=True, **_OPTS)
def sum_packed(
    payloads, n, kind_in, param_in, k_in, w_in, kind_out, param_out, k_out, w_out, chunk, out
):
    """Pack ``sum_r digits_r`` of the rows of ``payloads`` (``n`` digits each) into ``out``;
    returns False if some payload is corrupt."""
    nchunks = (n + chunk - 1) // chunk
    in_bytes = _chunk_bytes(chunk, kind_in, param_in, k_in, w_in)
    out_bytes = _chunk_bytes(chunk, kind_out, param_out, k_out, w_out)
    ok = np.ones(max(nchunks, 1), np.bool_)
    for c in prange(nchunks):
        a = c * chunk
        e = min(a + chunk, n)
        total = np.zeros(e - a, np.uint16)
        digits = np.empty(e - a, np.uint16)
        for r in range(payloads.shape[0]):
            row = payloads[r]
            ok[c] &= _unpack(
                row[c * in_bytes :], e - a, e == n, kind_in, param_in, k_in, w_in, digits
            )
            for j in range(total.size):
                total[j] += digits[j]
        _pack(total, e - a, out[c * out_bytes :], kind_out, param_out, k_out, w_out)
    return ok.all()


@njit(parallel=True, **_OPTS)
def decode_packed(payload, n, kind, param, k, w, offset, divisor, lo, bstarts, scale, chunk, out):
    """``out[j] = (float32(d_j - offset) * s_b) / divisor`` for the ``n`` digits of
    ``payload``, element ``j`` standing for flat element ``lo + j`` of bucket ``b``; returns
    False if the payload is corrupt."""
    nchunks = (n + chunk - 1) // chunk
    nbytes = _chunk_bytes(chunk, kind, param, k, w)
    ok = np.ones(max(nchunks, 1), np.bool_)
    for c in prange(nchunks):
        a = c * chunk
        e = min(a + chunk, n)
        digits = np.empty(e - a, np.uint16)
        ok[c] = _unpack(payload[c * nbytes :], e - a, e == n, kind, param, k, w, digits)
        b = np.searchsorted(bstarts, lo + a, side="right") - 1
        i = a
        while i < e:
            while bstarts[b + 1] <= lo + i:
                b += 1
            stop = min(e, bstarts[b + 1] - lo)
            ds = digits[i - a : stop - a]
            os = out[i:stop]
            sc = scale[b]
            for j in range(ds.size):
                os[j] = (np.float32(np.int32(ds[j]) - offset) * sc) / divisor
            i = stop
    return ok.all()


@njit(parallel=True, **_OPTS)
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
            os = out[i:stop]
            key = keys[s]
            first = uint64(i - sstarts[s])
            for j in range(os.size):
                os[j] = _draw(key, first + uint64(j))
            i = stop
