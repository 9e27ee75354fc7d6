"""The fused kernels against the torch reference: same bytes, same draws, same statistics.

Exact equality is required everywhere: the fused kernels (numba on CPU; Triton, run here through
its interpreter on CPU tensors) follow the reference's float32 operations in the same order, the
draws are the counter-based streams all compute, and the statistics are float64 sums rounded
once to float32. The statistical test uses R = 20,000 copies of a 64-element gradient, one bucket
each, and asks every element's mean within 5 standard errors (false-alarm probability below
64 * 6e-7). The interpreter is slow, so the Triton cases use smaller tensors."""

import math

import numpy as np
import pytest
import torch

from terngrad import quantize
from terngrad.kernels import (
    NumbaKernels,
    Streams,
    TorchKernels,
    TritonKernels,
    counter_uniform,
    resolve,
    stream_seed,
    triton_available,
)
from terngrad.quantize import Layout
from terngrad.wire import Codec

REF, FUSED = TorchKernels(), NumbaKernels()


#: the Triton kernels run through Triton's interpreter on CPU tensors: slow, left out of
#: make test-fast (marker ``triton``)
needs_triton = [
    pytest.mark.skipif(not triton_available(), reason="triton is not installed"),
    pytest.mark.triton,
]


BACKENDS = [
    pytest.param("numba", id="numba"),
    pytest.param("triton", id="triton", marks=needs_triton),
]


#: elements per test tensor: the Triton interpreter runs kernels in numpy, element by element
SIZE = {"numba": 200_003, "triton": 6_007}


def _backend(name: str):
    return NumbaKernels() if name == "numba" else TritonKernels("cpu")


GRID = [
    ("terngrad", {}),
    ("terngrad", {"bucket_size": 100}),
    ("terngrad", {"clip": None, "packing": "2bit"}),
    ("terngrad", {"clip": 1.0, "bucket_size": 7, "packing": "2bit"}),
    ("qsgd", {"bucket_size": 64}),
    ("qsgd", {"levels": 3, "bucket_size": None}),
    ("qsgd", {"levels": 9, "norm": "l2", "bucket_size": 1000}),
    ("qsgd", {"levels": 255, "bucket_size": 512}),
]


SEGMENTS = [None, (1000, 0, 5_000, 3, 3_000, 1), (5,), (0,)]


