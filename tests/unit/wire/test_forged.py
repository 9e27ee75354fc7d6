"""Forged frames: a valid frame with a header field altered and its checksum recomputed with the
library's own function (``seal_frame``), so that only the header checks stand between it and a
decode. Each is refused with one line naming the field; the wire's other doors check their
arguments."""

import struct
from dataclasses import replace

import pytest
import torch

from terngrad import quantize, wire
from terngrad.wire import Codec

# offsets of the fixed header fields (see terngrad.wire.frame)
CODEC_PARAM, LEVELS, BUCKET_SIZE, SHAPE = 8, 10, 12, 44


def _refused(kind, match, fn, *args) -> str:
    with pytest.raises(kind, match=match) as exc:
        fn(*args)
    message = str(exc.value)
    assert len(message.splitlines()) == 1, message
    return message


def _frame(name, shape=(300,), **options):
    q = quantize.get(name, **options)
    g = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    return q.encode(g, generator=torch.Generator().manual_seed(1)).to_frame()


def _forge(frame, offset, fmt, value):
    """``frame`` with the field at ``offset`` set to ``value`` and a valid checksum again."""
    out = frame.clone()
    out[offset : offset + struct.calcsize(fmt)] = torch.tensor(
        list(struct.pack(fmt, value)), dtype=torch.uint8
    )
    forged = wire.seal_frame(out)
    assert not torch.equal(forged, frame)
    return forged


def _scales_offset(frame):
    header, _, _ = wire.read_frame(frame)
    return wire.header_nbytes(len(header.shape), len(header.segments))


@pytest.mark.parametrize(
    "name, options, levels, message",
    [
        ("terngrad", {}, 5, "frame header field levels is 5, but codec base3 carries 2 to 3"),
        ("terngrad", {"packing": "2bit"}, 4, "terngrad message: bad levels: 4, where terngrad"),
        ("qsgd", {}, 4, "qsgd message: bad levels: 4, where qsgd has an odd number"),
        ("qsgd", {}, 1, "frame header field levels is 1, but codec base5 carries 2 to 5"),
        ("linear", {}, 9, "frame header field levels is 9, but codec base5 carries 2 to 5"),
        ("bingrad-b", {}, 0, "frame header field levels is 0, but codec base2 carries 2 to 2"),
        ("signsgd", {}, 2, None),  # unchanged: the control
        ("fp32", {}, 3, "frame header field levels is 3, but codec raw32 carries floats"),
    ],
)
def test_levels_that_contradict_the_codec(name, options, levels, message):
    frame = _frame(name, **options)
    if message is None:
        assert quantize.decode(frame).shape == (300,)
        return
    _refused(ValueError, message, quantize.decode, _forge(frame, LEVELS, "<H", levels))


@pytest.mark.parametrize("name", ["terngrad", "qsgd", "signsgd", "linear", "orq", "bingrad-pb"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")], ids=str)
def test_non_finite_scales(name, bad):
    frame = _frame(name)
    forged = _forge(frame, _scales_offset(frame), "<f", bad)
    _refused(ValueError, r"terngrad frame has 1 non-finite scale\(s\)", quantize.decode, forged)


@pytest.mark.parametrize("name", ["terngrad", "qsgd", "signsgd"])
def test_negative_magnitudes(name):
    frame = _frame(name)
    forged = _forge(frame, _scales_offset(frame), "<f", -1.5)
    _refused(
        ValueError, f"{name} message: bad scales: a scale of -1.5 where", quantize.decode, forged
    )


@pytest.mark.parametrize("name", ["terngrad", "signsgd", "fp32"])
def test_a_bucket_size_the_scales_do_not_count(name):
    frame = _frame(name)  # one bucket (terngrad, signsgd) or none (fp32)
    forged = _forge(frame, BUCKET_SIZE, "<I", 7)
    if name == "fp32":  # no scales whatever the buckets: still the same values
        assert torch.equal(quantize.decode(forged), quantize.decode(frame))
        return
    _refused(ValueError, f"{name} message: bad n_scales: .* 43 buckets needs 43 scales, got 1",
             quantize.decode, forged)  # fmt: skip


def test_more_scales_than_the_layout_has():
    enc = quantize.get("terngrad").encode(torch.randn(300))
    frame = wire.write_frame(replace(enc.header, n_scales=2), enc.scales.repeat(2), enc.payload)
    _refused(ValueError, "terngrad message: bad n_scales: .* needs 1 scales, got 2",
             quantize.decode, frame)  # fmt: skip


def test_a_codec_parameter_out_of_range():
    frame = _frame("terngrad", packing="2bit")
    _refused(ValueError, "frame header field codec param: bits must be", quantize.decode,
             _forge(frame, CODEC_PARAM, "<H", 0))  # fmt: skip


def test_absurd_shapes_are_bounded_by_the_frame():
    empty = _frame("fp32", shape=(0, 3))  # numel 0: any second dimension keeps it 0
    limit = r"field shape entry must be an integer in \[0, 9223372036854775807\], got 18446"
    _refused(ValueError, limit, quantize.decode, _forge(empty, SHAPE + 8, "<Q", 2**64 - 1))
    frame = _frame("terngrad")
    huge = _forge(_forge(frame, SHAPE, "<Q", 2**40), 24, "<Q", 2**40)  # shape and numel agree
    _refused(ValueError, "payload of 60 bytes does not match 1099511627776 elements",
             quantize.decode, huge)  # fmt: skip


def test_writing_checks_the_same_header():
    enc = quantize.get("qsgd").encode(torch.randn(300))
    for field, value, message in [
        ("levels", 7, "levels is 7, but codec base5 carries 2 to 5"),
        ("shape", (-1,), r"shape entry must be an integer in \[0, "),
        ("n_scales", -1, r"n_scales must be an integer in \[0, "),
        ("codec", "base5", "codec must be a Codec"),
    ]:
        _refused(ValueError, message, wire.new_frame, replace(enc.header, **{field: value}),
                 enc.scales)  # fmt: skip
    nan = enc.scales.clone().fill_(float("nan"))
    _refused(ValueError, r"a frame has 1 non-finite scale\(s\)", wire.write_frame, enc.header, nan,
             enc.payload)  # fmt: skip
    _refused(ValueError, "seal_frame takes the contiguous 1-D uint8 CPU tensor", wire.seal_frame,
             torch.zeros(10, dtype=torch.uint8))  # fmt: skip


def test_pack_and_unpack_check_their_arguments():
    packed = wire.pack_base3(torch.ones(10, dtype=torch.long))
    _refused(ValueError, "numel must be a count of digits", wire.unpack_base3, packed, -5)
    _refused(TypeError, "numel must be an integer count", wire.unpack_base3, packed, 10.0)
    _refused(TypeError, "packed data must be a uint8 torch.Tensor", wire.unpack_base3,
             bytes(packed.numpy()), 10)  # fmt: skip
    _refused(ValueError, "bits must be an integer", wire.pack_nbit, torch.ones(3, dtype=torch.long),
             True)  # fmt: skip
    floats = torch.randn(4)  # four float32 values are not the 16 bytes that hold them
    _refused(ValueError, "raw32 unpack: packed data must be a uint8 tensor", Codec.raw32().unpack,
             floats, 4)  # fmt: skip
    _refused(ValueError, "numel must be a count", Codec.base(3).nbytes, -1)
