"""The quantizer interface: registry, options, shapes and dtypes, bad input, bytes on the wire."""

import math

import pytest
import torch

from terngrad import quantize
from terngrad.quantize import Encoded

ALL = quantize.names()


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


EXTREME = {
    "qsgd-l2 full 1e38": ("qsgd", {"norm": "l2"}, torch.full((512,), 1e38)),
    "signsgd full 1e34": ("signsgd", {}, torch.full((1 << 20,), 1e34)),
    "linear +-3e38": ("linear", {}, torch.tensor([-3e38, 0.0, 3e38])),
}


def test_names_in_method_id_order():
    assert ALL == [
        "fp32", "fp16", "terngrad", "qsgd", "linear", "orq", "bingrad-b", "bingrad-pb", "signsgd",
    ]  # fmt: skip


def test_unknown_name_suggests():
    with pytest.raises(ValueError, match=r"unknown quantizer 'terngard' \(did you mean 'terngrad'"):
        quantize.get("terngard")


@pytest.mark.parametrize(
    "name, options, message",
    [
        ("terngrad", {"clipp": 2.5}, "has no option 'clipp'; its options are: clip, bucket_size"),
        ("fp32", {"levels": 3}, "its options are: none"),
        ("terngrad", {"clip": -1}, "clip must be a positive number"),
        ("terngrad", {"packing": "base4"}, "packing must be one of"),
        ("terngrad", {"bucket_size": 0}, "bucket_size must be None or a positive integer"),
        ("qsgd", {"levels": 1}, "must be an integer in"),
        ("qsgd", {"levels": 4}, "levels must be odd"),
        ("qsgd", {"norm": "l1"}, "norm must be one of"),
        ("linear", {"levels": 1}, "must be an integer in"),
        ("orq", {"levels": 0}, "must be an integer in"),
        ("orq", {"sweeps": -1}, "sweeps must be a non-negative integer"),
        ("bingrad-b", {"bucket_size": 2.5}, "bucket_size must be"),
    ],
)
def test_bad_options(name, options, message):
    with pytest.raises(ValueError, match=message):
        quantize.get(name, **options)


