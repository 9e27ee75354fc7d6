"""Fused CPU kernels (numba): one pass over the gradient for each of the exchange's operations.

* :func:`bucket_moments` — per bucket, in one pass: the float64 sums that give the mean and
  standard deviation (shifted by the bucket's first element against cancellation), the sum of
  squares and ``max |g|``. TernGrad's local scale follows without a second pass:
  ``max_k |clip(g_k)| = min(max_k |g_k|, c sigma)``.
* :func:`grid_pack` — clip, stochastic rounding on the grid ``s j / m`` with counter-based
  draws (:mod:`terngrad.quantize.random`), and packing, for any range of the flat gradient.
* :func:`sum_packed` — the shard owner's work: unpack N payloads, add, repack in base 2Nm + 1.
* :func:`decode_packed` — unpack ``s (d - offset) / divisor`` straight into an output buffer
  (the DDP bucket).
* :func:`uniform_into` — the draws themselves, for quantizers rounded by the torch reference.

Work is cut into fixed chunks of whole packing words and run in parallel over chunks; every
result is a function of the element index only, so it is the same for any thread count. Each of
these kernels is compiled twice (:func:`kernel`): in parallel over chunks, and as one serial
loop for a caller with one thread — a training rank — which then pays no parallel launch (on a
thread pool of numba's ``workqueue`` layer, about 0.3 ms a call here, more than the work on a
small bucket). Float
arithmetic follows the reference (:mod:`terngrad.quantize.grid`) operation for operation, in
float32, so given the same scales the bytes are identical. Packed layouts are those of
:mod:`terngrad.wire.pack`: ``kind`` 0 is base-B with ``k`` digits per ``w``-byte word, planar
in blocks of ``BLOCK_WORDS`` words (an n-bit codec whose digits fill whole bytes is base
``2**bits``), 1 is an n-bit stream.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numba import njit, prange, uint64

from terngrad.wire.pack import BLOCK_WORDS

BASE, NBIT = 0, 1

_GOLDEN = uint64(0x9E3779B97F4A7C15)
_MIX1 = uint64(0xBF58476D1CE4E5B9)
_MIX2 = uint64(0x94D049BB133111EB)
_TWO_M24 = np.float32(2.0**-24)

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


# Loops run over zero-based views with a ``range(n)`` index: numba then knows every index is
# non-negative, drops its negative-index wrap-around check, and LLVM vectorizes the loop (an
# offset index such as ``x[lo + j]`` made the same loops about eight times slower). The planar
# word layout (see terngrad.wire.pack) makes every plane a contiguous run of digits.


@njit(**_OPTS)
def _pack_block(d, r, out, base, k, w, words):
    """One planar block: the ``r`` digits ``d`` into ``ceil(r / k)`` words at ``out``;
    ``words`` is scratch of at least that many words, uint32 for ``w <= 4`` (its multiplies
    one vector instruction each, against three for uint64 on AVX2), else uint64, and ``base``
    of its type."""
    words_n = (r + k - 1) // k
    ws = words[:words_n]
    for j in range(words_n):
        ws[j] = 0
    for t in range(k - 1, -1, -1):
        lo = min(t * words_n, r)
        plane = d[lo : min(lo + words_n, r)]
        for j in range(plane.size):
            ws[j] = ws[j] * base + plane[j]
        for j in range(plane.size, words_n):  # zero digits padding the last plane
            ws[j] = ws[j] * base
    if w == 1:
        o = out[:words_n]
        for j in range(words_n):
            o[j] = np.uint8(ws[j] & uint64(255))
    else:
        o2 = out[: words_n * w].reshape(words_n, w)
        for byte in range(w):
            for j in range(words_n):
                o2[j, byte] = np.uint8((ws[j] >> uint64(8 * byte)) & uint64(255))


@njit(**_OPTS)
def _pack_blocks(digits, n, out, base, k, w, words):
    """``digits[:n]`` in planar blocks of ``BLOCK_WORDS`` words (:func:`_pack_block`)."""
    block = BLOCK_WORDS * k
    for first in range(0, n, block):
        r = min(block, n - first)
        _pack_block(digits[first : first + r], r, out[first // k * w :], base, k, w, words)


@njit(**_OPTS)
def _extract(values, planes, first, count, fb, magic):
    """Planes ``first .. first + count - 1`` (digits least significant first) of ``values``
    (integers; below 2**16 in float32, below 2**48 in float64, the type of the base ``fb``:
    every constant takes that type, as numba widens float32 mixed with an integer) into the
    rows of ``planes``; ``values`` end as the quotients. The quotient is ``v / base`` rounded
    to the nearest integer by adding and subtracting ``magic`` (2**23 or 2**52), then corrected
    by one step: exact, as every intermediate is an integer the type holds, and vectorizable
    (``np.floor`` is a libm call that keeps the loop scalar)."""
    one = fb / fb
    zero = fb - fb
    inv = one / fb
    for t in range(first, first + count):
        row = planes[t]
        for j in range(values.size):
            v = values[j]
            q = (v * inv + magic) - magic
            r = v - q * fb
            q = q + (one if r >= fb else zero) - (one if r < zero else zero)
            row[j] = np.uint16(v - q * fb)
            values[j] = q


@njit(**_OPTS)
def _unpack_block(src, words_n, base, k, w, limit, planes):
    """One planar block of ``words_n`` words at ``src`` into ``planes`` (k rows of ``words_n``
    digits); False if a word exceeds ``limit - 1``."""
    words = np.zeros(words_n, np.uint64)
    if w == 1:
        s1 = src[:words_n]
        for j in range(words_n):
            words[j] = uint64(s1[j])
    else:
        s2 = src[: words_n * w].reshape(words_n, w)
        for byte in range(w - 1, -1, -1):
            for j in range(words_n):
                words[j] = (words[j] << uint64(8)) | uint64(s2[j, byte])
    bad = 0
    for j in range(words_n):
        bad |= words[j] >= limit
    if w <= 2:  # below 2**16: float32 digit extraction, 16 lanes a vector
        small = np.empty(words_n, np.float32)
        for j in range(words_n):  # through int32: AVX2 converts no uint64 to float
            small[j] = np.float32(np.int32(words[j]))
        _extract(small, planes, 0, k, np.float32(base), np.float32(2.0**23))
    elif w == 4:  # below 2**32: float64
        values = np.empty(words_n, np.float64)
        for j in range(words_n):
            values[j] = np.float64(words[j])
        _extract(values, planes, 0, k, np.float64(base), 2.0**52)
    else:  # split each word at base**h so both parts stay below 2**53
        h = k // 2
        split = uint64(1)
        for _ in range(h):
            split *= uint64(base)
        low = np.empty(words_n, np.float64)
        high = np.empty(words_n, np.float64)
        for j in range(words_n):
            q = words[j] // split
            low[j] = np.float64(words[j] - q * split)
            high[j] = np.float64(q)
        _extract(low, planes, 0, h, np.float64(base), 2.0**52)
        _extract(high, planes, h, k - h, np.float64(base), 2.0**52)
    return bad == 0


@njit(**_OPTS)
def _pack(digits, n, out, kind, param, k, w):
    """Pack ``digits[:n]`` into ``out`` (a view at the chunk's first byte); ``n`` is a whole
    number of planar blocks except in the message's last chunk."""
    if kind == BASE:
        if w <= 4:
            words32 = np.empty(BLOCK_WORDS, np.uint32)
            _pack_blocks(digits, n, out, np.uint32(param), k, w, words32)
        else:
            _pack_blocks(digits, n, out, uint64(param), k, w, np.empty(BLOCK_WORDS, np.uint64))
        return
    bits = param  # a bit stream: digits straddle bytes
    acc = uint64(0)
    nb = 0
    o = 0
    for i in range(n):
        acc |= uint64(digits[i]) << uint64(nb)
        nb += bits
        while nb >= 8:
            out[o] = np.uint8(acc & uint64(255))
            o += 1
            acc >>= uint64(8)
            nb -= 8
    if nb > 0:
        out[o] = np.uint8(acc & uint64(255))


@njit(**_OPTS)
def _unpack(payload, n, last, kind, param, k, w, digits):
    """Unpack ``n`` digits from ``payload`` (a view at the chunk's first byte) into ``digits``;
    False for a word beyond ``B**k - 1`` or, in the ``last`` chunk, non-zero padding."""
    ok = True
    if kind == BASE:
        limit = uint64(1)
        for _ in range(k):
            limit *= uint64(param)
        block = BLOCK_WORDS * k
        for first in range(0, n, block):
            r = min(block, n - first)
            words_n = (r + k - 1) // k
            src = payload[first // k * w :]
            if r == words_n * k:  # the planes are the digits themselves
                planes = digits[first : first + r].reshape(k, words_n)
                ok &= _unpack_block(src, words_n, param, k, w, limit, planes)
            else:  # the message's last block: its last plane is padded
                scratch = np.empty((k, words_n), np.uint16)
                ok &= _unpack_block(src, words_n, param, k, w, limit, scratch)
                flat = scratch.reshape(-1)
                digits[first : first + r] = flat[:r]
                if last:
                    for i in range(r, flat.size):
                        ok &= flat[i] == 0
        return ok
    bits = param
    mask = uint64((1 << bits) - 1)
    acc = uint64(0)
    nb = 0
    o = 0
    for i in range(n):
        while nb < bits:
            acc |= uint64(payload[o]) << uint64(nb)
            o += 1
            nb += 8
        digits[i] = acc & mask
        acc >>= uint64(bits)
        nb -= bits
    return not (last and acc != 0)


def _chunk_bytes(chunk, kind, param, k, w):
    return chunk // k * w if kind == BASE else chunk * param // 8


_chunk_bytes = njit(inline="always", **_OPTS)(_chunk_bytes)


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


@njit(**_OPTS)
def _all_true(count):
    """One ``True`` flag per task (a loop: ``np.ones`` would be a parallel region)."""
    flags = np.empty(max(count, 1), np.bool_)
    for c in range(flags.size):
        flags[c] = True
    return flags


@kernel()
def sum_packed(
    payloads, n, kind_in, param_in, k_in, w_in, kind_out, param_out, k_out, w_out, chunk, out
):
    """Pack ``sum_r digits_r`` of the rows of ``payloads`` (``n`` digits each) into ``out``;
    returns False if some payload is corrupt."""
    nchunks = (n + chunk - 1) // chunk
    in_bytes = _chunk_bytes(chunk, kind_in, param_in, k_in, w_in)
    out_bytes = _chunk_bytes(chunk, kind_out, param_out, k_out, w_out)
    ok = _all_true(nchunks)
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


#: a bucket holding at least this many of a task's elements per digit of a byte decodes its
#: bytes through a table of its values (one look-up an element); fewer, through the table of
#: digits and the formula: building the values' table costs ``k * 256`` formulas
_TABLE_MIN_PER_DIGIT = 512


@njit(**_OPTS)
def _digit_table(base, k):
    """``table[t, v]``: digit ``t`` (least significant first) of the byte ``v`` read as ``k``
    base-``base`` digits, float32 (rows of bytes ``>= base**k`` are what their arithmetic
    gives: such bytes are refused)."""
    table = np.empty((k, 256), np.float32)
    for v in range(256):
        q = v
        for t in range(k):
            table[t, v] = q % base
            q //= base
    return table


@njit(**_OPTS)
def _values_into(rows, digits, off, sc, divisor, limit):
    """``rows[t, v] = ((digits[t, v] - off) * sc) / divisor``, float32, in that order —
    ``(digits[t, v] - off) * (sc / divisor)`` where ``sc > limit`` (``quantize.grid.
    grid_decode``; ``digits - off`` is an exact integer: both are integers below 2**16)."""
    flat, src = rows.reshape(-1), digits.reshape(-1)
    if sc > limit:
        sd = sc / divisor
        for j in range(flat.size):
            flat[j] = (src[j] - off) * sd
    else:
        for j in range(flat.size):
            flat[j] = ((src[j] - off) * sc) / divisor


@njit(inline="always", **_OPTS)
def _digit(row, ds, j):
    """Digit ``j``: ``ds[j]``, or ``row[ds[j]]`` where ``ds`` holds bytes and ``row`` their
    digits (``row`` None: compiled away)."""
    if row is None:
        return np.float32(ds[j])
    return np.float32(row[ds[j]])


@njit(**_OPTS)
def _formula_into(row, ds, sc, off, divisor, limit, acc, os):
    """``os[j] = ((d_j - off) * sc) / divisor``, float32, ``d_j`` digit ``j`` (:func:`_digit`)
    — ``(d_j - off) * (sc / divisor)`` where ``sc > limit`` (``c * s`` could overflow: as
    ``quantize.grid.grid_decode``) — or that added to ``os[j]`` where ``acc``."""
    if sc > limit:
        sd = sc / divisor
        if acc:
            for j in range(ds.size):
                os[j] += (_digit(row, ds, j) - off) * sd
        else:
            for j in range(ds.size):
                os[j] = (_digit(row, ds, j) - off) * sd
    elif acc:
        for j in range(ds.size):
            os[j] += ((_digit(row, ds, j) - off) * sc) / divisor
    else:
        for j in range(ds.size):
            os[j] = ((_digit(row, ds, j) - off) * sc) / divisor


@njit(**_OPTS)
def _decode_bytes(
    src, a, e, last, k, wlimit, digits, off, divisor, limit, lo, bstarts, scale, acc, out
):
    """``out[a:e]`` from the task's bytes ``src`` of ``k`` digits each (planar blocks, see
    :mod:`terngrad.wire.pack`), ``digits`` their table (:func:`_digit_table`): a plane of a
    block is ``out[j] = values[t, src[j]]``, the table of the bucket's values (built once per
    bucket and task, :func:`_values_into`) where the bucket holds at least
    ``_TABLE_MIN_PER_DIGIT * k`` of the task's elements, else the formula on ``digits[t,
    src[j]]`` (added to ``out[j]`` where ``acc``). False for a byte ``>= wlimit`` or, in the
    ``last`` task, non-zero padding."""
    values = np.empty((k, 256), np.float32)
    tabled = -1  # the bucket whose values ``values`` holds
    ok = True
    block = BLOCK_WORDS * k
    b = np.searchsorted(bstarts, lo + a, side="right") - 1
    for first in range(a, e, block):
        r = min(block, e - first)
        words_n = (r + k - 1) // k
        words = src[(first - a) // k : (first - a) // k + words_n]
        bad = 0
        for j in range(words_n):
            bad |= words[j] >= wlimit
        ok &= bad == 0
        if last and r < words_n * k:  # the digits padding the message's last block are 0
            for t in range(k):
                for j in range(max(r - t * words_n, 0), words_n):
                    ok &= digits[t, words[j]] == 0
        for t in range(k):
            i = first + t * words_n
            end = min(i + words_n, first + r)
            while i < end:
                while bstarts[b + 1] <= lo + i:
                    b += 1
                stop = min(end, bstarts[b + 1] - lo)
                ws = words[i - first - t * words_n : stop - first - t * words_n]
                os = out[i:stop]
                held = min(bstarts[b + 1] - lo, e) - max(bstarts[b] - lo, a)
                if held >= _TABLE_MIN_PER_DIGIT * k:
                    if tabled != b:
                        _values_into(values, digits, off, scale[b], divisor, limit)
                        tabled = b
                    row = values[t]
                    if acc:
                        for j in range(ws.size):
                            os[j] += row[ws[j]]
                    else:
                        for j in range(ws.size):
                            os[j] = row[ws[j]]
                else:
                    _formula_into(digits[t], ws, scale[b], off, divisor, limit, acc, os)
                i = stop
    return ok


@kernel()
def decode_packed(
    payload, n, kind, param, k, w, offset, divisor, limit, lo, bstarts, scale, chunk, acc, out
):
    """``out[j] = (float32(d_j - offset) * s_b) / divisor`` (``out[j] +=`` that where ``acc``:
    one pass over ``out`` where decoding and then adding would make three) for the ``n`` digits of
    ``payload``, element ``j`` standing for flat element ``lo + j`` of bucket ``b`` —
    ``float32(d_j - offset) * (s_b / divisor)`` in a bucket whose scale exceeds ``limit``
    (``quantize.grid.grid_decode``: no overflow); returns False if the payload is corrupt.
    Digits packed in bytes (``w == 1``: base 3, 2 bits) go through tables
    (:func:`_decode_bytes`), the others through their unpacking. ``float32(d - offset)`` is
    ``float32(d) - float32(offset)``, exact (integers below 2**16), and vectorizes (AVX2
    converts no int64 to float)."""
    nchunks = (n + chunk - 1) // chunk
    nbytes = _chunk_bytes(chunk, kind, param, k, w)
    ok = _all_true(nchunks)
    off = np.float32(offset)
    in_bytes = kind == BASE and w == 1
    digits_of = _digit_table(param, k if in_bytes else 0)
    wlimit = 1
    for _ in range(k):
        wlimit *= param
    for c in prange(nchunks):
        a = c * chunk
        e = min(a + chunk, n)
        src = payload[c * nbytes :]
        if in_bytes:
            ok[c] = _decode_bytes(
                src, a, e, e == n, k, wlimit, digits_of, off, divisor, limit, lo, bstarts,
                scale, acc, out,
            )  # fmt: skip
        else:
            digits = np.empty(e - a, np.uint16)
            ok[c] = _unpack(src, e - a, e == n, kind, param, k, w, digits)
            b = np.searchsorted(bstarts, lo + a, side="right") - 1
            i = a
            while i < e:
                while bstarts[b + 1] <= lo + i:
                    b += 1
                stop = min(e, bstarts[b + 1] - lo)
                _formula_into(
                    None, digits[i - a : stop - a], scale[b], off, divisor, limit, acc, out[i:stop]
                )
                i = stop
    return ok.all()


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
