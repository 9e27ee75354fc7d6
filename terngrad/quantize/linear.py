"""Linear-s: ``s`` levels evenly spaced on ``[min, max]`` of each bucket, random rounding.

``b_i = min + (max - min) (i - 1) / (s - 1)`` for ``i = 1..s``; a value between neighbours is
rounded to one of them at random without bias (see :mod:`terngrad.quantize.levels`), so the
variance is ``sum_k (b_{i+1} - g_k)(g_k - b_i) <= d ((max - min) / (s - 1))^2 / 4``.
Two float32 scales (min, max) per bucket; digits in base s.
"""

from __future__ import annotations

import torch

from terngrad.quantize.checks import check_bucket_size, check_levels
from terngrad.quantize.clipping import check_clip
from terngrad.quantize.levels import LevelQuantizer, canonical


class Linear(LevelQuantizer, name="linear", method_id=4):
    """Linear-s: ``levels`` (s >= 2), ``bucket_size`` (None = per tensor), ``clip`` (c in
    clipping at c * sigma first, or None)."""

    def __init__(
        self, levels: int = 5, bucket_size: int | None = 512, clip: float | None = None
    ) -> None:
        self._n_levels = check_levels(levels, "linear")
        self.bucket_size = check_bucket_size(bucket_size)
        self.clip = check_clip(clip, "linear")

    @property
    def unbiased(self) -> bool:
        return self.clip is None

    @property
    def levels(self) -> int:
        return self._n_levels

    def _scales_per_bucket(self, levels: int) -> int:
        return 2

    def _fit(self, rows: torch.Tensor) -> torch.Tensor:
        return canonical(torch.stack([rows.amin(1), rows.amax(1)], dim=1))

    def coherent_scales(self, stacked: torch.Tensor) -> torch.Tensor:
        """The smallest min and the largest max over the workers: every worker's values lie
        on the shared levels' span, so rounding onto them stays unbiased."""
        return torch.stack([stacked[..., 0].amin(0), stacked[..., 1].amax(0)], dim=-1)

    def _levels(self, scales: torch.Tensor, levels: int) -> torch.Tensor:
        weights = torch.linspace(0, 1, levels, device=scales.device, dtype=torch.float64)
        # lerp gives exactly min at weight 0 and exactly max at weight 1; in float64, as
        # max - min overflows float32 for a range near its limits
        lo, hi = scales[:, :1].double(), scales[:, 1:].double()
        return torch.lerp(lo, hi, weights).float()