@pytest.mark.parametrize("name", ALL)
def test_options_round_trip_and_repr(name):
    q = quantize.get(name)
    again = quantize.get(name, **q.options)
    assert again.options == q.options
    assert repr(q).startswith(f"quantize.get({name!r}")


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("shape", [(), (1,), (7,), (3, 4, 5), (1000, 3)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_shapes_dtypes_and_frames(name, shape, dtype):
    q = quantize.get(name)
    g = torch.randn(shape, generator=_gen()).to(dtype)
    enc = q.encode(g, generator=_gen(1))
    out = q.decode(enc)
    assert out.shape == g.shape and out.dtype == torch.float32
    frame = enc.to_frame()
    assert frame.numel() == enc.nbytes
    back = Encoded.from_frame(frame)
    assert back.method == name and back.dtype == dtype and back.shape == tuple(shape)
    assert torch.equal(quantize.decode(frame), out)
    assert torch.equal(quantize.decode(back), out)


@pytest.mark.parametrize("name", ALL)
def test_empty_tensor_round_trips(name):
    q = quantize.get(name)
    for shape in [(0,), (3, 0)]:
        enc = q.encode(torch.empty(shape))
        assert enc.scales.numel() == 0 and enc.payload.numel() == 0
        assert q.decode(enc).shape == shape
        assert quantize.decode(enc.to_frame()).shape == shape
        assert q.variance(torch.empty(shape)) == 0.0


@pytest.mark.parametrize("name", ALL)
def test_zero_gradient_gives_zeros(name):
    q = quantize.get(name)
    out = q.decode(q.encode(torch.zeros(1000), generator=_gen()))
    assert torch.equal(out, torch.zeros(1000))
    assert q.variance(torch.zeros(1000)) == 0.0


@pytest.mark.parametrize("name", ALL)
def test_bad_gradients(name):
    q = quantize.get(name)
    with pytest.raises(ValueError, match="floating-point"):
        q.encode(torch.ones(4, dtype=torch.int64))
    with pytest.raises(ValueError, match="floating-point"):
        q.encode(torch.ones(4, dtype=torch.bool))
    with pytest.raises(TypeError, match=r"torch\.Tensor"):
        q.encode([1.0, 2.0])
    for bad in (math.nan, math.inf, -math.inf):
        g = torch.ones(10)
        g[[3, 7]] = bad
        with pytest.raises(ValueError, match=r"2 non-finite value\(s\)"):
            q.encode(g)


@pytest.mark.parametrize("name", ALL)
def test_reproducible_given_generator(name):
    q = quantize.get(name)
    g = torch.randn(5000, generator=_gen())
    a, b = q.encode(g, generator=_gen(7)), q.encode(g, generator=_gen(7))
    assert torch.equal(a.payload, b.payload) and torch.equal(a.scales, b.scales)
    if q.stochastic:
        assert not torch.equal(a.payload, q.encode(g, generator=_gen(8)).payload)


def test_decode_checks_method_and_message():
    g = torch.randn(100)
    enc = quantize.get("qsgd").encode(g)
    with pytest.raises(ValueError, match="encoded by 'qsgd'"):
        quantize.get("terngrad").decode(enc)
    with pytest.raises(TypeError, match="takes an Encoded"):
        quantize.get("qsgd").decode(g)
    # a 2-bit TernGrad payload can hold the digit 3, which no ternary value has
    tern = quantize.get("terngrad", packing="2bit").encode(g)
    bad_payload = tern.payload.clone()
    bad_payload[0] |= 3
    forged = Encoded(**{**tern.__dict__, "payload": bad_payload})
    with pytest.raises(ValueError, match="beyond its 3 levels"):
        quantize.get("terngrad").decode(forged)
    forged = Encoded(**{**tern.__dict__, "scales": torch.ones(2)})
    with pytest.raises(ValueError, match="needs 1 scales, got 2"):
        quantize.get("terngrad").decode(forged)
    frame = enc.to_frame()
    frame[-1] ^= 1
    with pytest.raises(ValueError, match="checksum"):
        quantize.decode(frame)


def test_unknown_method_id_in_frame():
    enc = quantize.get("fp32").encode(torch.ones(3))
    header = enc.header
    from dataclasses import replace

    from terngrad import wire

    frame = wire.write_frame(replace(header, method_id=200), enc.scales, enc.payload)
    with pytest.raises(ValueError, match="unknown method id 200"):
        Encoded.from_frame(frame)


def test_terngrad_nbytes_base3_and_2bit():
    g = torch.randn(1_000_000, generator=_gen())
    enc = quantize.get("terngrad").encode(g, generator=_gen())
    ideal = 1_000_000 * 1.6 / 8 + 4 * enc.scales.numel()
    assert abs(enc.nbytes - ideal) / ideal < 0.01
    assert enc.nbytes == 52 + 4 + 200_000  # header, one scale, 5 trits a byte
    fp32 = quantize.get("fp32").encode(g).nbytes
    assert fp32 / enc.nbytes >= 19.5
    two_bit = quantize.get("terngrad", packing="2bit").encode(g)
    assert two_bit.nbytes == 52 + 4 + 250_000
    bucketed = quantize.get("terngrad", bucket_size=4096).encode(g)
    assert bucketed.scales.numel() == math.ceil(1_000_000 / 4096)
    assert bucketed.nbytes == 52 + 4 * 245 + 200_000


def test_terngrad_values_and_scale():
    g = torch.randn(10_000, generator=_gen())
    q = quantize.get("terngrad", clip=None)
    enc = q.encode(g, generator=_gen())
    s = float(enc.scales)
    assert s == float(g.abs().max())
    out = q.decode(enc)
    assert set(out.unique().tolist()) <= {-s, 0.0, s}
    # sign is kept: a non-zero output has the sign of the gradient
    nz = out != 0
    assert torch.equal(out[nz].sign(), g[nz].sign())


def test_terngrad_clipping():
    g = torch.randn(10_000, generator=_gen())
    g[0] = 100.0  # an outlier far beyond 2.5 sigma
    q = quantize.get("terngrad", clip=2.5)
    sigma = float(g.std(correction=0))
    enc = q.encode(g, generator=_gen())
    assert float(enc.scales) == pytest.approx(2.5 * sigma, rel=1e-6)
    assert float(q.decode(enc)[0]) == pytest.approx(2.5 * sigma, rel=1e-6)
    assert not q.unbiased and quantize.get("terngrad", clip=None).unbiased
    # a constant bucket (sigma = 0) is not clipped to zero
    const = torch.full((8,), 0.5)
    assert torch.equal(q.decode(q.encode(const)), const)


def test_imposed_scale():
    g = torch.tensor([0.1, -0.3, 0.9, -2.0])
    q = quantize.get("terngrad", clip=None)
    enc = q.encode(g, scale=1.0, generator=_gen())
    assert float(enc.scales) == 1.0
    out = q.decode(enc)
    assert out[3] == -1.0  # saturated at -s
    per_bucket = quantize.get("terngrad", clip=None, bucket_size=2)
    enc = per_bucket.encode(g, scale=torch.tensor([0.5, 3.0]))
    assert enc.scales.tolist() == [0.5, 3.0]
    assert per_bucket.variance(g, scale=torch.tensor([0.5, 3.0])) > 0
    with pytest.raises(ValueError, match="one value per bucket"):
        per_bucket.encode(g, scale=torch.ones(3))
    with pytest.raises(ValueError, match="finite and non-negative"):
        q.encode(g, scale=-1.0)
    with pytest.raises(ValueError, match="takes no imposed scale"):
        quantize.get("linear").encode(g, scale=1.0)
    qs = quantize.get("qsgd", bucket_size=None)
    assert torch.equal(qs.local_scales(g), g.abs().max().reshape(1))


def test_fp16_saturates_instead_of_overflowing():
    out = quantize.get("fp16").decode(quantize.get("fp16").encode(torch.tensor([1e6, -1e6, 1.0])))
    assert out.tolist() == [65504.0, -65504.0, 1.0]


def test_segments_give_layer_wise_scales():
    gen = _gen(3)
    a, b, d = torch.randn(100, generator=gen), 10 * torch.randn(37, generator=gen), torch.ones(5)
    flat = torch.cat([a, b, d])
    q = quantize.get("terngrad", clip=None)
    enc = q.encode(flat, generator=_gen(), segments=[100, 37, 0, 5])
    assert enc.scales.tolist() == [float(a.abs().max()), float(b.abs().max()), 1.0]
    assert enc.segments == (100, 37, 0, 5)
    out = quantize.decode(enc.to_frame())
    for part, s in zip(out.split([100, 37, 5]), enc.scales.tolist(), strict=True):
        assert set(part.unique().tolist()) <= {-s, 0.0, s}
    assert q.local_scales(flat, segments=[100, 37, 0, 5]).tolist() == enc.scales.tolist()
    bucketed = quantize.get("qsgd", bucket_size=32).encode(flat, segments=[100, 37, 0, 5])
    assert bucketed.scales.numel() == 4 + 2 + 1
    with pytest.raises(ValueError, match="segments sum to 141"):
        q.encode(flat, segments=[100, 41])
    with pytest.raises(ValueError, match="non-negative integers"):
        q.encode(flat, segments=[150, -8])


@pytest.mark.parametrize("name", ALL)
def test_every_method_round_trips_with_segments(name):
    q = quantize.get(name)
    flat = torch.randn(3000, generator=_gen())
    enc = q.encode(flat, generator=_gen(), segments=[1000, 7, 1993])
    assert torch.equal(quantize.decode(enc.to_frame()), q.decode(enc))
    assert q.variance(flat, segments=[1000, 7, 1993]) >= 0


def test_layout_slices_and_buckets():
    from terngrad.quantize import Layout

    layout = Layout.of(142, [100, 37, 0, 5], bucket_size=32)
    assert layout.bucket_lengths.tolist() == [32, 32, 32, 4, 32, 5, 5]
    assert layout.slice(90, 120) == Layout((10, 20), 32)
    assert layout.slice(0, 142) == Layout((100, 37, 5), 32)
    assert layout.slice(5, 5).n_buckets == 0
    x = torch.arange(142.0)
    assert torch.equal(torch.cat([r.reshape(-1) for r in layout.rows(x)]), x)


@pytest.mark.parametrize("name", ALL)
def test_message_nbytes_predicts_encode(name):
    q = quantize.get(name)
    for numel, segments in [(0, None), (1, None), (999, None), (3000, [1000, 7, 0, 1993])]:
        enc = q.encode(torch.randn(numel, generator=_gen()), segments=segments)
        assert q.message_nbytes(numel, segments) == enc.nbytes == enc.to_frame().numel()


@pytest.mark.parametrize("name", ["terngrad", "qsgd", "linear", "orq", "bingrad-pb"])
def test_given_uniform_draws_replace_the_generator(name):
    from terngrad.quantize.random import Streams

    q = quantize.get(name)
    g = torch.randn(3000, generator=_gen())
    # a generator keys one counter-based stream per segment (what the fused kernels draw)
    u = Streams.from_generator(_gen(5), 1).uniform([3000])
    by_generator = q.encode(g, generator=_gen(5))
    by_uniform = q.encode(g, uniform=u)
    assert torch.equal(by_generator.payload, by_uniform.payload)
    # the draws decide: draws of 0 always round away from the lower level, draws near 1 never
    up = q.decode(q.encode(g, uniform=torch.zeros(3000)))
    down = q.decode(q.encode(g, uniform=torch.full((3000,), 1 - 2**-24)))
    assert not torch.equal(up, down)
    with pytest.raises(ValueError, match="uniform must be a float32 tensor of 3000 draws"):
        q.encode(g, uniform=torch.rand(10))
    with pytest.raises(ValueError, match="uniform must be a float32 tensor"):
        q.encode(g, uniform=torch.rand(3000, dtype=torch.float64))


def test_stream_seeds_differ():
    from terngrad.comm import stream_seed

    seeds = {stream_seed(s, r, t, i) for s in (0, 1) for r in range(4) for t in range(50)
             for i in range(10)}  # fmt: skip
    assert len(seeds) == 2 * 4 * 50 * 10 and all(0 <= x < 2**63 for x in seeds)


@pytest.mark.parametrize("case", list(EXTREME))
def test_the_issue_reproducers_decode_to_finite_values(case):
    name, options, g = EXTREME[case]
    q = quantize.get(name, **options)
    out = q.decode(q.encode(g, generator=_gen(0)))
    assert bool(torch.isfinite(out).all())
    if name == "qsgd":  # unbiased: 512 draws of 0 or FLOAT32_MAX / 2 average to 1e38
        assert abs(float(out.double().mean()) - 1e38) < 0.2e38  # 5 standard errors
    else:  # deterministic levels inside the range: the values themselves
        assert torch.equal(out, g)


@pytest.mark.parametrize("name", quantize.names())
@pytest.mark.parametrize(
    "values",
    [[3.4e38, -3.4e38, 1.0, -2e38, 5e37], [torch.finfo(torch.float32).max] * 3, [1e-45, -1e-45]],
    ids=["mixed", "float32-max", "subnormal"],
)
def test_a_finite_gradient_never_decodes_to_inf_or_nan(name, values):
    for options in ({}, {"bucket_size": 2}) if name not in ("fp32", "fp16") else ({},):
        q = quantize.get(name, **options)
        g = torch.tensor(values * 200)
        out = q.decode(q.encode(g, generator=_gen(1)))
        if name == "fp16":  # fp16 itself cannot hold these: its overflow is the method's
            continue
        assert bool(torch.isfinite(out).all()), (name, options)


def test_large_scales_decode_without_overflow_in_every_backend():
    from terngrad.kernels import resolve
    from terngrad.quantize import Layout
    from terngrad.quantize.grid import overflow_limit
    from terngrad.wire import Codec

    layout = Layout.of(3000, (1000, 2000), 1000)
    scales = torch.tensor([1.0, 3e38, overflow_limit(8)])  # normal, above the limit, at it
    codec = Codec.base(17)  # sums over N = 4 ranks of QSGD-5 digits: codes in [-8, 8]
    digits = torch.randint(17, (3000,), generator=_gen(2))
    payload = codec.pack(digits)
    outs = []
    for name in ("torch", "numba"):
        out = torch.empty(3000)
        resolve(name).decode_into(out, payload, codec, 8, 8, 0, layout, scales)
        outs.append(out)
    assert torch.equal(outs[0], outs[1])
    assert bool(torch.isfinite(outs[0]).all())
    c = (digits - 8).float()
    assert torch.equal(outs[0][:1000], c[:1000] * 1.0 / 8)  # the usual formula below the limit
    assert torch.equal(outs[0][1000:2000], c[1000:2000] * (torch.tensor(3e38) / 8))
