"""Packers: exact round trips for every codec and length, fixed byte layouts, validation."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from terngrad import wire
from terngrad.wire import Codec

# every integer codec the quantizers and the exchange use, plus awkward ones
CODECS = [Codec.nbit(b) for b in (1, 2, 3, 4, 5, 7, 8, 12, 16)] + [
    Codec.base(b) for b in (2, 3, 4, 5, 7, 9, 17, 255, 256, 257, 401, 65535)
]


def _bound(codec: Codec) -> int:
    return 1 << codec.param if codec.kind == "nbit" else codec.param


@pytest.mark.parametrize("codec", CODECS, ids=str)
def test_round_trip_every_length_0_to_1000(codec):
    gen = torch.Generator().manual_seed(codec.param)
    for n in range(1001):
        digits = torch.randint(0, _bound(codec), (n,), generator=gen)
        packed = codec.pack(digits)
        assert packed.dtype == torch.uint8 and packed.numel() == codec.nbytes(n)
        assert torch.equal(codec.unpack(packed, n).long(), digits)


@pytest.mark.parametrize("codec", CODECS, ids=str)
def test_extreme_digits_round_trip(codec):
    top = _bound(codec) - 1
    for digits in (torch.full((997,), top), torch.zeros(997, dtype=torch.long)):
        assert torch.equal(codec.unpack(codec.pack(digits), 997).long(), digits)


@settings(max_examples=200, deadline=None)
@given(
    data=st.data(),
    codec=st.sampled_from(CODECS),
    n=st.integers(min_value=0, max_value=3000),
)
def test_round_trip_hypothesis(data, codec, n):
    values = data.draw(st.lists(st.integers(0, _bound(codec) - 1), min_size=n, max_size=n))
    digits = torch.tensor(values, dtype=torch.long)
    assert torch.equal(codec.unpack(codec.pack(digits), n).long(), digits)


def test_base3_layout_five_trits_per_byte():
    # 11 digits, one block of L = ceil(11 / 5) = 3 words; word j holds digits j, j+3, ..., j+12:
    # byte j = d[j] + 3 d[j+3] + 9 d[j+6] + 27 d[j+9] + 81 d[j+12] (digits past 10 are padding)
    d = [1, 2, 0, 0, 1, 2, 2, 2, 2, 2, 1]
    packed = wire.pack_base3(torch.tensor(d))
    assert packed.tolist() == [1 + 9 * 2 + 27 * 2, 2 + 3 * 1 + 9 * 2 + 27 * 1, 3 * 2 + 9 * 2]
    assert wire.word_layout(3) == (5, 1)
    assert wire.base_nbytes(1_000_000, 3) == 200_000  # 1.6 bits per trit


def test_planar_blocks_of_1024_words():
    """Full blocks of 1024 words, then a shorter last block: word j of a block holds the
    block's digits j, j + L, j + 2L, ... (L its words)."""
    k, block = 5, wire.BLOCK_WORDS * 5
    n = 2 * block + 13  # two full blocks and a last block of 3 words
    digits = torch.randint(0, 3, (n,), generator=torch.Generator().manual_seed(1))
    packed = wire.pack_base3(digits).long()
    assert packed.numel() == 2 * wire.BLOCK_WORDS + 3
    powers = torch.tensor([3**t for t in range(k)])
    for b in range(2):
        planes = digits[b * block : (b + 1) * block].view(k, wire.BLOCK_WORDS)
        words = (planes * powers[:, None]).sum(0)
        assert torch.equal(packed[b * wire.BLOCK_WORDS : (b + 1) * wire.BLOCK_WORDS], words)
    tail = torch.nn.functional.pad(digits[2 * block :], (0, 2)).view(k, 3)
    assert torch.equal(packed[-3:], (tail * powers[:, None]).sum(0))
    assert torch.equal(wire.unpack_base3(packed.to(torch.uint8), n).long(), digits)


