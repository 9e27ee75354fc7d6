"""Frames: round trips, exact sizes, and every kind of damage raising ValueError."""

import struct
import zlib

import pytest
import torch

from terngrad import wire
from terngrad.wire import Codec, FrameHeader
from terngrad.wire.checksum import crc32, crc32_combine

BASE3 = Codec.base(3)


def _frame(shape=(7, 3), codec=BASE3, n_scales=2, segments=()):
    header = FrameHeader(
        method_id=2, codec=codec, dtype=torch.float16, shape=shape, levels=3,
        bucket_size=16, n_scales=n_scales, segments=segments,
    )  # fmt: skip
    numel = header.numel
    digits = torch.randint(0, 3, (numel,), generator=torch.Generator().manual_seed(0))
    scales = torch.arange(1, n_scales + 1, dtype=torch.float32) / 7
    return header, scales, codec.pack(digits), wire.write_frame(header, scales, codec.pack(digits))


def _rewrite(frame, offset, fmt, value):
    """Change one header field and fix the checksum, to reach the checks behind it."""
    import zlib

    out = frame.clone()
    out[offset : offset + struct.calcsize(fmt)] = torch.tensor(
        list(struct.pack(fmt, value)), dtype=torch.uint8
    )
    out[40:44] = 0
    crc = zlib.crc32(bytes(out.numpy()))
    out[40:44] = torch.tensor(list(struct.pack("<I", crc)), dtype=torch.uint8)
    return out


def test_round_trip_and_size():
    header, scales, payload, frame = _frame()
    assert frame.dtype == torch.uint8 and frame.dim() == 1
    assert frame.numel() == header.nbytes == 44 + 8 * 2 + 4 * 2 + payload.numel()
    got_header, got_scales, got_payload = wire.read_frame(frame)
    assert got_header == header
    assert torch.equal(got_scales, scales) and torch.equal(got_payload, payload)
    # bytes work too, and frames at odd offsets of a larger buffer
    assert wire.read_frame(bytes(frame.numpy()))[0] == header
    bigger = torch.cat([torch.zeros(3, dtype=torch.uint8), frame])
    assert torch.equal(wire.read_frame(bigger[3:])[1], scales)


def test_segments_round_trip():
    header, scales, payload, frame = _frame(segments=(5, 0, 16))
    assert frame.numel() == 44 + 8 * 2 + 8 * 3 + 4 * 2 + payload.numel()
    assert wire.read_frame(frame)[0].segments == (5, 0, 16)
    from dataclasses import replace

    with pytest.raises(ValueError, match="segment lengths sum to 20"):
        wire.write_frame(replace(header, segments=(4, 16)), scales, payload)


def test_empty_and_scalar_shapes():
    for shape in [(0,), (), (5, 0, 2)]:
        *_, frame = _frame(shape=shape, n_scales=0)
        assert wire.read_frame(frame)[0].shape == shape


def test_every_truncation_raises():
    *_, frame = _frame()
    for n in range(frame.numel()):
        with pytest.raises(ValueError):
            wire.read_frame(frame[:n])
    with pytest.raises(ValueError, match="length mismatch"):
        wire.read_frame(torch.cat([frame, torch.zeros(1, dtype=torch.uint8)]))


def test_every_single_bit_flip_raises():
    *_, frame = _frame()
    for i in range(frame.numel()):
        for bit in (0, 7):
            bad = frame.clone()
            bad[i] ^= 1 << bit
            with pytest.raises(ValueError):
                wire.read_frame(bad)


def test_specific_messages():
    *_, frame = _frame()
    for version in (1, 3):  # 1: the interleaved base-B layout before the planar one
        with pytest.raises(ValueError, match=f"version {version} is not supported"):
            wire.read_frame(_rewrite(frame, 2, "<B", version))
    with pytest.raises(ValueError, match="not a terngrad frame"):
        wire.read_frame(_rewrite(frame, 0, "<2s", b"XX"))
    with pytest.raises(ValueError, match="unknown codec id"):
        wire.read_frame(_rewrite(frame, 5, "<B", 9))
    with pytest.raises(ValueError, match="unknown dtype"):
        wire.read_frame(_rewrite(frame, 6, "<B", 9))
    with pytest.raises(ValueError, match="unknown flags"):
        wire.read_frame(_rewrite(frame, 3, "<B", 1))
    with pytest.raises(ValueError, match="does not hold numel"):
        wire.read_frame(_rewrite(frame, 24, "<Q", 22))
    *_, with_segments = _frame(segments=(5, 16))
    with pytest.raises(ValueError, match="segments sum to 22"):
        wire.read_frame(_rewrite(with_segments, 44 + 16 + 8, "<Q", 17))
    with pytest.raises(ValueError, match="checksum"):
        bad = frame.clone()
        bad[-1] ^= 0x10
        wire.read_frame(bad)
    with pytest.raises(ValueError, match="truncated"):
        wire.read_frame(frame[:10])
    with pytest.raises(ValueError, match="uint8"):
        wire.read_frame(frame.float())


def test_write_rejects_inconsistent_parts():
    header, scales, payload, _ = _frame()
    with pytest.raises(ValueError, match="scales"):
        wire.write_frame(header, scales[:1], payload)
    with pytest.raises(ValueError, match="payload"):
        wire.write_frame(header, scales, payload[:-1])


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("size", [0, 1, 1000, (1 << 20) - 1, (1 << 20) + 7, 3_000_001])
def test_parallel_crc_is_zlib_crc(size, threads):
    data = memoryview(bytes(torch.randint(0, 256, (size,), dtype=torch.uint8).numpy()))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        assert crc32(data) == zlib.crc32(data)
        assert crc32(data, 0xDEADBEEF) == zlib.crc32(data, 0xDEADBEEF)
    finally:
        torch.set_num_threads(before)


def test_crc_combine():
    a, b = b"terngrad " * 1000, b"frames" * 77
    assert crc32_combine(zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(a + b)
    assert crc32_combine(zlib.crc32(a), zlib.crc32(b""), 0) == zlib.crc32(a)
