"""ORQ-s: per bucket, the ``s`` levels that minimise the variance of unbiased random rounding.

With sorted levels ``b_1 = min <= b_2 <= ... <= b_s = max`` of a bucket's values ``x``, unbiased
random rounding has variance::

    V(b) = sum_i sum_{x in [b_i, b_{i+1}]} (b_{i+1} - x)(x - b_i).

``V`` depends on an interior level ``b_j`` only through its two cells, and with the others fixed
it is *piecewise linear* in ``b_j``, with slope::

    dV/db_j = sum_{x in [b_{j-1}, b_j)} (x - b_{j-1}) - sum_{x in [b_j, b_{j+1}]} (b_{j+1} - x),

which grows with ``b_j``. The optimality condition is that this slope changes sign: the
left cell's mass-weighted distance from its far end ``b_{j-1}`` balances the right cell's
distance to ``b_{j+1}``. Since ``V`` is convex and piecewise linear in ``b_j`` with breakpoints at
data values, its minimiser is a data value, found *exactly* by evaluating ``V`` at every value of
``[b_{j-1}, b_{j+1}]`` with prefix sums (:func:`best_level`).

Algorithm, per bucket of n values:

1. Sort; fix ``b_1 = min``, ``b_s = max``.
2. Greedy recursive placement: place the middle level ``b_m`` (``m = (1 + s) // 2``) as the
   exact single-level optimum between ``b_1`` and ``b_s``, then recurse on ``[b_1, b_m]`` and
   ``[b_m, b_s]`` with the levels left for each. For s = 3 this is already the exact optimum.
3. Up to ``sweeps`` rounds of coordinate descent (fewer if no level moves): each interior
   ``b_j`` in turn is set to its exact optimum given its neighbours. Every update lowers ``V`` or
   keeps it, so the result is never worse than the greedy placement; run to convergence, every
   interior level is optimal given its neighbours.

Cost per bucket: ``O(n log n)`` for the sort plus ``O(n)`` per level placement, ``O(n log n +
(s - 2)(1 + sweeps) n)`` in all, vectorised across buckets in float64. Unbiased; ``s`` float32
levels per bucket on the wire, digits in base s.
"""

from __future__ import annotations

import torch

from terngrad.quantize.checks import check_bucket_size, check_levels
from terngrad.quantize.clipping import check_clip
from terngrad.quantize.levels import LevelQuantizer, canonical


def best_level(xs: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """Per row, the data value ``b`` in ``[lo, hi]`` minimising the variance of rounding the
    row's values in ``[lo, hi]`` onto ``{lo, b, hi}``.

    ``xs`` is ``(rows, n)`` sorted ascending (float64); ``lo``, ``hi`` are ``(rows,)`` values
    present in their rows. With ``a_i = x_i - lo`` and ``z_i = hi - x_i`` (zero outside the cell),
    ``V(b = x_m) = a_m sum_{i<m} a_i - sum_{i<m} a_i^2 + z_m sum_{i>m} z_i - sum_{i>m} z_i^2``.
    """
    lo, hi = lo[:, None], hi[:, None]
    inside = (xs >= lo) & (xs <= hi)
    a = torch.where(inside, xs - lo, 0.0)
    z = torch.where(inside, hi - xs, 0.0)
    left1, left2 = a.cumsum(1) - a, (a * a).cumsum(1) - a * a
    right1 = z.flip(1).cumsum(1).flip(1) - z
    right2 = (z * z).flip(1).cumsum(1).flip(1) - z * z
    variance = a * left1 - left2 + z * right1 - right2
    best = torch.where(inside, variance, torch.inf).argmin(1, keepdim=True)
    return xs.gather(1, best).squeeze(1)


def optimal_levels(rows: torch.Tensor, levels: int, sweeps: int = 3) -> torch.Tensor:
    """ORQ levels ``(rows, levels)``, float64 and sorted, for the values in each row."""
    xs = canonical(rows.to(torch.float64).sort(dim=1).values)
    b = xs.new_empty(xs.shape[0], levels)
    b[:, 0], b[:, -1] = xs[:, 0], xs[:, -1]
    pending = [(0, levels - 1)]
    while pending:  # greedy recursive placement
        i, j = pending.pop()
        if j - i < 2:
            continue
        mid = (i + j) // 2
        b[:, mid] = best_level(xs, b[:, i], b[:, j])
        pending += [(i, mid), (mid, j)]
    for _ in range(sweeps):  # coordinate descent, until no level moves
        before = b.clone()
        for j in range(1, levels - 1):
            b[:, j] = best_level(xs, b[:, j - 1], b[:, j + 1])
        if torch.equal(b, before):
            break
    return b


class ORQ(LevelQuantizer, name="orq", method_id=5):
    """ORQ-s: ``levels`` (s >= 2), ``bucket_size`` (None = per tensor), at most ``sweeps``
    rounds of coordinate descent after the greedy placement, ``clip`` (c in clipping at
    c * sigma first, or None)."""

    def __init__(
        self,
        levels: int = 5,
        bucket_size: int | None = 512,
        sweeps: int = 3,
        clip: float | None = None,
    ) -> None:
        self._n_levels = check_levels(levels, "orq")
        self.bucket_size = check_bucket_size(bucket_size)
        if isinstance(sweeps, bool) or not isinstance(sweeps, int) or sweeps < 0:
            raise ValueError(f"orq: sweeps must be a non-negative integer, got {sweeps!r}")
        self.sweeps = sweeps
        self.clip = check_clip(clip, "orq")

    @property
    def unbiased(self) -> bool:
        return self.clip is None

    @property
    def levels(self) -> int:
        return self._n_levels

    def _scales_per_bucket(self, levels: int) -> int:
        return levels

    def _fit(self, rows: torch.Tensor) -> torch.Tensor:
        return optimal_levels(rows, self.levels, self.sweeps)

    def coherent_scales(self, stacked: torch.Tensor) -> torch.Tensor:
        """The end levels the smallest min and the largest max over the workers (no value
        falls outside, rounding stays unbiased); each interior level the workers' mean, which
        keeps the levels sorted and inside the ends."""
        shared = super().coherent_scales(stacked)
        shared[:, 0], shared[:, -1] = stacked[..., 0].amin(0), stacked[..., -1].amax(0)
        return shared

    def _levels(self, scales: torch.Tensor, levels: int) -> torch.Tensor:
        return scales
