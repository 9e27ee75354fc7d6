"""``fit_scale``: error feedback that stays bounded with ternary digits (real gloo ranks).

Plain worker-side error feedback sends ``Q(g + e)`` and keeps ``e <- g + e - Q(g + e)``. With
TernGrad ``E||y - Q(y)||^2 = s ||y||_1 - ||y||^2``, more than ``||y||^2`` when the values are
evenly spread (``s ||y||_1 > 2 ||y||^2``): the residual then grows step after step. With
``fit_scale`` the digits decode to ``v = min_r <y_r, g_r> / ||y_r||_1`` (agreed in the scales'
all-reduce), the least-squares value, and the compression contracts. Fresh Gaussian gradients
of 4,096 elements on 2 ranks, 40 steps, fixed seeds: the runs are deterministic, and the
bounds below hold with a wide margin (measured: plain 8-21x the gradient's norm and growing,
fitted 1.05-1.6x and flat)."""

import comm_workers as w
import pytest
import torch
from ranks import run

STEPS = 40
CASES = [(2.5, "sharded"), (None, "sharded"), (None, "own-scales")]


@pytest.fixture(scope="module", params=CASES, ids=lambda c: f"clip{c[0]}-{c[1]}")
def fed_back(request):
    clip, topology = request.param
    return clip, topology, run(w.fitted_feedback, 2, clip, topology, STEPS)


def test_the_fitted_residual_stays_bounded_where_the_plain_one_grows(fed_back):
    _, _, ranks = fed_back
    for out in ranks:
        plain, fitted = out[False]["norms"], out[True]["norms"]
        assert plain[-1] > 5 * plain[0] and plain[-1] > 6.0  # grows, step after step
        assert max(fitted) < 2.0  # ||e|| within 2x one step's gradient, all along
        assert max(fitted[STEPS // 2 :]) < 1.2 * max(fitted[: STEPS // 2])  # and flat
        # what was sent, summed, stays near the true sum: 0.16-0.25 of it against 1.5-3.3
        assert out[True]["drift"] < 0.3 < 1.0 < out[False]["drift"]


def test_every_rank_gets_the_same_bits(fed_back):
    _, _, (a, b) = fed_back
    for fit in (False, True):
        assert torch.equal(a[fit]["first_mean"], b[fit]["first_mean"])
        assert torch.equal(a[fit]["last_mean"], b[fit]["last_mean"])


def test_the_digits_decode_to_the_least_squares_value(fed_back):
    """Step 1 (no residual yet), same draws: the fitted mean is the plain one times ``v / s``,
    ``v = min_r ||g_r||^2 / ||g_r||_1`` and ``s`` the shared scale ``max_r max |g_r|``
    (unclipped cases; with its own scales each rank's message is scaled by its own
    ``v_r / s_r``)."""
    clip, topology, ranks = fed_back
    if clip is not None:
        pytest.skip("the clip bound is the kernels' own: checked through the bounds above")
    grads = ranks[0]["gradients"]
    plain, fitted = ranks[0][False]["first_mean"], ranks[0][True]["first_mean"]
    fits = [float(g.square().sum() / g.abs().sum()) for g in grads]
    if topology == "own-scales":
        return _check_own_scales(grads, fits, plain, fitted)
    v, s = min(fits), max(float(g.abs().max()) for g in grads)
    assert v < s
    torch.testing.assert_close(fitted, plain * (v / s), rtol=1e-5, atol=1e-7)


def _check_own_scales(grads, fits, plain, fitted):
    """Each rank rounds on its own scale and decodes to its own fit: the mean of the digits
    ``t_r = round(g_r / s_r)`` is not recoverable from the plain mean alone, but both are
    ``(1/N) sum_r c_r t_r`` with ``c_r`` = ``s_r`` or ``v_r``: every element lies on one
    of the few values ``(c_0 t_0 + c_1 t_1) / 2``."""
    s = [float(g.abs().max()) for g in grads]
    for mean, c in ((plain, s), (fitted, fits)):
        grid = torch.tensor([(c[0] * i + c[1] * j) / 2 for i in (-1, 0, 1) for j in (-1, 0, 1)])
        nearest = (mean[:, None] - grid[None, :]).abs().min(1).values
        assert float(nearest.max()) < 1e-5
