"""The public API on the fused kernels: ``encode``/``decode`` of every digit-packing quantizer
(TernGrad and QSGD on the shared grid; Linear, ORQ, BinGrad-b/pb and scaled sign on their own
levels) give the reference's bytes and values exactly, and the reference's errors; the level
quantizers' ``variance`` too (it runs the same fit)."""

from __future__ import annotations

import pytest
import torch

from terngrad import quantize
from terngrad.kernels import Fused, numba_available, triton_available
from terngrad.quantize.base import install_fast_path

pytestmark = pytest.mark.skipif(not numba_available(), reason="numba is not installed")

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
    """``fn()`` on the fused kernels, then on the reference."""
    try:
        install_fast_path(Fused())
        fused = fn()
        install_fast_path(None)
        return fused, fn()
    finally:
        install_fast_path(Fused())


@pytest.mark.parametrize(("name", "options"), CASES)
@pytest.mark.parametrize("segments", [None, (40_000, 3, 0, 20_000, 997)])
def test_fused_encode_and_decode_are_the_reference_bit_for_bit(name, options, segments):
    q = quantize.get(name, **options)
    gen = torch.Generator().manual_seed(7)
    g = torch.randn(61_000, generator=gen) * torch.rand(61_000, generator=gen) ** 4
    g[123] = 40.0  # a heavy tail: clipping and saturation matter

    def run():
        enc = q.encode(g, torch.Generator().manual_seed(3), segments=segments)
        return enc, q.decode(enc)

    (fused, fused_out), (ref, ref_out) = _both(run)
    layout = fused.layout
    assert Fused().encode(q, g, layout, torch.rand(g.numel()), None) is not None  # it ran
    if options.get("packing") != "2bit":  # (2-bit messages decode in the reference: see there)
        assert Fused().decode(q, fused, layout) is not None
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
    fused, ref = _both(lambda: q.encode(g, scale=scale, uniform=u))
    assert torch.equal(fused.payload, ref.payload) and torch.equal(fused.scales, ref.scales)


def test_the_fused_path_keeps_the_reference_errors():
    q = quantize.get("terngrad")
    g = torch.randn(1000)
    g[[3, 9]] = float("nan")
    with pytest.raises(ValueError, match="gradient has 2 non-finite value"):
        q.encode(g)
    enc = quantize.get("terngrad", packing="2bit").encode(torch.randn(1000))
    enc.payload[0] = 0xFF  # digit 3 in a 3-level message: the reference's check still runs
    with pytest.raises(ValueError, match="beyond its 3 levels"):
        quantize.get("terngrad", packing="2bit").decode(enc)
    base3 = q.encode(torch.randn(1000))
    base3.payload[0] = 250  # not a base-3 word
    with pytest.raises(ValueError, match="corrupted"):
        q.decode(base3)


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


@pytest.mark.parametrize(("name", "options"), LEVEL_CASES)
@pytest.mark.parametrize("segments", [None, (10_000, 3, 0, 1, 10_000)])
def test_level_quantizers_are_the_reference_bit_for_bit(name, options, segments):
    q = quantize.get(name, **options)
    g = _awkward_gradient(20_004, seed=7)

    def run():
        enc = q.encode(g, torch.Generator().manual_seed(3), segments=segments)
        return enc, q.decode(enc), q.variance(g, segments=segments)

    (fused, fused_out, fused_var), (ref, ref_out, ref_var) = _both(run)
    layout = fused.layout
    assert Fused().encode(q, g, layout, fused_draws(q, layout), None) is not None  # it ran
    assert Fused().decode(q, fused, layout) is not None
    assert torch.equal(fused.scales, ref.scales)
    assert torch.equal(fused.payload, ref.payload)
    assert torch.equal(fused.to_frame(), ref.to_frame())
    assert torch.equal(fused_out, ref_out)
    assert fused_var == ref_var


