"""BinGrad: two levels ``b_1 <= b_2`` per bucket, one bit per element.

``bingrad-b`` (biased, deterministic) chooses the levels that minimise the squared error of
rounding each value to its nearest level: the exact 1-D 2-means. Optimal clusters are
contiguous in sorted order, so with the bucket sorted and prefix sums ``S_k`` of its first k
(centred) values, the split maximising ``S_k^2 / k + (S - S_k)^2 / (n - k)`` is exact; the
levels are the two cluster means, and a value is rounded to the nearer one (threshold at their
midpoint). Cost ``O(n log n)`` per bucket.

``bingrad-pb`` (partially biased) chooses ``b_1 <= b_2`` to minimise variance plus squared
bias of: unbiased random rounding for values inside ``[b_1, b_2]``, clamping outside::

    f(b_1, b_2) = sum_{x < b_1} (b_1 - x)^2 + sum_{b_1 <= x <= b_2} (b_2 - x)(x - b_1)
                  + sum_{x > b_2} (x - b_2)^2.

``f`` is convex and piecewise quadratic in each level with the other fixed (its slope in
``b_1``, ``2 sum_{x<b_1} (b_1 - x) - sum_{b_1<=x<=b_2} (b_2 - x)``, grows with ``b_1``), so each
one-level problem is solved exactly: on each piece between consecutive data values the
stationary point is ``b_1 = (S_k + R / 2) / k`` (k values below, ``S_k`` their sum, ``R`` the
in-cell sum of ``b_2 - x``), and the minimiser is that of the first piece whose slope at its
right end is non-negative, clamped to the piece (bisection on prefix sums, O(log n)).
Coordinate descent alternates ``b_1`` and ``b_2`` (up to 10 rounds, or until they stop
moving). ``f`` is not jointly convex (the middle term is bilinear) and has local minima, so the
descent runs from five starts, ``(min, max)`` (pure unbiased rounding), the 2-means levels and
three pairs of symmetric order statistics, and keeps the best: never worse than any start, not
proven global. Cost ``O(n log n)`` per bucket for the sort and the prefix sums, plus
``O(5 * 10 * log n)`` for the descent in the fused kernel (here each round also copies the
rows still moving, ``O(n)``).
"""

from __future__ import annotations

import torch

from terngrad.quantize.checks import check_bucket_size
from terngrad.quantize.clipping import check_clip
from terngrad.quantize.levels import LevelQuantizer, canonical, ordered_sum

#: BinGrad-pb's rounds of coordinate descent at most, and the bucket fractions ``q`` of its
#: order-statistic starts ``(x_(qn), x_(n+1-qn))``
PB_SWEEPS = 10
PB_STARTS = (0.0, 0.05, 0.15, 0.3)


