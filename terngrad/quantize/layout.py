"""How a flat gradient is cut into scale groups: :class:`Layout` (segments, then buckets)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property

import torch


@dataclass(frozen=True)
class Layout:
    """How a flat gradient is cut into scale groups ("buckets").

    The flat tensor is a run of consecutive ``segments`` (the layers of a flat buffer, or one
    segment for a single tensor); each segment is cut into buckets of ``bucket_size`` elements,
    its last bucket shorter (``None``: one bucket per segment). Every bucket gets its own scales,
    so TernGrad's scales stay layer-wise even when several layers travel in one buffer.
    """

    segments: tuple[int, ...]
    bucket_size: int | None = None

    @classmethod
    def of(
        cls, numel: int, segments: Sequence[int] | None = None, bucket_size: int | None = None
    ) -> Layout:
        """The layout of a flat tensor of ``numel`` elements; ``segments`` must sum to it."""
        if segments is None:
            return cls((numel,), bucket_size)
        segs = tuple(segments)
        if any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in segs):
            raise ValueError(f"segments must be non-negative integers, got {list(segs)[:8]}...")
        if sum(segs) != numel:
            raise ValueError(f"segments sum to {sum(segs)} elements, the gradient has {numel}")
        return cls(segs or (0,), bucket_size)

    @property
    def numel(self) -> int:
        return sum(self.segments)

    @cached_property
    def _blocks(self) -> tuple[tuple[int, int, int], ...]:
        """``(start, rows, cols)`` of each 2-D block of whole buckets, in bucket order."""
        out, start = [], 0
        for n in self.segments:
            size = self.bucket_size if self.bucket_size and self.bucket_size < n else n
            if n:
                full = n - n % size
                out.append((start, full // size, size))
                if full < n:
                    out.append((start + full, 1, n - full))
            start += n
        return tuple(out)

    @property
    def n_buckets(self) -> int:
        return sum(rows for _, rows, _ in self._blocks)

    @cached_property
    def bucket_lengths(self) -> torch.Tensor:
        """Elements of each bucket (int64)."""
        return torch.tensor(
            [cols for _, rows, cols in self._blocks for _ in range(rows)], dtype=torch.int64
        )

    @cached_property
    def bucket_starts(self) -> torch.Tensor:
        """Offset of each bucket's first element, then ``numel`` (int64, ``n_buckets + 1``)."""
        return torch.cat([torch.zeros(1, dtype=torch.int64), self.bucket_lengths.cumsum(0)])

    @cached_property
    def segment_starts(self) -> torch.Tensor:
        """Offset of each segment's first element, then ``numel`` (int64)."""
        lengths = torch.tensor(self.segments, dtype=torch.int64)
        return torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])

    def rows(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """Views of ``flat`` as 2-D blocks, one bucket a row; per-row results concatenated in
        order are in bucket order, and flattened per-element results are in element order."""
        return [flat[s : s + r * c].view(r, c) for s, r, c in self._blocks]

    def reduce(self, flat: torch.Tensor, fn: Callable[[torch.Tensor], torch.Tensor]):
        """``fn`` over the rows of every block, concatenated: one result per bucket."""
        parts = [fn(rows) for rows in self.rows(flat)]
        return torch.cat(parts) if parts else flat.new_empty(0)

    def expand(self, per_bucket: torch.Tensor) -> torch.Tensor:
        """Each bucket's value repeated over its elements."""
        if self.n_buckets == 1:
            return per_bucket.expand(self.numel)
        return per_bucket.repeat_interleave(self.bucket_lengths.to(per_bucket.device))

    def slice(self, start: int, stop: int) -> Layout:
        """The layout of ``flat[start:stop]``: the segments cut at the ends, buckets restarting
        at the new start."""
        segs, offset = [], 0
        for n in self.segments:
            lo, hi = max(offset, start), min(offset + n, stop)
            if hi > lo:
                segs.append(hi - lo)
            offset += n
        return Layout(tuple(segs) or (0,), self.bucket_size)

    @property
    def wire_segments(self) -> tuple[int, ...]:
        """The segments as a frame records them: empty for a single segment."""
        return self.segments if len(self.segments) > 1 else ()
