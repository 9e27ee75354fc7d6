"""Bit packing of integer codes into bytes, each packer with its exact inverse.

Every packer takes *digits*: non-negative integers below a known bound (a quantizer maps its
signed codes to digits first, e.g. a ternary code ``t`` in {-1, 0, 1} becomes ``t + 1``).
The byte layout is fixed and independent of the host:

* **base-B** (``pack_base``): ``k`` digits per word of ``w`` bytes, ``word = sum_t d_t * B**t``
  (digit 0 least significant), words stored little-endian; ``(k, w)`` is chosen by
  :func:`word_layout` to minimise bits per digit. Words are *planar* in blocks: the digits are
  cut into blocks of ``BLOCK_WORDS * k`` (the last block shorter), and in a block of ``L``
  words, word ``j`` holds digits ``j, j + L, ..., j + (k - 1) L`` of the block (the last block
  has ``L = ceil(r / k)`` words for its ``r`` digits, zero digits padding its last plane).
  Neighbouring digits thus sit in neighbouring words, so packing and unpacking are loops over
  contiguous memory that vectorize on CPUs and coalesce on GPUs (an interleaved layout made the
  fused unpack about five times slower).
  ``pack_base3`` is ``pack_base(d, 3)``: 5 trits per byte (3**5 = 243 <= 256), 1.6 bits per
  digit against the log2(3) = 1.585-bit limit. The sums of N ternary codes lie in [-N, N] and
  travel in base 2N+1 (base 9 for N = 4: 5 digits per 16-bit word, 3.2 bits against 3.17).
* **n-bit** (``pack_nbit``): for ``bits`` dividing 8, ``pack_base(d, 2**bits)`` (``8 / bits``
  digits a byte, planar); ``pack_2bit`` is ``pack_nbit(d, 2)``. For other widths, a
  little-endian bit stream: digit ``i`` occupies stream bits ``[i*bits, (i+1)*bits)`` and stream
  bit ``j`` is bit ``j % 8`` of byte ``j // 8``.

A message of ``n`` digits is padded with zero digits to whole bytes or words; the true length
``n`` travels separately (in the frame header) and the unpackers take it as an argument.
Unpacking validates what it reads: a wrong byte count, a word beyond ``B**k - 1`` or non-zero
padding raises ``ValueError`` instead of returning wrong digits.
"""

from __future__ import annotations

import math
from functools import cache

import torch

MAX_BITS = 16
MAX_BASE = 65535
BLOCK_WORDS = 1024  # words per planar block of the base-B layout

_WORD_BYTES = (1, 2, 4, 8)


def _check_digits(digits: torch.Tensor, bound: int) -> torch.Tensor:
    """Flatten ``digits`` to int64 and check every value lies in ``[0, bound)``."""
    if not isinstance(digits, torch.Tensor):
        raise TypeError(f"digits must be a torch.Tensor, got {type(digits).__name__}")
    if digits.dtype.is_floating_point or digits.dtype.is_complex or digits.dtype == torch.bool:
        raise ValueError(f"digits must be an integer tensor, got dtype {digits.dtype}")
    flat = digits.reshape(-1).to(torch.int64)
    if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= bound):
        raise ValueError(
            f"digits must lie in [0, {bound - 1}], got values in "
            f"[{int(flat.min())}, {int(flat.max())}]"
        )
    return flat


def check_count(numel: int) -> int:
    """``numel``, a count of digits or values: ``TypeError`` unless an integer, ``ValueError`` if
    negative."""
    if isinstance(numel, bool) or not isinstance(numel, int):
        raise TypeError(f"numel must be an integer count of digits, got {type(numel).__name__}")
    if numel < 0:
        raise ValueError(f"numel must be a count of digits (>= 0), got {numel}")
    return numel