def _centred_sorted(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows in float64, centred on their mean (for accurate prefix sums), sorted; and the mean
    (sums in a fixed order: :func:`~terngrad.quantize.levels.ordered_sum`)."""
    x = rows.to(torch.float64)
    mean = ordered_sum(x) / x.shape[1]
    return canonical((x - mean).sort(dim=1).values), mean


def two_means(rows: torch.Tensor) -> torch.Tensor:
    """Exact 1-D 2-means per row: the two cluster means ``(rows, 2)``, ascending, float64."""
    xs, mean = _centred_sorted(rows)
    n = xs.shape[1]
    if n == 1:
        return torch.cat([xs, xs], dim=1) + mean
    sums = xs.cumsum(1)
    prefix, total = sums[:, :-1], sums[:, -1:]  # S_k for k = 1..n-1, and S
    k = torch.arange(1, n, dtype=torch.float64)
    score = prefix.square() / k + (total - prefix).square() / (n - k)
    best = score.argmax(1, keepdim=True)
    left_sum, kk = prefix.gather(1, best), k[best]
    return torch.cat([left_sum / kk, (total - left_sum) / (n - kk)], dim=1) + mean


class _PrefixSums:
    """Sorted values of each row with prefix sums, to evaluate ``f(b_1, b_2)`` in O(1)."""

    def __init__(self, xs: torch.Tensor) -> None:
        zero = xs.new_zeros(xs.shape[0], 1)
        self.xs = xs
        self.p1 = torch.cat([zero, xs.cumsum(1)], dim=1)
        self.p2 = torch.cat([zero, (xs * xs).cumsum(1)], dim=1)
        # piece k = 1..n of b_1: [x_k, x_{k+1}] with x_{n+1} = +inf
        self.upper = torch.cat([xs[:, 1:], torch.full_like(xs[:, :1], torch.inf)], dim=1)

    @property
    def n(self) -> int:
        return self.xs.shape[1]

    def rows(self, index: torch.Tensor) -> _PrefixSums:
        """The same sums for a subset of the rows."""
        sub = object.__new__(_PrefixSums)
        sub.xs, sub.p1, sub.p2, sub.upper = (
            t[index] for t in (self.xs, self.p1, self.p2, self.upper)
        )
        return sub

    def objective(
        self, b1: torch.Tensor, b2: torch.Tensor, i1: torch.Tensor, i2: torch.Tensor
    ) -> torch.Tensor:
        """``f(b_1, b_2)`` for ``(rows, K)`` candidate pairs (see the module doc), given the
        number of values counted below ``b_1`` (``i1``) and at or below ``b_2`` (``i2``); a value
        equal to ``b_1`` contributes 0 on either side, so either count works for it."""
        s1, s2 = self.p1.gather(1, i1), self.p1.gather(1, i2)
        q1, q2 = self.p2.gather(1, i1), self.p2.gather(1, i2)
        n1, n2 = i1.to(b1.dtype), i2.to(b1.dtype)
        left = n1 * b1 * b1 - 2 * b1 * s1 + q1
        middle = -(q2 - q1) + (b1 + b2) * (s2 - s1) - b1 * b2 * (n2 - n1)
        right = (self.p2[:, -1:] - q2) - 2 * b2 * (self.p1[:, -1:] - s2) + (self.n - n2) * b2 * b2
        return left + middle + right

    def best_low(self, b2: torch.Tensor) -> torch.Tensor:
        """The ``b_1 <= b_2`` minimising ``f(., b_2)`` per row, ``b2`` of shape ``(rows,)``.

        Piece k (k = 1..K, ``K = max(i_2, 1)`` with ``i_2`` the values ``<= b_2``) is ``b_1``
        in ``[x_k, e_k]``, ``e_k = min(x_{k+1}, b_2)``, with ``x_1..x_k`` counted below it.
        There the slope is ``2 (k b_1 - S_k) - R_k`` (``R_k`` the in-cell sum of ``b_2 - x``),
        zero at ``(S_k + R_k / 2) / k``. ``f`` being convex in ``b_1``, the slope at the pieces'
        right ends ``g_k`` does not decrease with k, and the minimiser is the stationary point
        of the first piece with ``g_k >= 0`` (else of piece K), clamped to its piece: found by
        bisection over k, ``O(log n)`` per row.
        """
        xs = self.xs
        b2c = b2[:, None]
        i2 = torch.searchsorted(xs, b2c.contiguous(), right=True)  # values <= b2
        lo, hi = torch.ones_like(i2), torch.maximum(i2, torch.ones_like(i2))
        for _ in range(self.n.bit_length()):  # first k in [lo, hi] with g_k >= 0, else hi
            mid = (lo + hi) // 2
            stationary, end, slope = self._piece(mid, i2, b2c)
            searching = lo < hi
            right = slope >= 0
            hi = torch.where(searching & right, mid, hi)
            lo = torch.where(searching & ~right, mid + 1, lo)
        stationary, end, _ = self._piece(lo, i2, b2c)
        below = self.xs.gather(1, lo - 1)
        return torch.minimum(torch.maximum(stationary, below), end).squeeze(1)

    def _piece(self, k: torch.Tensor, i2: torch.Tensor, b2: torch.Tensor):
        """For piece ``k`` (``(rows, 1)``) given ``i2`` and ``b2``: its stationary point
        ``(S_k + R_k / 2) / k``, its right end ``e_k`` and the slope there."""
        in_cell = (i2 - k).clamp(min=0).to(self.xs.dtype)
        s_k = self.p1.gather(1, k)
        r = in_cell * b2 - (self.p1.gather(1, i2) - s_k) * (in_cell > 0)
        kf = k.to(self.xs.dtype)
        end = torch.minimum(self.upper.gather(1, k - 1), b2)
        return (s_k + r / 2) / kf, end, 2 * (kf * end - s_k) - r

    def value(self, b1: torch.Tensor, b2: torch.Tensor) -> torch.Tensor:
        """``f(b_1, b_2)`` for one pair per row (``(rows,)`` each)."""
        b1, b2 = b1[:, None].contiguous(), b2[:, None].contiguous()
        i1 = torch.searchsorted(self.xs, b1)
        i2 = torch.searchsorted(self.xs, b2, right=True)
        return self.objective(b1, b2, i1, i2).squeeze(1)


def partially_biased_levels(rows: torch.Tensor, sweeps: int = PB_SWEEPS) -> torch.Tensor:
    """BinGrad-pb levels ``(rows, 2)``, float64: the best of coordinate descent on ``f`` (module
    doc) from several starts: the 2-means levels and the pairs of order statistics
    ``(x_(i), x_(n+1-i))`` for i at 0, 5, 15 and 30 % of the bucket."""
    xs, mean = _centred_sorted(rows)
    n = xs.shape[1]
    ascending = _PrefixSums(xs)
    mirrored = _PrefixSums(-xs.flip(1))  # best b_2 given b_1 is -best_low(-b_1) of -x
    starts = [two_means(xs)] + [
        xs[:, [i, n - 1 - i]] for i in sorted({int(q * n) for q in PB_STARTS})
    ]
    best, best_f = None, None
    for start in starts:
        b1, b2 = start[:, 0].clone(), start[:, 1].clone()
        active = torch.arange(xs.shape[0], device=xs.device)  # rows still moving
        for _ in range(sweeps):
            new_b1 = ascending.rows(active).best_low(b2[active])
            new_b2 = -mirrored.rows(active).best_low(-new_b1)
            moved = (new_b1 != b1[active]) | (new_b2 != b2[active])
            b1[active], b2[active] = new_b1, new_b2
            active = active[moved]
            if not active.numel():
                break
        f = ascending.value(b1, b2)
        pair = torch.stack([b1, b2], dim=1)
        if best is None:
            best, best_f = pair, f
        else:
            better = f < best_f
            best, best_f = torch.where(better[:, None], pair, best), torch.minimum(f, best_f)
    return best + mean


class BinGradB(LevelQuantizer, name="bingrad-b", method_id=6):
    """BinGrad-b: exact 2-means levels, nearest rounding. ``bucket_size`` (None = per tensor),
    ``clip`` (c in clipping at c * sigma first, or None)."""

    unbiased = False
    rounding = "nearest"
    levels = 2

    def __init__(self, bucket_size: int | None = 512, clip: float | None = None) -> None:
        self.bucket_size = check_bucket_size(bucket_size)
        self.clip = check_clip(clip, self.name)

    def _scales_per_bucket(self, levels: int) -> int:
        return 2

    def _fit(self, rows: torch.Tensor) -> torch.Tensor:
        return two_means(rows)

    def _levels(self, scales: torch.Tensor, levels: int) -> torch.Tensor:
        return scales


class BinGradPB(BinGradB, name="bingrad-pb", method_id=7):
    """BinGrad-pb: levels minimising variance + squared bias; unbiased random rounding inside
    ``[b_1, b_2]``, clamping outside. ``bucket_size`` (None = per tensor), ``clip``."""

    rounding = "stochastic"

    def _fit(self, rows: torch.Tensor) -> torch.Tensor:
        return partially_biased_levels(rows)
