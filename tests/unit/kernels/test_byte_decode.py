"""The fused decode of digits packed in bytes (base 3: five trits a byte; 2 bits: four digits)
against the torch reference, bit for bit: its 256-row tables
(``kernels.decode_cpu._digit_table``, the values of a bucket through ``_values_into``, or the
digits and the formula in a small bucket) on every byte value, random payloads of every length
modulo the digits a byte, buckets on either side of the table's threshold and scales past the
overflow limit."""

import pytest
import torch

from terngrad.kernels import NumbaKernels, TorchKernels
from terngrad.kernels.decode_cpu import _TABLE_MIN_PER_DIGIT, _digit_table
from terngrad.quantize import Layout
from terngrad.quantize.grid import overflow_limit
from terngrad.wire import Codec, word_layout

REF, FUSED = TorchKernels(), NumbaKernels()

#: the byte codecs: base 3 (k = 5), 2 bits (base 4, k = 4), base 2 (k = 8) and base 16 (k = 2)
CODECS = [Codec.base(3), Codec.nbit(2), Codec.nbit(1), Codec.nbit(4)]


def _decoded(backend, payload, codec, numel, offset, divisor, lo, layout, scales):
    out = torch.full((numel,), float("nan"))
    backend.decode_into(out, payload, codec, offset, divisor, lo, layout, scales)
    return out


@pytest.mark.parametrize("codec", CODECS, ids=str)
def test_the_digit_table_is_the_reference_unpack_of_every_byte(codec):
    base = codec.capacity
    k, w = word_layout(base)
    assert w == 1
    table = _digit_table(base, k)
    for value in range(base**k):  # a one-byte payload of k digits: plane t is digit t
        digits = codec.unpack(torch.tensor([value], dtype=torch.uint8), k)
        assert table[:, value].tolist() == digits.tolist(), value


@pytest.mark.parametrize("codec", CODECS, ids=str)
def test_every_byte_value_decodes_as_the_reference(codec):
    base = codec.capacity
    k = word_layout(base)[0]
    payload = torch.arange(base**k, dtype=torch.uint8).repeat(12)  # every byte value
    numel = payload.numel() * k
    assert numel // 3 >= _TABLE_MIN_PER_DIGIT * k
    for bucket in (None, 7, numel // 3):  # tables of values, the formula, both
        layout = Layout.of(numel, None, bucket)
        scales = torch.rand(layout.n_buckets, generator=torch.Generator().manual_seed(1))
        m = (base - 1) // 2 or 1
        args = (payload, codec, numel, m, m, 0, layout, scales)
        assert torch.equal(_decoded(REF, *args), _decoded(FUSED, *args))


@pytest.mark.parametrize("codec", CODECS, ids=str)
@pytest.mark.parametrize("extra", range(8))
def test_random_payloads_of_every_length_decode_as_the_reference(codec, extra):
    """``k * BLOCK_WORDS * 7 + extra`` digits (several tasks, a last partial block and byte)
    standing for flat elements ``5 ..`` of layouts of one bucket a segment (tables of values),
    buckets of 3 bytes (the formula) and both, a scale past the overflow limit in each."""
    base = codec.capacity
    k = word_layout(base)[0]
    numel = k * 1024 * 7 + extra
    gen = torch.Generator().manual_seed(extra)
    payload = codec.pack(torch.randint(0, base, (numel,), generator=gen))
    large = 2 * _TABLE_MIN_PER_DIGIT * k + 1
    layouts = [
        Layout.of(numel + 5, (5, numel), None),
        Layout.of(numel + 5, None, 3 * k),
        Layout.of(numel + 5, (5, numel // 2, numel - numel // 2), large),
    ]
    offset = base - 1
    for layout in layouts:
        scales = torch.rand(layout.n_buckets, generator=gen) * 3
        big = min(overflow_limit(offset) * 1.5, torch.finfo(torch.float32).max)
        scales[len(scales) // 2] = big  # c * s would overflow (where offset > 1)
        args = (payload, codec, numel, offset, offset, 5, layout, scales)
        assert torch.equal(_decoded(REF, *args), _decoded(FUSED, *args))


@pytest.mark.parametrize("numel", [1, 3, 4, 6, 5_121])
def test_bad_bytes_and_padding_are_refused(numel):
    codec = Codec.base(3)
    good = codec.pack(torch.ones(numel, dtype=torch.int64))
    layout = Layout.of(numel)
    FUSED.decode_into(torch.empty(numel), good, codec, 1, 1, 0, layout, torch.ones(1))
    bad_byte = good.clone()
    bad_byte[-1] = 243
    padded = good.clone()
    padded[-1] += 3**4  # digit 4 of the last byte: padding in each of these lengths
    for payload in (bad_byte, padded):
        with pytest.raises(ValueError, match="corrupt"):
            FUSED.decode_into(torch.empty(numel), payload, codec, 1, 1, 0, layout, torch.ones(1))
        with pytest.raises(ValueError):
            codec.unpack(payload, numel)
