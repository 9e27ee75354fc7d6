"""``decode_into(..., accumulate=True)``: ``out += decode``, bit for bit the float32 sum of the
buffer and a fresh decode, on both backends, for digits packed in bytes (tables of values and
the formula), in words of several bytes, scales past the overflow limit, and a range starting
inside the layout; a corrupt payload is refused as without it."""

import pytest
import torch

from terngrad.kernels import NumbaKernels, TorchKernels
from terngrad.kernels.decode_cpu import _TABLE_MIN_PER_DIGIT
from terngrad.quantize import Layout
from terngrad.quantize.grid import overflow_limit
from terngrad.wire import Codec, word_layout

BACKENDS = {"torch": TorchKernels(), "numba": NumbaKernels()}

#: base 3 (five trits a byte), 2 bits, base 9 (two digits in two bytes: no tables), base 17
CODECS = [Codec.base(3), Codec.nbit(2), Codec.base(9), Codec.base(17)]


def _layouts(numel: int, k: int) -> list[Layout]:
    """Flat elements ``5 ..`` of: one bucket a segment (tables), buckets of ``3 k`` (the
    formula), and large buckets of both kinds."""
    large = 2 * _TABLE_MIN_PER_DIGIT * k + 1
    return [
        Layout.of(numel + 5, (5, numel), None),
        Layout.of(numel + 5, None, 3 * k),
        Layout.of(numel + 5, (5, numel // 2, numel - numel // 2), large),
    ]


@pytest.mark.parametrize("backend", BACKENDS, ids=str)
@pytest.mark.parametrize("codec", CODECS, ids=str)
@pytest.mark.parametrize("extra", (0, 3))
def test_accumulate_is_the_sum_of_the_buffer_and_a_fresh_decode(backend, codec, extra):
    kernels = BACKENDS[backend]
    base = codec.capacity
    k = word_layout(base)[0]
    numel = k * 1024 * 5 + extra
    gen = torch.Generator().manual_seed(extra)
    payload = codec.pack(torch.randint(0, base, (numel,), generator=gen))
    offset = (base - 1) // 2
    for layout in _layouts(numel, k):
        scales = torch.rand(layout.n_buckets, generator=gen) * 3
        scales[len(scales) // 2] = min(overflow_limit(offset) * 1.5, 3e38)
        args = (payload, codec, offset, offset, 5, layout, scales)
        fresh = torch.empty(numel)
        kernels.decode_into(fresh, *args)
        before = torch.randn(numel, generator=gen)
        before[::7] = -0.0  # the sign of a zero survives as in a plain addition
        got = before.clone()
        kernels.decode_into(got, *args, accumulate=True)
        expected = before + fresh
        assert torch.equal(got, expected)
        assert torch.equal(got.signbit(), expected.signbit())


@pytest.mark.parametrize("codec", CODECS, ids=str)
def test_the_backends_accumulate_alike(codec):
    base = codec.capacity
    numel = 40_000
    gen = torch.Generator().manual_seed(3)
    payload = codec.pack(torch.randint(0, base, (numel,), generator=gen))
    layout = Layout.of(numel, None, 512)
    scales = torch.rand(layout.n_buckets, generator=gen)
    start = torch.randn(numel, generator=gen)
    outs = []
    for kernels in BACKENDS.values():
        out = start.clone()
        for _ in range(3):  # three messages added in turn, as own_scales sums a step's
            kernels.decode_into(out, payload, codec, base // 2, base // 2, 0, layout, scales,
                                accumulate=True)  # fmt: skip
        outs.append(out)
    assert torch.equal(*outs)


@pytest.mark.parametrize("backend", BACKENDS, ids=str)
def test_a_corrupt_payload_is_refused_when_accumulating(backend):
    codec = Codec.base(3)
    numel = 5 * 64
    payload = torch.full((codec.nbytes(numel),), 255, dtype=torch.uint8)  # 255 >= 3**5
    layout = Layout.of(numel)
    with pytest.raises(ValueError, match=r"invalid|corrupt|digit"):
        BACKENDS[backend].decode_into(
            torch.zeros(numel), payload, codec, 1, 1, 0, layout, torch.ones(1), accumulate=True
        )