def test_2bit_layout_planar():
    # 5 digits, L = 2 bytes: byte j = d[j] | d[j+2] << 2 | d[j+4] << 4 | d[j+6] << 6
    packed = wire.pack_2bit(torch.tensor([1, 2, 3, 0, 2]))
    assert packed.tolist() == [1 | 3 << 2 | 2 << 4, 2 | 0 << 2]


def test_nbit_layout_is_a_bit_stream():
    # 3-bit digits 5 (101) and 6 (110): stream bits 1,0,1,0,1,1 -> 0b110101
    assert wire.pack_nbit(torch.tensor([5, 6]), 3).tolist() == [0b110101]
    # 12-bit digit 0xABC then 0x123: bytes BC, 3A, 12
    assert wire.pack_nbit(torch.tensor([0xABC, 0x123]), 12).tolist() == [0xBC, 0x3A, 0x12]


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
def test_nbit_equals_base_power_of_two_layout(bits):
    digits = torch.randint(0, 1 << bits, (1001,), generator=torch.Generator().manual_seed(bits))
    assert torch.equal(wire.pack_nbit(digits, bits), wire.pack_base(digits, 1 << bits))


def test_word_layout_is_efficient():
    for base in range(2, 2000):
        k, w = wire.word_layout(base)
        assert base**k <= (2**63 if w == 8 else 2 ** (8 * w))
        # no other word size does better
        for other in (1, 2, 4, 8):
            limit = 2**63 if other == 8 else 2 ** (8 * other)
            kk = math.floor(math.log(limit, base) + 1e-9)
            while base ** (kk + 1) <= limit:
                kk += 1
            while base**kk > limit:
                kk -= 1
            if kk:
                assert 8 * w / k <= 8 * other / kk + 1e-12
    assert wire.word_layout(9) == (5, 2)  # sums of 4 ternary codes: 3.2 bits


@pytest.mark.parametrize("codec", [Codec.nbit(2), Codec.base(3), Codec.base(9)], ids=str)
def test_digits_out_of_range_rejected(codec):
    with pytest.raises(ValueError, match="digits must lie in"):
        codec.pack(torch.tensor([0, _bound(codec)]))
    with pytest.raises(ValueError, match="digits must lie in"):
        codec.pack(torch.tensor([-1]))
    with pytest.raises(ValueError, match="integer tensor"):
        codec.pack(torch.tensor([0.5]))


def test_wrong_packed_length_rejected():
    packed = wire.pack_base3(torch.ones(10, dtype=torch.long))
    with pytest.raises(ValueError, match="expected 2 packed bytes"):
        wire.unpack_base3(packed[:1], 10)
    with pytest.raises(ValueError, match="expected"):
        wire.unpack_2bit(torch.zeros(3, dtype=torch.uint8), 20)


def test_invalid_words_and_padding_rejected():
    with pytest.raises(ValueError, match="exceeds"):
        wire.unpack_base3(torch.tensor([243], dtype=torch.uint8), 5)
    with pytest.raises(ValueError, match="padding"):  # 3 trits used, digit 4 set
        wire.unpack_base3(torch.tensor([81], dtype=torch.uint8), 3)
    with pytest.raises(ValueError, match="padding"):
        wire.unpack_2bit(torch.tensor([0b11000000], dtype=torch.uint8), 3)
    k, w = wire.word_layout(5)  # 8-byte words: a top byte >= 128 is not a valid word
    with pytest.raises(ValueError, match="exceeds"):
        wire.unpack_base(torch.full((w,), 255, dtype=torch.uint8), 5, k)


def test_bad_codec_parameters():
    for bad in (0, 17):
        with pytest.raises(ValueError, match="bits must be"):
            Codec.nbit(bad)
    for bad in (1, 65536):
        with pytest.raises(ValueError, match="base must be"):
            Codec.base(bad)
    with pytest.raises(ValueError, match="unknown codec kind"):
        Codec("zip")


def test_raw_codecs_round_trip_floats():
    x = torch.randn(101)
    assert torch.equal(Codec.raw32().unpack(Codec.raw32().pack(x), 101), x)
    assert torch.equal(Codec.raw16().unpack(Codec.raw16().pack(x), 101), x.half())
    assert Codec.raw16().nbytes(101) == 202
