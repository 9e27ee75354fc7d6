"""Triton kernels: the fused operations of :mod:`terngrad.kernels.encode_cpu` and
:mod:`~terngrad.kernels.decode_cpu` for CUDA tensors.

The same formulas, operation for operation in float32 (divisions correctly rounded with
``tl.div_rn``: Triton's ``/`` is approximate on GPUs), the same counter-based draws and the
same packed bytes; each program handles ``BLOCK`` packing words (``K`` digits in ``W`` bytes,
planar in blocks of ``L`` words: the layout of :mod:`terngrad.wire.pack`, where neighbouring
digits sit in neighbouring words, so loads and stores coalesce; an n-bit codec with ``bits``
dividing 8 is base ``2**bits`` with ``8 / bits`` digits a byte). An element finds its segment
by binary search over the segment offsets and its bucket from the segment's first bucket and
bucket size, so nothing per element is materialised.

Imported only where triton is installed. The tests run these kernels through Triton's
interpreter (``TRITON_INTERPRET=1``) on CPU tensors, so their bytes are checked against the
torch reference on every machine; their speed only on a GPU.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _segment_of(e, seg_starts, n_seg, STEPS: tl.constexpr):
    """The last segment ``s`` with ``seg_starts[s] <= e`` (``n_seg`` segments, ``STEPS`` >=
    log2(n_seg) + 1 halvings)."""
    lo = tl.zeros_like(e)
    hi = lo + n_seg - 1
    for _ in tl.static_range(STEPS):
        mid = (lo + hi + 1) // 2
        go = tl.load(seg_starts + mid) <= e
        lo = tl.where(go, mid, lo)
        hi = tl.where(go, hi, mid - 1)
    return lo


@triton.jit
def _bucket_of(e, s, seg_starts, seg_bucket0, seg_bucket_size):
    start = tl.load(seg_starts + s)
    return tl.load(seg_bucket0 + s) + (e - start) // tl.load(seg_bucket_size + s)


@triton.jit
def _draw(key, index):
    """Draw ``index`` (uint64) of the stream ``key`` (uint64), float32: a 24-bit field of
    splitmix64's output ``index // 2``; see ``random.py``."""
    z = key + ((index >> 1) + 1) * 0x9E3779B97F4A7C15
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB
    z = z ^ (z >> 31)
    field = tl.where((index & 1) == 1, (z >> 16) & 0xFFFFFF, z >> 40)
    return field.to(tl.float32) * 5.9604644775390625e-08  # 2**-24


