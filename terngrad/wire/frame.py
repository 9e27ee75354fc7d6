"""One self-describing frame per message: header, scales and payload in one uint8 tensor.

A single collective call carries a whole frame, so the scales never need a round trip of their
own. Layout (all integers little-endian; version 2)::

    offset  size  field
    0       2     magic b"TG"
    2       1     format version (2)
    3       1     flags (reserved, 0)
    4       1     method id (the quantizer; terngrad.quantize maps ids to names)
    5       1     codec kind id (raw32, raw16, nbit, base; see terngrad.wire.codec)
    6       1     dtype id of the original gradient (float32, float16, bfloat16, float64)
    7       1     ndim
    8       2     codec param (bits per digit, or the base)
    10      2     levels (number of distinct values; method-specific, 0 if none)
    12      4     bucket size (elements per scale group; 0 = the whole segment)
    16      4     number of float32 scales
    20      4     number of segments (0 = the whole tensor is one segment)
    24      8     numel
    32      8     payload length in bytes
    40      4     CRC-32 of the whole frame, computed with this field zeroed
    44      8*n   shape, one uint64 per dimension
    ...     8*g   segment lengths (layers of a flat buffer), one uint64 each, summing to numel
    ...     4*s   scales, float32
    ...     p     payload

The header is 44 + 8*ndim + 8*segments bytes (52 for a flat gradient), a multiple of 4, so the
scales start 4-byte aligned. :func:`read_frame` rejects, with a ``ValueError`` that says what is
wrong, any frame that is truncated or padded, has another magic or version, names an unknown
codec or dtype, has a shape or segments that disagree with numel or a payload length that
disagrees with the codec, or fails its checksum: a damaged frame never decodes to a wrong tensor.
A frame whose checksum holds but whose header contradicts itself (levels its codec cannot carry,
a dimension beyond a torch size) or whose scales are NaN or Inf is refused too
(:func:`check_header`, :func:`check_scales`, which :func:`new_frame` runs as well). Every length
is checked against the frame's actual size before anything is allocated.
"""

from __future__ import annotations

import math
import struct
import zlib
from dataclasses import dataclass

import torch

from terngrad.wire.checksum import crc32
from terngrad.wire.codec import Codec

MAGIC = b"TG"
FORMAT_VERSION = 2  # 2: planar base-B words (1: interleaved)

_HEADER = struct.Struct("<2sBBBBBBHHIIIQQI")
_CRC_OFFSET = 40
DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.float16, torch.bfloat16, torch.float64)

_U8, _U16, _U32 = 0xFF, 0xFFFF, 0xFFFF_FFFF


@dataclass(frozen=True)
class FrameHeader:
    """What a frame says about its message, apart from the scales and payload bytes."""

    method_id: int
    codec: Codec
    dtype: torch.dtype
    shape: tuple[int, ...]
    levels: int
    bucket_size: int
    n_scales: int
    segments: tuple[int, ...] = ()

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def payload_len(self) -> int:
        return self.codec.nbytes(self.numel)

    @property
    def nbytes(self) -> int:
        """Bytes of the whole frame: header + scales + payload."""
        return frame_nbytes(len(self.shape), self.n_scales, self.payload_len, len(self.segments))


def header_nbytes(ndim: int, n_segments: int = 0) -> int:
    """Bytes of a frame header: 44 + 8 * ndim + 8 * n_segments."""
    return _HEADER.size + 8 * ndim + 8 * n_segments


def frame_nbytes(ndim: int, n_scales: int, payload_len: int, n_segments: int = 0) -> int:
    """Exact bytes on the wire of one frame."""
    return header_nbytes(ndim, n_segments) + 4 * n_scales + payload_len


_DIM_MAX = 2**63 - 1  # torch sizes are int64


