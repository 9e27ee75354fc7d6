"""Statistical properties: unbiasedness, exact variance formulas, QSGD's bound.

Draws: a gradient g of d = 64 elements is repeated R = 20,000 times with one bucket per copy,
so a single encode gives R independent quantizations of g (each copy gets the same scales).
The mean of R draws of element k has standard error SE_k = sqrt(Var_k / R); an unbiased
quantizer must land within 5 SE_k of g_k for every k (a false alarm has probability below
64 * 6e-7 per test). The exact variance from ``q.variance`` must match the empirical mean of
||Q(g) - g||^2 within 5 of its standard errors. Seeds are fixed, so the tests are repeatable."""

import math

import pytest
import torch

from terngrad import quantize

D, R = 64, 20_000


def _gradient(kind: str, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    if kind == "gauss":
        return torch.randn(D, generator=gen)
    u = torch.rand(D, generator=gen)  # heavy-tailed: Student-t with 2 degrees of freedom
    return (torch.randn(D, generator=gen) / torch.sqrt(-torch.log(u))).float()


def _draws(q, g, seed=1, kernels=None, **kw) -> torch.Tensor:
    """R quantizations of g, shape (R, D), on ``kernels`` (the default: the fused ones)."""
    reps = g.repeat(R)
    gen = torch.Generator().manual_seed(seed)
    encoded = q.encode(reps, generator=gen, kernels=kernels, **kw)
    return q.decode(encoded, kernels=kernels).view(R, D)


def _mean_within(draws, expected, sigmas=5.0):
    """Every element's mean within `sigmas` standard errors (+ float slack) of `expected`."""
    mean = draws.double().mean(0)
    se = draws.double().std(0) / math.sqrt(draws.shape[0])
    return bool(((mean - expected.double()).abs() <= sigmas * se + 1e-6).all())


UNBIASED = [
    ("terngrad", {"clip": None, "bucket_size": D}),
    ("qsgd", {"levels": 3, "bucket_size": D}),
    ("qsgd", {"levels": 5, "bucket_size": D}),
    ("qsgd", {"levels": 9, "bucket_size": D, "norm": "l2"}),
    ("linear", {"levels": 2, "bucket_size": D}),
    ("linear", {"levels": 5, "bucket_size": D}),
    ("orq", {"levels": 3, "bucket_size": D}),
    ("orq", {"levels": 5, "bucket_size": D}),
    ("orq", {"levels": 9, "bucket_size": D}),
    ("fp32", {}),
]


#: every unbiased method with TernGrad's clipping (paper Sec. 4: "we also apply this in our
#: BinGrad and ORQ methods"): E[Q(g)] = clip(g) = sign(g) min(|g|, c sigma)
CLIPPED = [
    ("terngrad", {}),
    ("qsgd", {"levels": 3}),
    ("qsgd", {"levels": 5}),
    ("linear", {"levels": 5}),
    ("linear", {"levels": 9}),
    ("orq", {"levels": 3}),
    ("orq", {"levels": 5}),
    ("orq", {"levels": 9}),
]


def _clipped(g: torch.Tensor, c: float = 2.5) -> torch.Tensor:
    bound = c * g.std(correction=0)
    assert bool((g.abs() > bound).any())  # the test needs values to clip
    return g.clamp(-bound, bound)


@pytest.mark.parametrize("kind", ["gauss", "heavy"])
@pytest.mark.parametrize("name, options", UNBIASED, ids=lambda v: str(v))
def test_unbiased(name, options, kind):
    q = quantize.get(name, **options)
    assert q.unbiased
    g = _gradient(kind)
    assert _mean_within(_draws(q, g), g)


def test_the_unbiasedness_check_detects_bias():
    """The check above has power: it rejects biased methods on the same draws."""
    g = _gradient("gauss")
    for name in ("signsgd", "bingrad-b"):
        q = quantize.get(name, bucket_size=D)
        assert not q.unbiased
        assert not _mean_within(_draws(q, g), g)
    clipped = quantize.get("terngrad", clip=1.0, bucket_size=D)
    assert not _mean_within(_draws(clipped, g), g)


@pytest.mark.parametrize("reference", [False, True], ids=["fused", "reference"])
@pytest.mark.parametrize("name, options", CLIPPED, ids=lambda v: str(v))
def test_clipped_methods_are_unbiased_for_the_clipped_gradient(name, options, reference):
    q = quantize.get(name, clip=2.5, bucket_size=D, **options)
    assert not q.unbiased  # for g; for clip(g) it is
    g = _gradient("heavy")
    draws = _draws(q, g, kernels="torch" if reference else None)
    assert _mean_within(draws, _clipped(g))
    assert not _mean_within(draws, g)  # the clipped tail really moved the mean


@pytest.mark.parametrize(
    "name, options",
    [*CLIPPED[3:], ("bingrad-b", {}), ("bingrad-pb", {}), ("signsgd", {})],
    ids=lambda v: str(v),
)
def test_clipped_fit_and_digits_are_the_reference_bits(name, options):
    """The fused kernels clip as the reference does: the same scales and payload."""
    q = quantize.get(name, clip=2.5, bucket_size=D, **options)
    g = _gradient("heavy").repeat(40)
    fused = q.encode(g, generator=torch.Generator().manual_seed(5))
    ref = q.encode(g, generator=torch.Generator().manual_seed(5), kernels="torch")
    assert torch.equal(fused.scales, ref.scales) and torch.equal(fused.payload, ref.payload)
    unclipped = quantize.get(name, bucket_size=D, **options).encode(
        g, generator=torch.Generator().manual_seed(5)
    )
    assert not torch.equal(fused.scales, unclipped.scales)


@pytest.mark.parametrize("name", ["bingrad-b", "bingrad-pb", "signsgd"])
def test_clipped_biased_methods_fit_the_clipped_gradient(name):
    """The levels of a clipped encode are the unclipped method's levels of clip(g)."""
    g = _gradient("heavy")

    def encode(q, grad):
        return q.encode(grad, generator=torch.Generator().manual_seed(2))

    clipped = encode(quantize.get(name, clip=2.5, bucket_size=D), g)
    plain = encode(quantize.get(name, bucket_size=D), _clipped(g))
    assert torch.equal(clipped.scales, plain.scales)
    assert torch.equal(clipped.payload, plain.payload)


def test_clip_is_refused_where_it_cannot_hold():
    with pytest.raises(ValueError, match="norm='max'"):
        quantize.get("qsgd", clip=2.5, norm="l2")
    for bad in (0, -1.0, float("inf"), True, "2.5"):
        with pytest.raises(ValueError, match="clip must be a positive number"):
            quantize.get("orq", clip=bad)


def test_bingrad_pb_unbiased_inside_its_levels():
    g = _gradient("heavy")
    q = quantize.get("bingrad-pb", bucket_size=D)
    lo, hi = q.encode(g).scales.tolist()
    assert lo > float(g.min()) and hi < float(g.max())  # it does clamp the tails
    assert _mean_within(_draws(q, g), g.clamp(lo, hi))


@pytest.mark.parametrize("kind", ["gauss", "heavy"])
@pytest.mark.parametrize(
    "name, options",
    [
        *UNBIASED[:-1],
        ("terngrad", {"bucket_size": D}),
        ("bingrad-pb", {"bucket_size": D}),
        ("orq", {"levels": 5, "bucket_size": D, "clip": 2.5}),
        ("linear", {"levels": 5, "bucket_size": D, "clip": 2.5}),
        ("bingrad-pb", {"bucket_size": D, "clip": 2.5}),
    ],
    ids=lambda v: str(v),
)
def test_exact_variance_matches_draws(name, options, kind):
    q = quantize.get(name, **options)
    g = _gradient(kind)
    errors = (_draws(q, g, seed=3).double() - g.double()).square().sum(1)
    se = float(errors.std()) / math.sqrt(R)
    assert abs(float(errors.mean()) - q.variance(g)) <= 5 * se + 1e-9


@pytest.mark.parametrize(
    "name, options",
    [
        ("bingrad-b", {"bucket_size": D}),
        ("bingrad-b", {"bucket_size": D, "clip": 2.5}),
        ("signsgd", {"bucket_size": D}),
        ("signsgd", {"bucket_size": D, "clip": 2.5}),
        ("fp16", {}),
        ("fp32", {}),
    ],
    ids=lambda v: str(v),
)
def test_deterministic_error_is_exact(name, options):
    q = quantize.get(name, **options)
    g = _gradient("gauss")
    out = q.decode(q.encode(g))
    assert q.variance(g) == pytest.approx(float((out.double() - g.double()).square().sum()))


def test_terngrad_variance_formula():
    """E||t - g||^2 = s ||g||_1 - ||g||_2^2 (TernGrad, no clipping)."""
    for seed in range(5):
        g = _gradient("heavy", seed).double()
        s = float(g.abs().max())
        expected = s * float(g.abs().sum()) - float(g.square().sum())
        got = quantize.get("terngrad", clip=None).variance(g.float())
        assert got == pytest.approx(expected, rel=1e-5)


def test_terngrad_values_exactly_ternary_in_every_draw():
    g = _gradient("gauss")
    q = quantize.get("terngrad", bucket_size=D)
    reps = g.repeat(100)
    enc = q.encode(reps, generator=torch.Generator().manual_seed(0))
    s = enc.scales.repeat_interleave(D)
    out = q.decode(enc)
    assert bool(((out == s) | (out == -s) | (out == 0)).all())


@pytest.mark.parametrize("levels", [3, 5, 9, 17])
def test_qsgd_l2_variance_bound(levels):
    """QSGD Lemma 3.1: E||Q(v) - v||^2 <= min(d / m^2, sqrt(d) / m) ||v||^2, m = (levels-1)/2."""
    m = (levels - 1) // 2
    for d in (16, 256, 4096):
        for seed in range(3):
            v = torch.randn(d, generator=torch.Generator().manual_seed(seed))
            var = quantize.get("qsgd", levels=levels, norm="l2", bucket_size=None).variance(v)
            assert var <= min(d / m**2, math.sqrt(d) / m) * float(v.double().square().sum())


def test_signsgd_error_formula():
    g = _gradient("gauss")
    expected = float(g.double().square().sum() - g.double().abs().sum() ** 2 / D)
    assert quantize.get("signsgd").variance(g) == pytest.approx(expected, rel=1e-9)
    out = quantize.get("signsgd").decode(quantize.get("signsgd").encode(torch.tensor([0.0, -2.0])))
    assert out.tolist() == [1.0, -1.0]  # scale 1 = mean |g|, sign(0) = +1