def check_packed(packed: torch.Tensor, expected: int, what: str) -> torch.Tensor:
    """``packed`` flattened: ``TypeError`` unless a tensor, ``ValueError`` unless ``expected``
    uint8 bytes (checked before anything is unpacked or allocated)."""
    if not isinstance(packed, torch.Tensor):
        raise TypeError(
            f"{what}: packed data must be a uint8 torch.Tensor, got {type(packed).__name__}"
        )
    if packed.dtype != torch.uint8:
        raise ValueError(f"{what}: packed data must be a uint8 tensor, got {packed.dtype}")
    flat = packed.reshape(-1)
    if flat.numel() != expected:
        raise ValueError(
            f"{what}: expected {expected} packed bytes, got {flat.numel()} "
            "(truncated data or a wrong element count)"
        )
    return flat


def _digit_dtype(bound: int) -> torch.dtype:
    """uint8 for digits that fit a byte, int32 otherwise."""
    return torch.uint8 if bound <= 256 else torch.int32


# --------------------------------------------------------------------------- n-bit


def _check_bits(bits: int) -> None:
    if isinstance(bits, bool) or not isinstance(bits, int) or not 1 <= bits <= MAX_BITS:
        raise ValueError(f"bits must be an integer in [1, {MAX_BITS}], got {bits!r}")


def nbit_nbytes(numel: int, bits: int) -> int:
    """Bytes that ``numel`` digits take at ``bits`` bits each: ceil(numel * bits / 8)."""
    _check_bits(bits)
    check_count(numel)
    return (numel * bits + 7) // 8