def _check_range(name: str, value: int, hi: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= hi:
        raise ValueError(
            f"frame header field {name} must be an integer in [0, {hi}], got {value!r}"
        )


def check_header(header: FrameHeader) -> FrameHeader:
    """``header`` itself if every field fits its bytes and agrees with the others, else one
    ``ValueError`` naming the field: the integer fields in range, every dimension and segment
    length a torch size (below 2**63), a known dtype, and ``levels`` that the codec can carry
    (0 for a float codec, 2 up to the codec's digits otherwise). :func:`new_frame` and
    :func:`read_frame` both run it, so no frame is written or read that breaks it."""
    _check_range("method_id", header.method_id, _U8)
    _check_range("levels", header.levels, _U16)
    _check_range("bucket_size", header.bucket_size, _U32)
    _check_range("n_scales", header.n_scales, _U32)
    _check_range("ndim", len(header.shape), _U8)
    _check_range("segments", len(header.segments), _U32)
    for name, dims in (("shape", header.shape), ("segments", header.segments)):
        for dim in dims:
            _check_range(f"{name} entry", dim, _DIM_MAX)
    if header.dtype not in DTYPES:
        raise ValueError(f"frame dtype must be one of {DTYPES}, got {header.dtype}")
    if not isinstance(header.codec, Codec):
        raise ValueError(f"frame header field codec must be a Codec, got {header.codec!r}")
    capacity = header.codec.capacity
    if capacity == 0 and header.levels != 0:
        raise ValueError(
            f"frame header field levels is {header.levels}, but codec {header.codec} carries "
            "floats (levels 0): a corrupted or forged header, discard the frame"
        )
    if capacity and not 2 <= header.levels <= capacity:
        raise ValueError(
            f"frame header field levels is {header.levels}, but codec {header.codec} carries "
            f"2 to {capacity} levels: a corrupted or forged header, discard the frame"
        )
    return header


def check_scales(scales: torch.Tensor, what: str) -> None:
    """``ValueError`` naming how many of ``scales`` are NaN or Inf (one pass over the scales,
    not over the payload): no frame carries, and no decode uses, a non-finite scale."""
    if not scales.numel():
        return
    bad = scales.numel() - int(torch.isfinite(scales).sum())
    if bad:
        raise ValueError(
            f"{what} has {bad} non-finite scale(s) (NaN or Inf) out of {scales.numel()}: "
            "a corrupted or forged message, discard it (encode only finite gradients)"
        )


def new_frame(header: FrameHeader, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A frame of ``header.nbytes`` bytes with its header and scales written, and a view of its
    payload for the caller (a packing kernel) to fill; :func:`seal_frame` then sets the
    checksum. :func:`write_frame` is both steps with a payload already packed. The header must
    pass :func:`check_header` and the scales be finite (``ValueError`` otherwise)."""
    check_header(header)
    if header.segments and sum(header.segments) != header.numel:
        raise ValueError(
            f"segment lengths sum to {sum(header.segments)}, the tensor has {header.numel}"
        )
    if not isinstance(scales, torch.Tensor):
        raise TypeError(f"frame scales must be a torch.Tensor, got {type(scales).__name__}")
    scales = scales.detach().reshape(-1).to("cpu", torch.float32).contiguous()
    if scales.numel() != header.n_scales:
        raise ValueError(f"header says {header.n_scales} scales, got {scales.numel()}")
    check_scales(scales, "a frame")
    fixed = _HEADER.pack(
        MAGIC,
        FORMAT_VERSION,
        0,
        header.method_id,
        header.codec.kind_id,
        DTYPES.index(header.dtype),
        len(header.shape),
        header.codec.param,
        header.levels,
        header.bucket_size,
        header.n_scales,
        len(header.segments),
        header.numel,
        header.payload_len,
        0,
    )
    dims = (*header.shape, *header.segments)
    head = fixed + struct.pack(f"<{len(dims)}Q", *dims)
    out = torch.empty(header.nbytes, dtype=torch.uint8)
    out[: len(head)] = torch.frombuffer(bytearray(head), dtype=torch.uint8)
    scales_end = len(head) + 4 * header.n_scales
    out[len(head) : scales_end] = scales.view(torch.uint8)
    return out, out[scales_end:]


def seal_frame(frame: torch.Tensor) -> torch.Tensor:
    """Write the CRC-32 of a frame made by :func:`new_frame` once its payload is filled
    (``ValueError`` unless a contiguous 1-D uint8 CPU tensor with room for a header)."""
    if not (
        isinstance(frame, torch.Tensor)
        and frame.dtype == torch.uint8
        and frame.dim() == 1
        and frame.device.type == "cpu"
        and frame.is_contiguous()
        and frame.numel() >= _HEADER.size
    ):
        raise ValueError(
            "seal_frame takes the contiguous 1-D uint8 CPU tensor that new_frame returned, got "
            f"{getattr(frame, 'dtype', type(frame).__name__)} of {getattr(frame, 'shape', '?')}"
        )
    frame[_CRC_OFFSET : _CRC_OFFSET + 4] = 0
    crc = crc32(memoryview(frame.numpy()))
    frame[_CRC_OFFSET : _CRC_OFFSET + 4] = torch.frombuffer(
        bytearray(struct.pack("<I", crc)), dtype=torch.uint8
    )
    return frame


def write_frame(header: FrameHeader, scales: torch.Tensor, payload: torch.Tensor) -> torch.Tensor:
    """Serialise one message into a contiguous 1-D uint8 CPU tensor of ``header.nbytes`` bytes."""
    payload = payload.detach().reshape(-1).cpu()
    if payload.dtype != torch.uint8 or payload.numel() != header.payload_len:
        raise ValueError(
            f"payload must be {header.payload_len} uint8 bytes for {header.numel} elements "
            f"in codec {header.codec}, got {payload.numel()} of {payload.dtype}"
        )
    out, body = new_frame(header, scales)
    body.copy_(payload)
    return seal_frame(out)


def _as_bytes_tensor(frame: torch.Tensor | bytes | bytearray | memoryview) -> torch.Tensor:
    if isinstance(frame, (bytes, bytearray, memoryview)):
        data = bytearray(frame)
        return (
            torch.frombuffer(data, dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
        )
    if not isinstance(frame, torch.Tensor):
        raise TypeError(f"a frame is a uint8 tensor or bytes, got {type(frame).__name__}")
    if frame.dtype != torch.uint8:
        raise ValueError(f"a frame is a uint8 tensor, got dtype {frame.dtype}")
    return frame.detach().reshape(-1).cpu().contiguous()


def read_frame(
    frame: torch.Tensor | bytes | bytearray | memoryview,
) -> tuple[FrameHeader, torch.Tensor, torch.Tensor]:
    """Parse and validate a frame: ``(header, scales float32, payload uint8)``.

    The payload is a view into ``frame`` (no copy); the scales are a copy. Raises
    ``ValueError`` naming the problem for anything but an intact frame of this version.
    """
    buf = _as_bytes_tensor(frame)
    n = buf.numel()
    if n < _HEADER.size:
        raise ValueError(
            f"truncated terngrad frame: {n} bytes, a header alone takes {_HEADER.size}"
        )
    raw = bytes(buf[: _HEADER.size].numpy())
    (magic, version, flags, method_id, kind_id, dtype_id, ndim, param, levels, bucket_size,
     n_scales, n_segments, numel, payload_len, crc) = _HEADER.unpack(raw)  # fmt: skip
    if magic != MAGIC:
        raise ValueError(f"not a terngrad frame: magic {magic!r}, expected {MAGIC!r}")
    if version != FORMAT_VERSION:
        raise ValueError(
            f"terngrad frame version {version} is not supported (this terngrad reads "
            f"version {FORMAT_VERSION}); encode and decode with the same terngrad release"
        )
    if flags:
        raise ValueError(f"terngrad frame has unknown flags {flags:#04x} (corrupted header?)")
    expected = frame_nbytes(ndim, n_scales, payload_len, n_segments)
    if n != expected:
        raise ValueError(
            f"terngrad frame length mismatch: its header describes {expected} bytes, got {n} "
            "(truncated, padded or corrupted)"
        )
    actual = zlib.crc32(raw[:_CRC_OFFSET] + b"\0\0\0\0")
    actual = crc32(memoryview(buf.numpy()[_HEADER.size :]), actual)
    if actual != crc:
        raise ValueError("terngrad frame checksum mismatch: the frame was corrupted")
    codec = Codec.from_ids(kind_id, param)
    if dtype_id >= len(DTYPES):
        raise ValueError(f"terngrad frame names unknown dtype id {dtype_id}")
    head_len = header_nbytes(ndim, n_segments)
    dims = struct.unpack(f"<{ndim + n_segments}Q", bytes(buf[_HEADER.size : head_len].numpy()))
    shape, segments = dims[:ndim], dims[ndim:]
    header = FrameHeader(
        method_id, codec, DTYPES[dtype_id], shape, levels, bucket_size, n_scales, segments
    )
    if header.numel != numel:
        raise ValueError(f"terngrad frame shape {shape} does not hold numel {numel}")
    if segments and sum(segments) != numel:
        raise ValueError(f"terngrad frame segments sum to {sum(segments)}, not numel {numel}")
    if header.payload_len != payload_len:
        raise ValueError(
            f"terngrad frame payload of {payload_len} bytes does not match {numel} elements "
            f"in codec {codec} ({header.payload_len} bytes)"
        )
    check_header(header)
    scales_end = head_len + 4 * n_scales
    scales = buf[head_len:scales_end].clone().view(torch.float32)
    check_scales(scales, "terngrad frame")
    return header, scales, buf[scales_end:]