def _gradient(numel: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    g = torch.randn(numel, generator=gen) * torch.linspace(0.01, 3, numel)
    if numel > 40:
        g[10:40] = 0.25  # a constant stretch: sigma = 0 in small buckets
    return g


def _layout(numel, segments, q):
    return Layout.of(numel, segments, q.bucket_size)


def _streams(layout: Layout, seed: int = 3) -> Streams:
    return Streams(tuple(stream_seed(seed, p) for p in range(len(layout.segments))))


def _packed(backend, grid, shared, draws, lo, hi, codec):
    out = torch.full((codec.nbytes(hi - lo),), 77, dtype=torch.uint8)
    backend.grid_pack(grid, shared, draws, lo, hi, codec, out)
    return out


def _splitmix_draw(key: int, index: int) -> float:
    """Draw ``index`` of stream ``key``, in Python integers: the definition, spelled out (two
    24-bit fields of splitmix64's output ``index // 2``)."""
    mask = 2**64 - 1
    z = (key + (index // 2 + 1) * 0x9E3779B97F4A7C15) & mask
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    z ^= z >> 31
    return ((z >> 16) & (2**24 - 1) if index % 2 else z >> 40) / 2**24


def test_draws_follow_the_definition():
    key = stream_seed(1, 2, 3, 4)
    for start in (1000, 1001):  # an even and an odd first draw
        ref = counter_uniform(key, start, 51)
        assert [float(u) for u in ref] == [_splitmix_draw(key, start + i) for i in range(51)]
    assert float(counter_uniform(0, 0, 1)[0]) == _splitmix_draw(0, 0)
    assert float(counter_uniform(0, 1, 1)[0]) == _splitmix_draw(0, 1)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("segments", [(1000, 0, 3, 7_001), (0,), (1,)])
def test_fused_draws_equal_the_reference(segments, backend):
    layout = Layout.of(sum(segments), segments)
    streams = _streams(layout)
    fused = _backend(backend).uniform(streams, layout)
    assert torch.equal(fused, REF.uniform(streams, layout))


def test_draws_have_24_bits_and_are_uniform():
    u = counter_uniform(stream_seed(9), 0, 1_000_000).double()
    assert float(u.min()) >= 0 and float(u.max()) < 1
    scaled = u * 2**24
    assert torch.equal(scaled, scaled.floor())  # multiples of 2**-24
    # chi-square over 64 bins: 63 degrees of freedom, mean 63, sd 11.2; bound at mean + 5 sd
    counts = torch.bincount((u * 64).long(), minlength=64).double()
    chi2 = float(((counts - 1e6 / 64) ** 2 / (1e6 / 64)).sum())
    assert chi2 < 63 + 5 * math.sqrt(2 * 63)
    # the two draws of one hash are independent: uniform on 8 x 8 cells of the unit square
    # (63 degrees of freedom, bound at mean + 5 sd) and uncorrelated (|corr| < 5 / sqrt(n/2))
    even, odd = u[0::2], u[1::2]
    cells = torch.bincount((even * 8).long() * 8 + (odd * 8).long(), minlength=64).double()
    chi2 = float(((cells - 5e5 / 64) ** 2 / (5e5 / 64)).sum())
    assert chi2 < 63 + 5 * math.sqrt(2 * 63)
    assert abs(float(torch.corrcoef(torch.stack([even, odd]))[0, 1])) < 5 / math.sqrt(5e5)
    # neighbouring streams (rank r and r + 1) are uncorrelated: |corr| < 5 / sqrt(n)
    v = counter_uniform(stream_seed(0, 1, 0, 0), 0, 1_000_000).double()
    w = counter_uniform(stream_seed(0, 0, 0, 0), 0, 1_000_000).double()
    assert abs(float(torch.corrcoef(torch.stack([v, w]))[0, 1])) < 5e-3


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("segments", SEGMENTS, ids=str)
@pytest.mark.parametrize("name, options", GRID, ids=str)
def test_prepare_and_pack_equal_the_reference(name, options, segments, backend):
    q = quantize.get(name, **options)
    FUSED = _backend(backend)
    if backend == "triton" and segments:  # the same shape a tenth the size: the interpreter
        segments = tuple(n // 10 if n >= 100 else n for n in segments)  # runs every lane in Python
    numel = sum(segments) if segments else SIZE[backend]
    g = _gradient(numel)
    layout = _layout(numel, segments, q)
    ref, fused = REF.grid_prepare(q, g, layout), FUSED.grid_prepare(q, g, layout)
    assert torch.equal(ref.local, fused.local)
    assert torch.equal(ref.local, q.local_scales(g, segments))
    shared = ref.local * 1.25  # as if another rank had larger gradients
    streams = _streams(layout)
    ranges = [(0, numel), (min(7, numel), numel), (numel // 3, numel // 3 + min(numel, 7_001))]
    for lo, hi in ranges:
        hi = min(hi, numel)
        a = _packed(REF, ref, shared, streams, lo, hi, q.codec)
        b = _packed(FUSED, fused, shared, streams, lo, hi, q.codec)
        assert torch.equal(a, b), (lo, hi)
    # the encoder's own output for the same draws: the kernels pack what encode packs
    whole = q.encode(g, scale=shared, segments=segments, uniform=streams.uniform(layout.segments))
    assert torch.equal(_packed(FUSED, fused, shared, streams, 0, numel, q.codec), whole.payload)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name, options", GRID[:5], ids=str)
def test_given_uniform_draws_give_the_reference_bytes(name, options, backend):
    q = quantize.get(name, **options)
    FUSED = _backend(backend)
    g = _gradient(SIZE[backend])
    layout = _layout(g.numel(), None, q)
    u = torch.rand(g.numel(), generator=torch.Generator().manual_seed(4))
    ref, fused = REF.grid_prepare(q, g, layout), FUSED.grid_prepare(q, g, layout)
    a = _packed(REF, ref, ref.local, u, 0, g.numel(), q.codec)
    b = _packed(FUSED, fused, fused.local, u, 0, g.numel(), q.codec)
    assert torch.equal(a, b)
    assert torch.equal(a, q.encode(g, scale=ref.local, uniform=u).payload)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("count, m", [(2, 1), (3, 1), (4, 1), (8, 1), (4, 2), (2, 4), (64, 1)])
@pytest.mark.parametrize("numel", [0, 1, 4, 5, 3_999, 130_001])
def test_sum_and_decode_equal_the_reference(count, m, numel, backend):
    if backend == "triton" and numel > SIZE["triton"]:
        pytest.skip("too slow for the Triton interpreter")
    FUSED = _backend(backend)
    gen = torch.Generator().manual_seed(count * 1000 + numel)
    codec, out_codec = Codec.base(2 * m + 1), Codec.base(2 * count * m + 1)
    payloads = [
        codec.pack(torch.randint(0, 2 * m + 1, (numel,), generator=gen)) for _ in range(count)
    ]
    sums = []
    for backend in (REF, FUSED):
        out = torch.full((out_codec.nbytes(numel),), 77, dtype=torch.uint8)
        backend.sum_packed(payloads, numel, codec, out_codec, out)
        sums.append(out)
    assert torch.equal(sums[0], sums[1])
    expected = sum(codec.unpack(p, numel).to(torch.int64) for p in payloads)
    assert torch.equal(out_codec.unpack(sums[0], numel).to(torch.int64), expected)
    layout = Layout.of(numel + 11, (3, numel + 8), 1000)
    scales = torch.rand(layout.n_buckets, generator=gen)
    decoded = []
    for backend in (REF, FUSED):
        out = torch.full((numel,), float("nan"))
        backend.decode_into(out, sums[0], out_codec, count * m, count * m, 11, layout, scales)
        decoded.append(out)
    assert torch.equal(decoded[0], decoded[1])
    s_el = layout.expand(scales)[11:]
    assert torch.equal(decoded[0], (expected - count * m).float() * s_el / (count * m))


@pytest.mark.parametrize("backend", BACKENDS)
def test_nbit_streams_other_than_two_bits(backend):
    FUSED = _backend(backend)
    for bits in (1, 3, 4, 8):
        codec = Codec.nbit(bits)
        digits = torch.randint(0, 2**bits, (10_007,), generator=torch.Generator().manual_seed(bits))
        payload = codec.pack(digits)
        out_codec = Codec.base(2 * 2**bits + 1)
        a, b = (torch.empty(out_codec.nbytes(10_007), dtype=torch.uint8) for _ in range(2))
        REF.sum_packed([payload, payload], 10_007, codec, out_codec, a)
        FUSED.sum_packed([payload, payload], 10_007, codec, out_codec, b)
        assert torch.equal(a, b)


def test_thread_count_does_not_change_a_byte():
    q = quantize.get("terngrad", bucket_size=5000)
    g = _gradient(400_000)
    layout = _layout(g.numel(), None, q)
    streams = _streams(layout)
    before = torch.get_num_threads()
    results = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            grid = FUSED.grid_prepare(q, g, layout)
            results.append(
                (grid.local, _packed(FUSED, grid, grid.local, streams, 0, g.numel(), q.codec))
            )
    finally:
        torch.set_num_threads(before)
    assert torch.equal(results[0][0], results[1][0])
    assert torch.equal(results[0][1], results[1][1])


@pytest.mark.parametrize("backend", ["torch", *BACKENDS])
def test_corrupt_payloads_are_refused(backend):
    backend = REF if backend == "torch" else _backend(backend)
    codec, out_codec = Codec.base(3), Codec.base(9)
    good = codec.pack(torch.ones(12, dtype=torch.int64))
    bad_word = good.clone()
    bad_word[1] = 250  # beyond 3**5 - 1
    bad_padding = good.clone()
    bad_padding[2] += 3**4  # plane 4 of word 2: digit 2 + 4 * 3 = 14 of a 12-digit message
    for payload in (bad_word, bad_padding):
        with pytest.raises(ValueError, match="corrupt"):
            backend.sum_packed(
                [good, payload], 12, codec, out_codec, torch.empty(6, dtype=torch.uint8)
            )
        with pytest.raises(ValueError, match="corrupt"):
            backend.decode_into(
                torch.empty(12), payload, codec, 1, 1, 0, Layout.of(12), torch.ones(1)
            )


@pytest.mark.parametrize("backend", BACKENDS)
def test_non_finite_values_make_their_bucket_scale_non_finite(backend):
    q = quantize.get("terngrad", bucket_size=100)
    g = _gradient(1000)
    g[150], g[420] = float("nan"), float("inf")
    local = _backend(backend).grid_prepare(q, g, _layout(1000, None, q)).local
    assert math.isnan(float(local[1])) and not math.isfinite(float(local[4]))
    assert bool(torch.isfinite(local[[0, 2, 3, 5, 6, 7, 8, 9]]).all())


@pytest.mark.parametrize(
    "name, options",
    [("terngrad", {"clip": None, "bucket_size": 64}), ("qsgd", {"levels": 5, "bucket_size": 64})],
    ids=str,
)
def test_fused_rounding_is_unbiased(name, options):
    q = quantize.get(name, **options)
    d, reps = 64, 20_000
    g = torch.randn(d, generator=torch.Generator().manual_seed(2))
    flat = g.repeat(reps)
    layout = _layout(flat.numel(), None, q)
    grid = FUSED.grid_prepare(q, flat, layout)
    payload = _packed(
        FUSED, grid, grid.local, Streams((stream_seed(11),)), 0, flat.numel(), q.codec
    )
    out = torch.empty(flat.numel())
    FUSED.decode_into(out, payload, q.codec, q.m, q.m, 0, layout, grid.local)
    draws = out.view(reps, d).double()
    se = draws.std(0) / math.sqrt(reps)
    assert bool(((draws.mean(0) - g.double()).abs() <= 5 * se + 1e-6).all())
    exact = q.variance(flat, segments=None) / reps
    empirical = float((draws - g.double()).square().sum(1).mean())
    assert empirical == pytest.approx(exact, rel=0.05)


def test_resolve_picks_as_documented():
    assert isinstance(resolve("auto"), NumbaKernels)  # numba for CPU tensors
    assert isinstance(resolve(None), NumbaKernels)  # None is "auto"
    assert isinstance(resolve("numba", torch.device("cpu")), NumbaKernels)
    assert isinstance(resolve("torch"), TorchKernels)
    assert isinstance(resolve("torch", "meta"), TorchKernels)
    assert isinstance(resolve("auto", "meta"), TorchKernels)  # neither CPU nor CUDA: reference
    if triton_available():
        chosen = resolve("auto", "cuda")  # made, not run: no GPU needed
        assert isinstance(chosen, TritonKernels) and chosen.device == torch.device("cuda")
        assert isinstance(resolve("triton", "cpu"), TritonKernels)  # under TRITON_INTERPRET=1
    # made once per device: the public API does not build a backend per call
    assert resolve("auto") is resolve("numba") is resolve("auto", torch.device("cpu"))
    assert resolve("torch") is resolve("torch")


def test_resolve_returns_the_instance_given():
    mine = NumbaKernels()
    assert resolve(mine) is mine and resolve(mine, "meta") is mine
    assert resolve(REF, "cuda") is REF


def test_resolve_refuses_with_one_line(monkeypatch):
    for bad in ("fast", "", "TORCH", 3, ["numba"]):
        with pytest.raises(ValueError, match="kernels must be one of 'auto', 'numba', 'triton', "):
            resolve(bad)
    with pytest.raises(ValueError, match="kernels='numba' runs on CPU tensors; these are on meta"):
        resolve("numba", "meta")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(
        ValueError, match=r"kernels='triton' runs on CUDA tensors .* these are on cpu"
    ):
        resolve("triton", "cpu")


def test_resolve_without_the_packages(monkeypatch):
    """Where numba or triton is missing, "auto" takes the reference and insisting is refused."""
    from terngrad.kernels import fused_cpu, fused_gpu

    monkeypatch.setattr(fused_cpu, "numba_available", lambda: False)
    monkeypatch.setattr(fused_gpu, "triton_available", lambda: False)
    assert isinstance(resolve("auto"), TorchKernels)
    assert isinstance(resolve("auto", "cuda"), TorchKernels)
    with pytest.raises(ValueError, match="kernels='numba' needs the numba package"):
        resolve("numba")
    with pytest.raises(ValueError, match="kernels='triton' needs the triton package"):
        resolve("triton", "cuda")
    q, g = quantize.get("orq"), torch.randn(1000)
    ref = q.encode(g, torch.Generator().manual_seed(1))  # on the reference
    fused = q.encode(g, torch.Generator().manual_seed(1), kernels=NumbaKernels())
    assert torch.equal(ref.to_frame(), fused.to_frame())


def test_frames_from_the_exchange_path_decode_with_the_wire_layer():
    """A frame packed by the fused kernel reads back through the generic codec."""
    from terngrad.comm.exchanges.grid_step import GridStep

    q = quantize.get("terngrad")
    g = _gradient(10_000)
    layout = _layout(10_000, None, q)
    grid = FUSED.grid_prepare(q, g, layout)
    draws = _streams(layout)
    step = GridStep(FUSED, grid, grid.local, draws)
    frame = step.frame(100, 10_000)
    from terngrad.wire import read_frame

    header, _, payload = read_frame(frame)
    assert header.numel == 9_900 and header.codec == Codec.base(3)
    expected = q.quantize(g, layout, scale=grid.local, uniform=draws.uniform(layout.segments))[1]
    assert torch.equal(header.codec.unpack(payload, 9_900).long(), expected[100:])
    assert np.array_equal(
        payload.numpy(),
        _packed(
            REF, REF.grid_prepare(q, g, layout), grid.local, draws, 100, 10_000, q.codec
        ).numpy(),
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_out_of_range_requests_are_refused(backend):
    kernels = _backend(backend)
    q = quantize.get("terngrad")
    layout = Layout.of(10, (4, 6))
    grid = kernels.grid_prepare(q, _gradient(10), layout)
    out = torch.empty(q.codec.nbytes(20), dtype=torch.uint8)
    with pytest.raises(ValueError, match="outside a layout of 10"):
        kernels.grid_pack(grid, grid.local, _streams(layout), 0, 20, q.codec, out)
    with pytest.raises(ValueError, match="1 scales for 2 buckets"):
        kernels.decode_into(
            torch.empty(10), _packed(REF, REF.grid_prepare(q, _gradient(10), layout),
            grid.local, _streams(layout), 0, 10, q.codec), q.codec, 1, 1, 0, layout,
            grid.local[:1],
        )  # fmt: skip
    with pytest.raises(ValueError, match="1 random streams for 2 segments"):
        kernels.uniform(Streams((5,)), layout)


def test_the_serial_and_parallel_builds_give_the_same_bytes():
    """A one-thread caller (a training rank) runs each kernel's serial build, more threads its
    parallel build: the same bytes and values, on buckets and segments that cross chunks."""
    g = torch.randn(100_003, generator=torch.Generator().manual_seed(5))
    layout = Layout.of(g.numel(), [40_000, 60_003], 4096)
    results = []
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            backend = NumbaKernels()
            q = quantize.get("terngrad", bucket_size=4096)
            grid = backend.grid_prepare(q, g, layout)
            packed = torch.empty(q.codec.nbytes(g.numel()), dtype=torch.uint8)
            backend.grid_pack(grid, grid.local, _streams(layout), 0, g.numel(), q.codec, packed)
            total = torch.empty(Codec.base(5).nbytes(g.numel()), dtype=torch.uint8)
            backend.sum_packed([packed, packed], g.numel(), q.codec, Codec.base(5), total)
            out = torch.empty(g.numel())
            backend.decode_into(out, total, Codec.base(5), 2, 2, 0, layout, grid.local)
            orq = quantize.get("orq", bucket_size=512)
            draws = torch.Generator().manual_seed(1)
            enc = orq.encode(g, draws, segments=layout.segments, kernels=backend)
            results.append((grid.local, packed, total, out, enc.to_frame(),
                            orq.decode(enc, kernels=backend)))  # fmt: skip
    finally:
        torch.set_num_threads(before)
    for a, b in zip(*results, strict=True):
        assert torch.equal(a, b)


def test_the_digit_in_float_lanes_is_the_integer_formula():
    """``encode_cpu._grid_digit`` carries floor, step and digit in float32: on every float class
    (zeros, subnormals, huge values, infinities, NaN) and scales, bounds and ``m`` of every kind,
    each digit is that of the integer arithmetic ``uint16(m ± (int32(t) + [u < t - floor t]))``
    it replaced (a NaN ``t`` gives ``m``)."""
    from numba import njit

    from terngrad.kernels.encode_cpu import _grid_digit

    @njit
    def both(xs, us, bound, scale, m, old, new):
        mf = np.float32(m)
        for j in range(xs.size):
            t = min((min(abs(xs[j]), bound) * mf) / scale, mf)
            whole = np.int32(t)
            step = whole + np.int32(us[j] < t - np.float32(whole))
            old[j] = np.uint16(m + step if xs[j] > 0 else m - step)
            new[j] = _grid_digit(xs[j], bound, scale, mf, us[j])

    rng = np.random.default_rng(0)
    x = rng.standard_normal(20_000) * rng.choice([1e-3, 1.0, 1e30], 20_000)
    special = [np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 3.4e38]
    x = np.concatenate([x, special]).astype(np.float32)
    u = rng.random(x.size).astype(np.float32)
    u[::7] = 0
    for m in (1, 2, 127, 32767):
        for scale in (3e-3, 1.0, np.inf, 1e-40, np.nan, 3.4e38):
            for bound in (np.inf, 2e-3, 0.7, np.nan, 1e-42):
                old, new = np.empty(x.size, np.uint16), np.empty(x.size, np.uint16)
                both(x, u, np.float32(bound), np.float32(scale), m, old, new)
                assert np.array_equal(old, new), (m, scale, bound)
