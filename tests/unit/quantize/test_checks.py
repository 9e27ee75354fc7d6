"""Every public door of the quantizers refuses what it cannot take with one exception whose one
line says what is wrong: draws, generators, scales, output buffers, float64 gradients beyond
float32's range, and messages whose fields contradict each other."""

import re
from dataclasses import replace

import pytest
import torch

from terngrad import quantize
from terngrad.quantize import Layout

ALL = quantize.names()
STOCHASTIC = [n for n in ALL if quantize.get(n).stochastic]
SCALED = [n for n in ALL if n not in ("fp32", "fp16")]


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def _refused(kind, match, fn, *args, **kwargs) -> str:
    """``fn(*args, **kwargs)`` raises ``kind`` with a one-line message matching ``match``."""
    with pytest.raises(kind, match=match) as exc:
        fn(*args, **kwargs)
    message = str(exc.value)
    assert len(message.splitlines()) == 1, message
    return message


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("bad", [float("nan"), 1.0, -0.25, float("inf")], ids=str)
def test_draws_outside_the_unit_interval_are_refused(name, bad):
    q, g = quantize.get(name), torch.randn(100, generator=_gen())
    u = torch.rand(100, generator=_gen(1))
    u[[3, 50]] = bad
    _refused(
        ValueError, r"uniform must hold draws in \[0, 1\), but 2 of 100", q.encode, g, uniform=u
    )
    if name in STOCHASTIC:  # the unpacked form takes draws through the same check
        _refused(ValueError, "2 of 100 are outside", q.quantize, g, Layout.of(100), uniform=u)


@pytest.mark.parametrize("name", ALL)
def test_draws_of_the_wrong_kind_are_refused(name):
    q, g = quantize.get(name), torch.randn(100, generator=_gen())
    _refused(TypeError, "uniform must be a torch.Tensor", q.encode, g, uniform=[0.5] * 100)
    for bad in (torch.rand(99), torch.rand(100, dtype=torch.float64)):
        _refused(
            ValueError, "uniform must be a float32 tensor of 100 draws", q.encode, g, uniform=bad
        )
    meta = torch.empty(100, device="meta")
    _refused(ValueError, "uniform is on meta, the gradient on cpu", q.encode, g, uniform=meta)
    # the edges of [0, 1) are draws
    edges = torch.tensor([0.0, 1 - 2**-24] * 50)
    assert q.encode(g, uniform=edges).numel == 100


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("bad", [5, "seed", torch.tensor(3)], ids=["int", "str", "tensor"])
def test_generator_must_be_a_generator(name, bad):
    q, g = quantize.get(name), torch.randn(100)
    _refused(TypeError, "generator must be a torch.Generator or None, got", q.encode, g, bad)


@pytest.mark.parametrize("name", ALL)
def test_out_buffers_are_checked(name):
    q = quantize.get(name)
    enc = q.encode(torch.randn(6, 5, generator=_gen()), generator=_gen(1))
    for bad, what in [
        (torch.empty(30, device="meta"), "on meta"),
        (torch.empty(30, dtype=torch.float64), "got torch.float64"),
        (torch.empty(31), "shape \\(31,\\)"),
        (torch.empty(5, 6).t(), "not contiguous"),
    ]:
        message = _refused(ValueError, "out must be a contiguous float32 tensor of 30", q.decode,
                           enc, out=bad)  # fmt: skip
        assert re.search(what, message), message
    _refused(TypeError, "out must be a torch.Tensor", q.decode, enc, out=[0.0] * 30)
    _refused(
        ValueError, "out requires grad", q.decode, enc, out=torch.empty(30, requires_grad=True)
    )
    out = torch.empty(30)  # a good one still works
    assert q.decode(enc, out=out) is out


@pytest.mark.parametrize("name", ALL)
def test_float64_beyond_float32_range_is_not_called_non_finite(name):
    q = quantize.get(name)
    g = torch.randn(50, dtype=torch.float64, generator=_gen())
    g[[7, 9]] = torch.tensor([1e39, -1e300], dtype=torch.float64)
    for door in (q.encode, q.variance):
        message = _refused(
            ValueError, r"2 finite float64 value\(s\) beyond float32's range", door, g
        )
        assert "non-finite" not in message and "clip" in message
    if hasattr(q, "local_scales"):
        _refused(ValueError, "beyond float32's range", q.local_scales, g)
    g[[7, 9]] = float("inf")  # a real Inf is still called one
    _refused(ValueError, r"2 non-finite value\(s\)", q.encode, g)
    g[[7, 9]] = 3.4e38  # within range: quantized as before
    assert q.encode(g, generator=_gen()).numel == 50


@pytest.mark.parametrize("name", ["terngrad", "qsgd"])
def test_imposed_scales_are_checked(name):
    q, g = quantize.get(name, bucket_size=None), torch.randn(100)
    _refused(TypeError, "scale must be a number or a tensor", q.encode, g, scale="1.0")
    _refused(TypeError, "scale must be a number or a tensor", q.encode, g, scale=object())
    for bad in (float("nan"), -1.0, float("inf"), torch.tensor(1e39, dtype=torch.float64)):
        _refused(ValueError, "scale must be finite and non-negative", q.encode, g, scale=bad)


def test_quantize_checks_its_gradient_and_layout():
    q, g = quantize.get("terngrad"), torch.randn(100)
    _refused(TypeError, "layout must be a terngrad.quantize.Layout", q.quantize, g, (100,))
    _refused(ValueError, "the gradient has 100 elements, its layout 99", q.quantize, g,
             Layout.of(99))  # fmt: skip
    _refused(TypeError, "generator must be a torch.Generator", q.quantize, g, Layout.of(100), 1)
    g[0] = float("nan")
    _refused(ValueError, r"1 non-finite value\(s\)", q.quantize, g, Layout.of(100))