def fused_draws(q, layout):
    return quantize.random.Streams((1,) * len(layout.segments)) if q.stochastic else None


@pytest.mark.parametrize("name", ["linear", "orq", "bingrad-pb"])
def test_level_quantizers_with_given_draws_match_the_reference(name):
    q = quantize.get(name, bucket_size=64)
    g = torch.randn(5_000, generator=torch.Generator().manual_seed(1))
    u = torch.rand(5_000, generator=torch.Generator().manual_seed(2))
    fused, ref = _both(lambda: q.encode(g, uniform=u))
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
    fused, ref = _both(lambda: q.encode(g, torch.Generator().manual_seed(0)))
    assert torch.equal(fused.scales, ref.scales) and torch.equal(fused.payload, ref.payload)
    assert torch.isfinite(q.decode(fused)).all()


@pytest.mark.parametrize("name", ["linear", "orq", "bingrad-b", "bingrad-pb", "signsgd"])
def test_level_quantizers_keep_the_reference_errors(name):
    q = quantize.get(name)
    negative_nan = torch.tensor([0xFFC00000], dtype=torch.int64).to(torch.int32).view(torch.float32)
    for bad in (float("inf"), -float("inf"), float("nan"), float(negative_nan)):
        g = torch.randn(2000)
        g[[5, 77, 1999]] = bad  # found by the fit kernel itself (no pass of its own)
        assert Fused().fit(q, g, quantize.Layout.of(2000, None, q.bucket_size)) is None
        with pytest.raises(ValueError, match="gradient has 3 non-finite value"):
            q.encode(g)
        with pytest.raises(ValueError, match="gradient has 3 non-finite value"):
            q.variance(g)
    enc = q.encode(torch.randn(2000))
    enc.payload[:8] = 0xFF  # a word beyond the base's largest (or, in base 2, any byte: valid)
    if q.levels > 2:
        with pytest.raises(ValueError, match="corrupt"):
            q.decode(enc)


@pytest.mark.skipif(not triton_available(), reason="triton is not installed")
@pytest.mark.parametrize(("name", "options"), [CASES[0], CASES[2], CASES[5]])
def test_the_public_api_on_triton_is_the_reference(name, options):
    """The CUDA path of TernGrad and QSGD (Triton), through Triton's interpreter on CPU tensors
    where there is no GPU: the reference's bytes and values."""
    q = quantize.get(name, **options)
    gen = torch.Generator().manual_seed(11)
    g = torch.randn(3_001, generator=gen) * torch.rand(3_001, generator=gen) ** 4

    def run():
        enc = q.encode(g, torch.Generator().manual_seed(3), segments=(1_000, 2_001))
        return enc, q.decode(enc)

    try:
        install_fast_path(Fused(kernels="triton"))
        triton, triton_out = run()
        layout = triton.layout
        assert Fused(kernels="triton").encode(q, g, layout, torch.rand(3_001), None) is not None
        install_fast_path(None)
        ref, ref_out = run()
    finally:
        install_fast_path(Fused())
    assert torch.equal(triton.to_frame(), ref.to_frame())
    assert torch.equal(triton_out, ref_out)


def test_fused_takes_only_fused_backends():
    with pytest.raises(ValueError, match="kernels must be 'auto', 'numba' or 'triton'"):
        Fused(kernels="torch")


def test_reference_only_keeps_the_fused_kernels_out_in_its_thread():
    from terngrad.kernels import NumbaKernels
    from terngrad.quantize.base import reference_only

    calls = []
    original = NumbaKernels.level_pack
    NumbaKernels.level_pack = lambda self, *args: calls.append(1) or original(self, *args)
    try:
        q, g = quantize.get("orq"), torch.randn(5_000)
        q.encode(g)
        with reference_only():
            q.encode(g)
            q.variance(g)
        q.encode(g)
    finally:
        NumbaKernels.level_pack = original
    assert len(calls) == 2
