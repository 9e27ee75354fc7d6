"""Level choice of ORQ and BinGrad against brute force, and ORQ against Linear and QSGD."""

import itertools

import pytest
import torch

from terngrad import quantize
from terngrad.quantize.bingrad import partially_biased_levels, two_means
from terngrad.quantize.orq import optimal_levels


def _data(kind: str, n: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    if kind == "gauss":
        return torch.randn(n, generator=gen)
    if kind == "laplace":
        u = torch.rand(n, generator=gen) - 0.5
        return -torch.sign(u) * torch.log1p(-2 * u.abs())
    u = torch.rand(n, generator=gen)  # Student-t, 2 degrees of freedom
    return torch.randn(n, generator=gen) / torch.sqrt(-torch.log(u))


def _rounding_variance(x: torch.Tensor, levels: torch.Tensor) -> float:
    """Variance of unbiased random rounding of x onto sorted levels covering it."""
    x, levels = x.double(), levels.double()
    idx = (torch.searchsorted(levels, x, right=True) - 1).clamp(0, len(levels) - 2)
    lo, hi = levels[idx], levels[idx + 1]
    return float(((hi - x) * (x - lo)).sum())


def _pb_objective(x: torch.Tensor, b1: float, b2: float) -> float:
    x = x.double()
    below, above = x[x < b1], x[x > b2]
    inside = x[(x >= b1) & (x <= b2)]
    return float(
        (b1 - below).square().sum() + ((b2 - inside) * (inside - b1)).sum()
        + (above - b2).square().sum()
    )  # fmt: skip


@pytest.mark.parametrize("kind", ["gauss", "laplace", "heavy"])
def test_orq3_is_the_exact_optimum(kind):
    for seed in range(5):
        x = _data(kind, 200, seed)
        lo, hi = float(x.min()), float(x.max())
        best = min(_rounding_variance(x, torch.tensor([lo, float(b), hi])) for b in x.double())
        # the optimum over data values is the optimum over the whole interval
        grid = torch.linspace(lo, hi, 2001, dtype=torch.float64)
        assert best <= min(_rounding_variance(x, torch.tensor([lo, float(b), hi])) for b in grid)
        q = quantize.get("orq", levels=3, bucket_size=None)
        assert q.variance(x) == pytest.approx(best, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("levels", [4, 5])
def test_orq_small_levels_match_exhaustive_search(levels):
    """For few values, every choice of interior levels among the data can be tried."""
    for seed in range(3):
        x = _data("heavy", 24, seed).double()
        xs = x.sort().values
        best = min(
            _rounding_variance(x, torch.cat([xs[:1], xs[list(c)], xs[-1:]]))
            for c in itertools.combinations(range(1, 23), levels - 2)
        )
        got = quantize.get("orq", levels=levels, bucket_size=None, sweeps=10).variance(x.float())
        assert got == pytest.approx(best, rel=1e-6)


@pytest.mark.parametrize("kind", ["gauss", "heavy"])
@pytest.mark.parametrize("levels", [3, 5, 9])
def test_orq_beats_linear_and_qsgd(kind, levels):
    x = _data(kind, 64 * 512, 0)
    orq = quantize.get("orq", levels=levels).variance(x)
    assert orq <= quantize.get("linear", levels=levels).variance(x)
    assert orq <= quantize.get("qsgd", levels=levels).variance(x)


def test_orq_levels_and_descent():
    rows = _data("gauss", 8 * 256, 1).view(8, 256)
    greedy = optimal_levels(rows, 9, sweeps=0)
    refined = optimal_levels(rows, 9, sweeps=1000)  # stops when no level moves
    for b in (greedy, refined):
        assert torch.equal(b[:, 0], rows.double().amin(1)) and torch.equal(
            b[:, -1], rows.double().amax(1)
        )
        assert bool((b[:, 1:] >= b[:, :-1]).all())
    for r in range(8):
        v_greedy = _rounding_variance(rows[r], greedy[r])
        v_refined = _rounding_variance(rows[r], refined[r])
        assert v_refined <= v_greedy + 1e-12
        # each interior level is a coordinate-wise optimum: no other data value does better
        for j in range(1, 8):
            for b in rows[r].double():
                if refined[r, j - 1] <= b <= refined[r, j + 1]:
                    trial = refined[r].clone()
                    trial[j] = b
                    assert _rounding_variance(rows[r], trial) >= v_refined - 1e-9


@pytest.mark.parametrize("kind", ["gauss", "laplace", "heavy"])
def test_bingrad_b_is_exact_two_means(kind):
    for seed in range(5):
        x = _data(kind, 50, seed).double()
        xs = x.sort().values
        best = min(
            float((xs[:k] - xs[:k].mean()).square().sum() + (xs[k:] - xs[k:].mean()).square().sum())
            for k in range(1, 50)
        )
        q = quantize.get("bingrad-b", bucket_size=None)
        assert q.variance(x.float()) == pytest.approx(best, rel=1e-5)
        assert two_means(x[None]).shape == (1, 2)


@pytest.mark.parametrize("kind", ["gauss", "laplace", "heavy"])
def test_bingrad_pb_levels_near_grid_optimum(kind):
    """Within 0.5 % of the best pair on a 301 x 301 grid, and never worse than its starts."""
    for seed in range(4):
        x = _data(kind, 64, seed).double()
        b1, b2 = partially_biased_levels(x[None].float())[0].tolist()
        f = _pb_objective(x, b1, b2)
        grid = torch.linspace(float(x.min()), float(x.max()), 301, dtype=torch.float64)
        lo, hi = torch.meshgrid(grid, grid, indexing="ij")
        v, l3, h3 = x[None, None], lo[..., None], hi[..., None]
        per = torch.where(
            v < l3, (l3 - v) ** 2, torch.where(v > h3, (v - h3) ** 2, (h3 - v) * (v - l3))
        )
        best = float(torch.where(hi >= lo, per.sum(-1), torch.inf).min())
        assert f <= best * 1.005
        assert f <= _pb_objective(x, float(x.min()), float(x.max())) + 1e-12
        m1, m2 = two_means(x[None])[0].tolist()
        assert f <= _pb_objective(x, m1, m2) + 1e-12
        # and the quantizer reports the same objective as its variance
        q = quantize.get("bingrad-pb", bucket_size=None)
        assert q.variance(x.float()) == pytest.approx(f, rel=1e-4)