def test_quantizer_names_are_strings():
    _refused(TypeError, "a quantizer name is a string", quantize.get, ["terngrad"])


# --------------------------------------------------------------------------- forged messages


def _message(name, **options):
    q = quantize.get(name, **options)
    return q, q.encode(torch.randn(300, generator=_gen()), generator=_gen(1))


@pytest.mark.parametrize("name", ALL)
def test_messages_with_impossible_levels_are_refused(name):
    q, enc = _message(name)
    for levels in (0, 1, 4, 70000) if name not in ("fp32", "fp16") else (2, 3):
        if levels == enc.levels or (name in ("linear", "orq") and 2 <= levels <= 65535):
            continue
        forged = replace(enc, levels=levels)
        _refused(ValueError, f"{name} message: bad levels: {levels}", q.decode, forged)


@pytest.mark.parametrize("name", ALL)
def test_messages_whose_codec_contradicts_the_method_are_refused(name):
    from terngrad.wire import Codec

    q, enc = _message(name)
    if enc.codec.is_float:
        other = Codec.raw16() if enc.codec == Codec.raw32() else Codec.raw32()
        _refused(ValueError, f"bad codec: it packs {other} where {name} packs", q.decode,
                 replace(enc, codec=other))  # fmt: skip
        _refused(
            ValueError, "bad codec: it packs base3", q.decode, replace(enc, codec=Codec.base(3))
        )
        return
    _refused(ValueError, "packs raw32 floats where it packs digits", q.decode,
             replace(enc, codec=Codec.raw32()))  # fmt: skip
    if enc.levels > 2:  # a codec too narrow for the levels
        narrow = Codec.base(enc.levels - 1)
        _refused(ValueError, f"bad codec: {narrow} holds {enc.levels - 1} digits, not", q.decode,
                 replace(enc, codec=narrow))  # fmt: skip


@pytest.mark.parametrize("name", ALL)
def test_messages_with_absurd_shapes_allocate_nothing(name):
    q, enc = _message(name)
    for shape in [(2**40,), (1 << 20, 1 << 20), (300, 2)]:  # would allocate up to 4 TB
        _refused(ValueError, f"{name} message: bad payload: .* elements in", q.decode,
                 replace(enc, shape=shape))  # fmt: skip
    _refused(ValueError, "bad shape", q.decode, replace(enc, shape=(-300,)))
    _refused(ValueError, "bad segments: they sum to 301", q.decode,
             replace(enc, segments=(100, 201)))  # fmt: skip
    _refused(ValueError, "bad bucket_size", q.decode, replace(enc, bucket_size=-1))


@pytest.mark.parametrize("name", SCALED)
def test_messages_with_bad_scales_are_refused(name):
    q, enc = _message(name)
    _refused(ValueError, f"bad n_scales: .* needs {enc.scales.numel()} scales, got", q.decode,
             replace(enc, scales=enc.scales[:-1]))  # fmt: skip
    if enc.bucket_size == 0:  # a bucket size the scales do not count
        _refused(ValueError, "bad n_scales", q.decode, replace(enc, bucket_size=10))
    for bad in (float("nan"), float("inf")):
        scales = enc.scales.clone()
        scales[0] = bad
        _refused(ValueError, r"has 1 non-finite scale\(s\)", q.decode, replace(enc, scales=scales))
    negative = replace(enc, scales=-enc.scales.abs() - 1)
    if q.nonnegative_scales:  # magnitudes: TernGrad, QSGD, scaled sign
        _refused(
            ValueError, f"bad scales: a scale of .* where {name}'s are >= 0", q.decode, negative
        )
    else:  # levels: any finite value is one
        assert bool(torch.isfinite(q.decode(negative)).all())


def test_the_fused_kernels_check_the_buffer_they_write():
    from terngrad.kernels import numba_available, resolve
    from terngrad.wire import Codec

    if not numba_available():
        pytest.skip("needs numba")
    kernels, layout, codec = resolve("numba"), Layout.of(64), Codec.base(3)
    payload, scales = codec.pack(torch.ones(64, dtype=torch.long)), torch.ones(1)
    for bad in (torch.empty(64, dtype=torch.float64), torch.empty(128)[::2]):
        _refused(ValueError, "out must be a contiguous float32 tensor of 64", kernels.decode_into,
                 bad, payload, codec, 1, 1, 0, layout, scales)  # fmt: skip
    out = torch.empty(64)
    kernels.decode_into(out, payload, codec, 1, 1, 0, layout, scales)
    assert torch.equal(out, torch.zeros(64))


@pytest.mark.parametrize("name", ["terngrad", "qsgd", "fp32"])
def test_sparse_and_meta_tensors_are_refused_naming_what_they_are(name):
    """Not torch's own RuntimeError ("Sparse CSR tensors do not have is_contiguous",
    "Tensor.item() cannot be called on meta tensors"): a TypeError saying what it is."""
    q = quantize.get(name)
    dense = torch.randn(6, 8, generator=_gen())
    for bad, kind in ((dense.to_sparse(), "a sparse_coo one"),
                      (dense.to_sparse_csr(), "a sparse_csr one")):  # fmt: skip
        _refused(TypeError, f"gradient must be a dense \\(strided\\) tensor, got {kind}: pass "
                 "grad.to_dense", q.encode, bad)  # fmt: skip
    _refused(TypeError, "gradient is a meta tensor", q.encode, torch.empty(6, 8, device="meta"))
    enc = q.encode(dense, generator=_gen())
    _refused(TypeError, "out must be a dense", q.decode, enc, out=torch.zeros(48).to_sparse())