@triton.jit
def _word_place(word, n, K: tl.constexpr, L: tl.constexpr):
    """Where packing word ``word`` of an ``n``-digit message sits: the first digit of its
    block, its index ``j`` there, the block's words and digits."""
    first = (word // L) * (L * K)
    r = tl.minimum(n - first, L * K)
    return first, word % L, (r + K - 1) // K, r


@triton.jit(do_not_specialize=["m"])  # m = 1 would become a constant without .to()
def grid_pack_kernel(
    x, lo, hi, seg_starts, seg_bucket0, seg_bucket_size, n_seg, bound, scale, keys, uniform,
    m, out, nwords,
    GIVEN: tl.constexpr, BASE: tl.constexpr, K: tl.constexpr, W: tl.constexpr,
    L: tl.constexpr, STEPS: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """Digits of ``x[lo:hi]`` on the grid, packed: see ``encode_cpu._grid_digit``."""
    word_id = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = word_id < nwords
    first, j, words_in_block, r = _word_place(word_id, hi - lo, K, L)
    word = tl.zeros([BLOCK], dtype=tl.uint64)
    power = tl.full([BLOCK], 1, dtype=tl.uint64)
    mf = m.to(tl.float32)
    for t in tl.static_range(K):
        inside = live & (t * words_in_block + j < r)
        e = tl.where(inside, lo + first + t * words_in_block + j, lo)
        s = _segment_of(e, seg_starts, n_seg, STEPS)
        b = _bucket_of(e, s, seg_starts, seg_bucket0, seg_bucket_size)
        g = tl.load(x + e, mask=inside, other=0.0)
        bnd = tl.load(bound + b, mask=inside, other=1.0)
        sc = tl.load(scale + b, mask=inside, other=1.0)
        if GIVEN:
            u = tl.load(uniform + e, mask=inside, other=0.0)
        else:
            key = tl.load(keys + s, mask=inside, other=0).to(tl.uint64, bitcast=True)
            index = (e - tl.load(seg_starts + s)).to(tl.uint64)
            u = _draw(key, index)
        a = tl.minimum(tl.abs(g), bnd)
        pos = tl.minimum(tl.div_rn(a * mf, sc), mf)  # `/` is approximate on GPUs
        fl = tl.floor(pos)
        step = fl.to(tl.int32) + (u < pos - fl).to(tl.int32)
        step = tl.where(sc > 0, step, 0)
        digit = tl.where(g > 0, m + step, m - step)
        digit = tl.where(inside, digit, 0)
        word += digit.to(tl.uint64) * power
        power *= BASE
    for byte in tl.static_range(W):
        tl.store(out + word_id * W + byte, ((word >> (8 * byte)) & 255).to(tl.uint8), mask=live)


@triton.jit
def _unpack_digit(
    payload, e, n, BASE: tl.constexpr, K: tl.constexpr, W: tl.constexpr, L: tl.constexpr
):
    """Digit ``e`` of a packed payload, and whether its word is valid (below ``BASE**K``,
    with zero padding where the message ends inside it)."""
    first = (e // (L * K)) * (L * K)
    r = tl.minimum(n - first, L * K)
    words_in_block = (r + K - 1) // K
    t = (e - first) // words_in_block
    j = (e - first) % words_in_block
    word_id = (e // (L * K)) * L + j
    word = tl.zeros_like(e).to(tl.uint64)
    for byte in tl.static_range(W):
        word |= tl.load(payload + word_id * W + byte).to(tl.uint64) << (8 * byte)
    digits_here = (r - j + words_in_block - 1) // words_in_block
    limit = tl.full(e.shape, 1, dtype=tl.uint64)
    divisor = tl.full(e.shape, 1, dtype=tl.uint64)
    for i in tl.static_range(K):
        limit = tl.where(i < digits_here, limit * BASE, limit)
        divisor = tl.where(i < t, divisor * BASE, divisor)
    digit = (word // divisor) % BASE
    return digit.to(tl.int32), word < limit


@triton.jit
def decode_kernel(
    payload, n, offset, divisor, limit, lo, seg_starts, seg_bucket0, seg_bucket_size, n_seg,
    scale, out, bad,
    BASE: tl.constexpr, K: tl.constexpr, W: tl.constexpr, L: tl.constexpr,
    STEPS: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """``out[e] = (float32(d_e - offset) * s) / divisor`` for the payload's ``n`` digits
    (``float32(d_e - offset) * (s / divisor)`` where ``s > limit``: no overflow)."""
    e = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = e < n
    ee = tl.where(live, e, 0)
    digit, ok = _unpack_digit(payload, ee, n, BASE, K, W, L)
    flat = ee + lo
    s = _segment_of(flat, seg_starts, n_seg, STEPS)
    sc = tl.load(scale + _bucket_of(flat, s, seg_starts, seg_bucket0, seg_bucket_size))
    c = (digit - offset).to(tl.float32)
    value = tl.where(sc > limit, c * tl.div_rn(sc, divisor), tl.div_rn(c * sc, divisor))
    tl.store(out + e, value, mask=live)
    tl.atomic_max(bad, tl.max(tl.where(live & ~ok, 1, 0), 0))


@triton.jit
def sum_kernel(
    payloads, stride, rows, n, out, nwords, bad,
    BASE: tl.constexpr, K: tl.constexpr, W: tl.constexpr,
    OUT_BASE: tl.constexpr, OUT_K: tl.constexpr, OUT_W: tl.constexpr, L: tl.constexpr,
    BLOCK: tl.constexpr,
):  # fmt: skip
    """Pack the element-wise digit sums of the ``rows`` payloads (``stride`` bytes apart)."""
    word_id = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = word_id < nwords
    first, j, words_in_block, r_block = _word_place(word_id, n, OUT_K, L)
    word = tl.zeros([BLOCK], dtype=tl.uint64)
    power = tl.full([BLOCK], 1, dtype=tl.uint64)
    flags = tl.zeros([BLOCK], dtype=tl.int32)
    for t in tl.static_range(OUT_K):
        inside = live & (t * words_in_block + j < r_block)
        ee = tl.where(inside, first + t * words_in_block + j, 0)
        total = tl.zeros([BLOCK], dtype=tl.int32)
        for r in range(rows):
            digit, ok = _unpack_digit(payloads + r * stride, ee, n, BASE, K, W, L)
            total += digit
            flags |= tl.where(inside & ~ok, 1, 0)
        word += tl.where(inside, total, 0).to(tl.uint64) * power
        power *= OUT_BASE
    for byte in tl.static_range(OUT_W):
        tl.store(out + word_id * OUT_W + byte, ((word >> (8 * byte)) & 255).to(tl.uint8), mask=live)
    tl.atomic_max(bad, tl.max(flags, 0))


@triton.jit
def moments_kernel(x, bits, piece_lo, piece_hi, piece_shift, partial, TILE: tl.constexpr):
    """Per piece (a chunk of one bucket): ``sum(x - K)``, ``sum((x - K)**2)``, ``sum(x**2)``
    in float64 and the largest sign-cleared bit pattern (``max |x|``, NaN on top)."""
    p = tl.program_id(0)
    lo = tl.load(piece_lo + p)
    hi = tl.load(piece_hi + p)
    shift = tl.load(x + tl.load(piece_shift + p)).to(tl.float64)
    s1 = tl.zeros([TILE], dtype=tl.float64)
    s2 = tl.zeros([TILE], dtype=tl.float64)
    sq = tl.zeros([TILE], dtype=tl.float64)
    top = tl.zeros([TILE], dtype=tl.int32)
    for start in range(lo, hi, TILE):
        e = start + tl.arange(0, TILE)
        inside = e < hi
        v = tl.load(x + e, mask=inside, other=0.0).to(tl.float64)
        d = tl.where(inside, v - shift, 0.0)
        s1 += d
        s2 += d * d
        sq += v * v
        top = tl.maximum(top, tl.load(bits + e, mask=inside, other=0) & 0x7FFFFFFF)
    tl.store(partial + p * 4, tl.sum(s1, 0))
    tl.store(partial + p * 4 + 1, tl.sum(s2, 0))
    tl.store(partial + p * 4 + 2, tl.sum(sq, 0))
    tl.store(partial + p * 4 + 3, tl.max(top, 0).to(tl.float64))


@triton.jit
def uniform_kernel(seg_starts, n_seg, keys, out, n, STEPS: tl.constexpr, BLOCK: tl.constexpr):
    """Every draw of a flat gradient of segments into ``out``."""
    e = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = e < n
    ee = tl.where(live, e, 0)
    s = _segment_of(ee, seg_starts, n_seg, STEPS)
    key = tl.load(keys + s).to(tl.uint64, bitcast=True)
    u = _draw(key, (ee - tl.load(seg_starts + s)).to(tl.uint64))
    tl.store(out + e, u, mask=live)
