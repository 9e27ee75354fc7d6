"""Packing and unpacking of digits inside the fused CPU kernels (numba), for the chunk of the
message a task holds.

* :func:`_pack` — digits into a payload; :func:`_unpack` — a payload into digits, with its
  validity (no word beyond ``B**k - 1``, zero padding at the message's end).
* :func:`_chunk_bytes` — the bytes of a chunk of digits, where each task's piece of the
  payload starts.

Packed layouts are those of :mod:`terngrad.wire.pack`: ``kind`` ``BASE`` (0) is base-B with
``k`` digits per ``w``-byte word, planar in blocks of ``BLOCK_WORDS`` words (an n-bit codec
whose digits fill whole bytes is base ``2**bits``), ``NBIT`` (1) an n-bit stream.
"""

from __future__ import annotations

import numpy as np
from numba import njit, uint64

from terngrad.kernels.compile_cpu import _OPTS
from terngrad.wire.pack import BLOCK_WORDS

BASE, NBIT = 0, 1


# The planar word layout (see terngrad.wire.pack) makes every plane a contiguous run of digits:
# loops over zero-based views (see terngrad.kernels.compile_cpu).


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
