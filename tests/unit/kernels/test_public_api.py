"""The public API on the fused kernels: ``encode``/``decode`` of every digit-packing quantizer
(TernGrad and QSGD on the shared grid; Linear, ORQ, BinGrad-b/pb and scaled sign on their own
levels) give the reference's bytes and values exactly, and the reference's errors; the level
quantizers' ``variance`` too (it runs the same fit). The default (``kernels="auto"``) runs the
numba kernels (counted here), ``kernels="torch"`` the reference."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from terngrad import quantize
from terngrad.kernels import (
    NumbaKernels,
    TorchKernels,
    TritonKernels,
    triton_available,
)
from terngrad.wire import Codec

OPS = ("grid_prepare", "grid_pack", "decode_into", "level_fit", "level_pack", "level_decode")


def _counting(monkeypatch, cls) -> Counter:
    """Calls of each operation of ``cls``, counted on the class (its cached instances too)."""
    calls: Counter = Counter()
    for op in OPS:
        original = getattr(cls, op)

        def counted(self, *args, _op=op, _original=original):
            calls[_op] += 1
            return _original(self, *args)

        monkeypatch.setattr(cls, op, counted)
    return calls


@pytest.fixture
def fused_calls(monkeypatch) -> Counter:
    """How many times each numba operation ran."""
    return _counting(monkeypatch, NumbaKernels)


CASES = [
    ("terngrad", {}),
    ("terngrad", {"clip": None}),
    ("terngrad", {"bucket_size": 100}),
    ("terngrad", {"packing": "2bit"}),
    ("qsgd", {}),
    ("qsgd", {"levels": 9, "norm": "l2", "bucket_size": 64}),
    ("qsgd", {"levels": 3, "bucket_size": None}),
]


def _both(fn):
    """``fn(kernels)`` on the default kernels (the fused ones), then on the reference."""
    return fn(None), fn("torch")


LEVEL_CASES = [
    ("linear", {}),
    ("linear", {"levels": 3, "bucket_size": None}),
    ("linear", {"levels": 17, "bucket_size": 100}),
    ("orq", {}),
    ("orq", {"levels": 3, "bucket_size": 100}),
    ("orq", {"levels": 9, "bucket_size": 1000, "sweeps": 6}),
    ("orq", {"levels": 5, "bucket_size": None, "sweeps": 0}),
    ("orq", {"levels": 20, "bucket_size": 300}),  # more than 16 levels: the binary search
    ("bingrad-b", {}),
    ("bingrad-b", {"bucket_size": None}),
    ("bingrad-pb", {}),
    ("bingrad-pb", {"bucket_size": 77}),
    ("signsgd", {}),
    ("signsgd", {"bucket_size": 512}),
]


def _awkward_gradient(n: int, seed: int) -> torch.Tensor:
    """Heavy tails, runs of equal values, signed zeros, a constant bucket, subnormals."""
    gen = torch.Generator().manual_seed(seed)
    g = torch.randn(n, generator=gen) * torch.rand(n, generator=gen) ** 4
    g[123] = 40.0
    g[500:600] = 0.0
    g[700:710] = -0.0
    g[1000:1600] = 1.5  # a bucket of 512 (and of 100, 300) holding one value
    g[2000:2050] = torch.tensor(1e-40)  # subnormal
    g[3000:3100:2] = -2.0  # ties between levels and data
    return g


@pytest.mark.parametrize(("name", "options"), CASES)
@pytest.mark.parametrize("segments", [None, (40_000, 3, 0, 20_000, 997)])
def test_fused_encode_and_decode_are_the_reference_bit_for_bit(
    name, options, segments, fused_calls
):
    q = quantize.get(name, **options)
    gen = torch.Generator().manual_seed(7)
    g = torch.randn(61_000, generator=gen) * torch.rand(61_000, generator=gen) ** 4
    g[123] = 40.0  # a heavy tail: clipping and saturation matter

    def run(kernels):
        enc = q.encode(g, torch.Generator().manual_seed(3), segments=segments, kernels=kernels)
        return enc, q.decode(enc, kernels=kernels)

    (fused, fused_out), (ref, ref_out) = _both(run)
    assert fused_calls["grid_pack"] == 1 and fused_calls["decode_into"] == 1  # numba ran
    assert torch.equal(fused.payload, ref.payload)
    assert torch.equal(fused.scales, ref.scales)
    assert torch.equal(fused.to_frame(), ref.to_frame())
    assert torch.equal(fused_out, ref_out)


@pytest.mark.parametrize(("name", "options"), CASES[:3] + CASES[4:6])
def test_imposed_scales_and_given_draws_match_the_reference(name, options):
    q = quantize.get(name, **options)
    g = torch.randn(5_000, generator=torch.Generator().manual_seed(1))
    n = quantize.Layout.of(5_000, None, q.bucket_size).n_buckets
    scale = torch.linspace(0.5, 3.0, n)  # smaller than max|g| in places: saturation
    u = torch.rand(5_000, generator=torch.Generator().manual_seed(2))
    fused, ref = _both(lambda kernels: q.encode(g, scale=scale, uniform=u, kernels=kernels))
    assert torch.equal(fused.payload, ref.payload) and torch.equal(fused.scales, ref.scales)


@pytest.mark.parametrize("kernels", [None, "torch", "numba"])
def test_every_backend_keeps_the_reference_errors(kernels):
    q = quantize.get("terngrad")
    g = torch.randn(1000)
    g[[3, 9]] = float("nan")
    with pytest.raises(ValueError, match="gradient has 2 non-finite value"):
        q.encode(g, kernels=kernels)
    two_bit = quantize.get("terngrad", packing="2bit")
    enc = two_bit.encode(torch.randn(1000), kernels=kernels)
    enc.payload[0] = 0xFF  # digit 3 in a 3-level message: the quantizer checks the digits
    with pytest.raises(ValueError, match="terngrad message has a digit 3 beyond its 3 levels"):
        two_bit.decode(enc, kernels=kernels)
    base3 = q.encode(torch.randn(1000), kernels=kernels)
    base3.payload[0] = 250  # not a base-3 word
    with pytest.raises(ValueError, match="corrupted"):
        q.decode(base3, kernels=kernels)
    floats = quantize.Encoded(**{**vars(base3), "codec": quantize.get("fp32").codec})
    with pytest.raises(ValueError, match="packs raw32 floats where it packs digits"):
        q.decode(floats, kernels=kernels)


@pytest.mark.parametrize("name", quantize.names())
def test_decode_into_a_given_buffer(name):
    q = quantize.get(name)
    g = torch.randn(30, 50, generator=torch.Generator().manual_seed(4))
    enc = q.encode(g, torch.Generator().manual_seed(5))
    buf = torch.full((30, 50), 7.0)
    assert q.decode(enc, out=buf) is buf
    assert torch.equal(buf, q.decode(enc))
    flat = torch.empty(1500)  # any shape of as many elements
    assert torch.equal(q.decode(enc, out=flat).view(30, 50), buf)
    for bad in (torch.empty(10), torch.empty(1500, dtype=torch.float64), buf.t()):
        with pytest.raises(ValueError, match="out must be a contiguous float32 tensor"):
            q.decode(enc, out=bad)


@pytest.mark.parametrize(("name", "options"), LEVEL_CASES)
@pytest.mark.parametrize("segments", [None, (10_000, 3, 0, 1, 10_000)])
def test_level_quantizers_are_the_reference_bit_for_bit(name, options, segments, fused_calls):
    q = quantize.get(name, **options)
    g = _awkward_gradient(20_004, seed=7)

    def run(kernels):
        enc = q.encode(g, torch.Generator().manual_seed(3), segments=segments, kernels=kernels)
        return (
            enc,
            q.decode(enc, kernels=kernels),
            q.variance(g, segments=segments, kernels=kernels),
        )

    (fused, fused_out, fused_var), (ref, ref_out, ref_var) = _both(run)
    assert fused_calls["level_pack"] == 1 and fused_calls["level_decode"] == 1  # numba ran
    assert fused_calls["level_fit"] == 2  # encode's and variance's
    assert torch.equal(fused.scales, ref.scales)
    assert torch.equal(fused.payload, ref.payload)
    assert torch.equal(fused.to_frame(), ref.to_frame())
    assert torch.equal(fused_out, ref_out)
    assert fused_var == ref_var


@pytest.mark.parametrize("name", ["linear", "orq", "bingrad-pb"])
def test_level_quantizers_with_given_draws_match_the_reference(name):
    q = quantize.get(name, bucket_size=64)
    g = torch.randn(5_000, generator=torch.Generator().manual_seed(1))
    u = torch.rand(5_000, generator=torch.Generator().manual_seed(2))
    fused, ref = _both(lambda kernels: q.encode(g, uniform=u, kernels=kernels))
    assert torch.equal(fused.payload, ref.payload) and torch.equal(fused.scales, ref.scales)


@pytest.mark.parametrize(
    ("name", "options"), [c for c in LEVEL_CASES if quantize.get(c[0], **c[1]).bucket_size]
)
def test_level_fits_on_extreme_buckets(name, options):
    """Buckets of one and two elements, values at float32's limits, all equal: same bits."""
    q = quantize.get(name, **options)
    size = q.bucket_size
    parts = [
        torch.tensor([3.0e38, -3.0e38, 0.0, 3.4028235e38]).repeat(size // 4 + 1)[:size],
        torch.full((size,), -7.0),
        torch.tensor([1.0, 2.0]).repeat(size // 2 + 1)[:size],
        torch.tensor([5.0]),  # a last bucket of one element
    ]
    g = torch.cat(parts)
    fused, ref = _both(
        lambda kernels: q.encode(g, torch.Generator().manual_seed(0), kernels=kernels)
    )
    assert torch.equal(fused.scales, ref.scales) and torch.equal(fused.payload, ref.payload)
    assert torch.isfinite(q.decode(fused)).all()


@pytest.mark.parametrize("kernels", ["numba", "torch"])
@pytest.mark.parametrize("name", ["linear", "orq", "bingrad-b", "bingrad-pb", "signsgd"])
def test_level_quantizers_keep_the_reference_errors(name, kernels):
    q = quantize.get(name)
    negative_nan = torch.tensor([0xFFC00000], dtype=torch.int64).to(torch.int32).view(torch.float32)
    layout = quantize.Layout.of(2000, None, q.bucket_size)
    for bad in (float("inf"), -float("inf"), float("nan"), float(negative_nan)):
        g = torch.randn(2000)
        g[[5, 77, 1999]] = bad  # found by the fit kernel itself (no pass of its own)
        assert quantize.resolve(kernels).level_fit(q, g, layout) is None
        with pytest.raises(ValueError, match="gradient has 3 non-finite value"):
            q.encode(g, kernels=kernels)
        with pytest.raises(ValueError, match="gradient has 3 non-finite value"):
            q.variance(g, kernels=kernels)
        with pytest.raises(ValueError, match="gradient has 3 non-finite value"):
            q.scales(g, layout, kernels=kernels)
    enc = q.encode(torch.randn(2000), kernels=kernels)
    enc.payload[:8] = 0xFF  # a word beyond the base's largest (or, in base 2, any byte: valid)
    if q.levels > 2:
        with pytest.raises(ValueError, match=r"base-\d+ unpack: a word exceeds .* \(corrupted"):
            q.decode(enc, kernels=kernels)
    wide_codec = Codec.base(255)  # a codec wider than the message's levels
    payload = wide_codec.pack(torch.full((2000,), 200, dtype=torch.int64))
    wide = quantize.Encoded(**{**vars(enc), "codec": wide_codec, "payload": payload})
    with pytest.raises(ValueError, match=f"{name} message has a digit 200 beyond its"):
        q.decode(wide, kernels=kernels)  # a codec wider than the levels: the digits are checked


@pytest.mark.triton
@pytest.mark.skipif(not triton_available(), reason="triton is not installed")
@pytest.mark.parametrize(("name", "options"), [CASES[0], CASES[2], CASES[5]])
def test_the_public_api_on_triton_is_the_reference(name, options, monkeypatch):
    """The CUDA path of TernGrad and QSGD (Triton), through Triton's interpreter on CPU tensors
    where there is no GPU: the reference's bytes and values."""
    q = quantize.get(name, **options)
    gen = torch.Generator().manual_seed(11)
    g = torch.randn(3_001, generator=gen) * torch.rand(3_001, generator=gen) ** 4

    def run(kernels):
        enc = q.encode(
            g, torch.Generator().manual_seed(3), segments=(1_000, 2_001), kernels=kernels
        )
        return enc, q.decode(enc, kernels=kernels)

    calls = _counting(monkeypatch, TritonKernels)
    (triton, triton_out), (ref, ref_out) = run("triton"), run("torch")
    assert calls["grid_pack"] == 1 and calls["decode_into"] == 1  # Triton ran
    assert torch.equal(triton.to_frame(), ref.to_frame())
    assert torch.equal(triton_out, ref_out)


@pytest.mark.triton
@pytest.mark.skipif(not triton_available(), reason="triton is not installed")
def test_triton_runs_the_reference_for_the_level_quantizers(fused_calls):
    q, g = quantize.get("orq", bucket_size=100), torch.randn(1_000)
    enc = q.encode(g, torch.Generator().manual_seed(3), kernels="triton")
    ref = q.encode(g, torch.Generator().manual_seed(3), kernels="torch")
    assert torch.equal(enc.to_frame(), ref.to_frame())
    assert torch.equal(q.decode(enc, kernels="triton"), q.decode(ref))
    assert q.variance(g, kernels="triton") == q.variance(g, kernels="torch")
    assert sum(fused_calls.values()) == 1  # the default decode of `ref` alone ran numba


def test_the_backend_given_is_the_one_that_runs(fused_calls):
    """``kernels="torch"`` keeps every numba kernel out, for encode, decode, variance and the
    fit; the default runs them."""
    q, g = quantize.get("orq"), torch.randn(5_000)
    enc = q.encode(g, kernels="torch")
    q.decode(enc, kernels="torch")
    q.variance(g, kernels="torch")
    q.scales(g, quantize.Layout.of(5_000, None, q.bucket_size), kernels=TorchKernels())
    assert sum(fused_calls.values()) == 0
    q.decode(q.encode(g))
    q.variance(g)
    assert (fused_calls["level_fit"], fused_calls["level_pack"]) == (2, 1)
    assert fused_calls["level_decode"] == 1


def test_a_subclass_runs_the_reference_inside_the_numba_backend(monkeypatch, fused_calls):
    """The numba level kernels know the methods' exact classes: a subclass (which may change
    the fit) gets the reference's operations, through the same backend."""
    from terngrad.quantize.orq import ORQ

    class Shifted(ORQ):  # no name: not registered, the same method on the wire
        def _fit(self, rows):
            return super()._fit(rows) + 0.0

    reference = _counting(monkeypatch, TorchKernels)
    q, g = Shifted(bucket_size=64), torch.randn(1_000)
    enc = q.encode(g, torch.Generator().manual_seed(1))
    assert fused_calls["level_fit"] == 1 and reference["level_fit"] == 1  # delegated
    assert reference["level_pack"] == 1
    expected = quantize.get("orq", bucket_size=64).encode(g, torch.Generator().manual_seed(1))
    assert torch.equal(enc.to_frame(), expected.to_frame())
    assert torch.equal(q.decode(enc), q.decode(enc, kernels="torch"))
    assert reference["level_decode"] == 2