def pack_nbit(digits: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack digits in ``[0, 2**bits)``: planar base ``2**bits`` if ``bits`` divides 8, else a
    little-endian bit stream (see module doc)."""
    _check_bits(bits)
    if 8 % bits == 0:
        return pack_base(digits, 1 << bits)
    flat = _check_digits(digits, 1 << bits)
    shifts = torch.arange(bits, device=flat.device)
    stream = ((flat[:, None] >> shifts) & 1).reshape(-1)
    pad = (-stream.numel()) % 8
    stream = torch.nn.functional.pad(stream, (0, pad))
    weights = 1 << torch.arange(8, device=flat.device)
    return (stream.view(-1, 8) * weights).sum(1).to(torch.uint8)


def unpack_nbit(packed: torch.Tensor, bits: int, numel: int) -> torch.Tensor:
    """Inverse of :func:`pack_nbit`: the first ``numel`` digits (uint8, or int32 if bits > 8)."""
    _check_bits(bits)
    if 8 % bits == 0:
        return unpack_base(packed, 1 << bits, numel)
    flat = check_packed(packed, nbit_nbytes(numel, bits), f"{bits}-bit unpack")
    shifts = torch.arange(8, device=flat.device)
    stream = ((flat.to(torch.int64)[:, None] >> shifts) & 1).reshape(-1)
    if bool(stream[numel * bits :].any()):
        raise ValueError(f"{bits}-bit unpack: non-zero padding bits (corrupted data)")
    weights = 1 << torch.arange(bits, device=flat.device)
    digits = (stream[: numel * bits].view(numel, bits) * weights).sum(1)
    return digits.to(_digit_dtype(1 << bits))


def pack_2bit(digits: torch.Tensor) -> torch.Tensor:
    """Four 2-bit digits per byte (TernGrad's own encoding: code + 1 in {0, 1, 2}), planar."""
    return pack_nbit(digits, 2)


def unpack_2bit(packed: torch.Tensor, numel: int) -> torch.Tensor:
    """Inverse of :func:`pack_2bit`."""
    return unpack_nbit(packed, 2, numel)


# --------------------------------------------------------------------------- base-B


def _check_base(base: int) -> None:
    if isinstance(base, bool) or not isinstance(base, int) or not 2 <= base <= MAX_BASE:
        raise ValueError(f"base must be an integer in [2, {MAX_BASE}], got {base!r}")


@cache
def word_layout(base: int) -> tuple[int, int]:
    """``(k, w)``: k base-``base`` digits per word of w bytes, with the fewest bits per digit.

    A word of w bytes holds ``k = max{k : base**k <= 2**(8w)}`` digits (``2**63`` for w = 8, so
    that words fit a signed 64-bit integer); among w in {1, 2, 4, 8} the smallest ``8w/k`` wins,
    the shorter word on a tie. Examples: base 3 -> (5, 1), base 5 -> (27, 8), base 9 -> (5, 2).
    """
    _check_base(base)
    best: tuple[int, int] | None = None
    for w in _WORD_BYTES:
        limit = 1 << 63 if w == 8 else 1 << (8 * w)
        k, power = 0, 1
        while power * base <= limit:
            power *= base
            k += 1
        if k and (best is None or 8 * w * best[0] < 8 * best[1] * k):
            best = (k, w)
    assert best is not None  # base <= 65535 always fits two bytes
    return best


def base_nbytes(numel: int, base: int) -> int:
    """Bytes that ``numel`` base-``base`` digits take: ceil(numel / k) words of w bytes."""
    k, w = word_layout(base)
    check_count(numel)
    return math.ceil(numel / k) * w


def _powers(base: int, k: int, device: torch.device) -> torch.Tensor:
    return torch.tensor([base**i for i in range(k)], dtype=torch.int64, device=device)


def _planes(numel: int, k: int) -> list[tuple[int, int, int]]:
    """``(first digit, blocks, words per block)`` of the planar layout: the full blocks as one
    run, then the last, shorter block."""
    full = numel // (BLOCK_WORDS * k)
    runs = [(0, full, BLOCK_WORDS)] if full else []
    rest = numel - full * BLOCK_WORDS * k
    if rest:
        runs.append((full * BLOCK_WORDS * k, 1, math.ceil(rest / k)))
    return runs


def pack_base(digits: torch.Tensor, base: int) -> torch.Tensor:
    """Pack digits in ``[0, base)`` k to a w-byte word (see :func:`word_layout`), planar in
    blocks of ``BLOCK_WORDS`` words (see the module doc)."""
    k, w = word_layout(base)
    flat = _check_digits(digits, base)
    powers = _powers(base, k, flat.device)
    words = []
    for first, blocks, length in _planes(flat.numel(), k):
        part = flat[first : first + blocks * length * k]
        part = torch.nn.functional.pad(part, (0, blocks * length * k - part.numel()))
        words.append((part.view(blocks, k, length) * powers.view(1, k, 1)).sum(1).reshape(-1))
    words = torch.cat(words) if words else flat.new_empty(0)
    if w == 1:
        return words.to(torch.uint8)
    shifts = 8 * torch.arange(w, device=flat.device)
    return ((words[:, None] >> shifts) & 255).to(torch.uint8).reshape(-1)


def unpack_base(packed: torch.Tensor, base: int, numel: int) -> torch.Tensor:
    """Inverse of :func:`pack_base`: the first ``numel`` digits (uint8, or int32 if base > 256)."""
    k, w = word_layout(base)
    flat = check_packed(packed, base_nbytes(numel, base), f"base-{base} unpack")
    shifts = 8 * torch.arange(w, device=flat.device)
    words = (flat.to(torch.int64).view(-1, w) << shifts).sum(1)
    if words.numel() and (bool((words < 0).any()) or int(words.max()) >= base**k):
        raise ValueError(f"base-{base} unpack: a word exceeds {base}**{k} - 1 (corrupted data)")
    powers = _powers(base, k, flat.device)
    digits, start = [], 0
    for first, blocks, length in _planes(numel, k):
        part = words[start : start + blocks * length].view(blocks, 1, length)
        start += blocks * length
        block_digits = ((part // powers.view(1, k, 1)) % base).reshape(-1)
        count = min(numel - first, blocks * length * k)
        if bool(block_digits[count:].any()):
            raise ValueError(f"base-{base} unpack: non-zero padding digits (corrupted data)")
        digits.append(block_digits[:count])
    out = torch.cat(digits) if digits else words.new_empty(0)
    return out.to(_digit_dtype(base))


def pack_base3(digits: torch.Tensor) -> torch.Tensor:
    """Five trits per byte, 1.6 bits per ternary digit (``pack_base(d, 3)``)."""
    return pack_base(digits, 3)


def unpack_base3(packed: torch.Tensor, numel: int) -> torch.Tensor:
    """Inverse of :func:`pack_base3`."""
    return unpack_base(packed, 3, numel)
