"""The fused CPU kernels (numba) of a shared-grid quantizer's receiving side (TernGrad, QSGD).

* :func:`sum_packed` — the shard owner's work: unpack N payloads, add, repack in base 2Nm + 1.
* :func:`decode_packed` — unpack ``s (d - offset) / divisor`` straight into an output buffer
  (the DDP bucket), or add it there; digits packed in bytes through tables
  (:func:`_decode_bytes`).

Float arithmetic follows the reference (``quantize.grid.grid_decode``) operation for
operation, in float32, so given the same scales the values are identical.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from terngrad.kernels.compile_cpu import _OPTS, _all_true, kernel
from terngrad.kernels.packing_cpu import BASE, _chunk_bytes, _pack, _unpack
from terngrad.wire.pack import BLOCK_WORDS


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
