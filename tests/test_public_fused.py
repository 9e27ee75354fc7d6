"""The public API on the fused kernels: ``encode``/``decode`` of TernGrad and QSGD give the
reference's bytes and values exactly, and the reference's errors."""

from __future__ import annotations

import pytest
import torch

from terngrad import quantize
from terngrad.kernels import FusedGrid, numba_available
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
        install_fast_path(FusedGrid())
        fused = fn()
        install_fast_path(None)
        return fused, fn()
    finally:
        install_fast_path(FusedGrid())


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
    assert FusedGrid().encode(q, g, layout, torch.rand(g.numel()), None) is not None  # it ran
    if options.get("packing") != "2bit":  # (2-bit messages decode in the reference: see there)
        assert FusedGrid().decode(q, fused, layout) is not None
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
