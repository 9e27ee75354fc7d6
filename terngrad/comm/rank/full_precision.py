"""The parameters kept in full precision: averaged by all-reduce in their own dtype.

A bf16 or fp16 tensor goes as 16-bit values (divided by N before the sum, as PyTorch's fp16 hook
does, so fp16 does not overflow); fp32 and fp64 ones are summed in their own dtype and then
divided by N. What the DDP hook defers to the step's end goes in one all-reduce per dtype, in
the model's parameter order (:func:`start_deferred`), started when the step's last bucket
arrives and finished after that bucket's quantized exchange, which runs meanwhile on another
process group: one round less after the backward pass, the same sums.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from terngrad.comm.exchanges.link import Link
from terngrad.comm.rank.plans import BucketPlan

Deferred = list[tuple[torch.Tensor, BucketPlan]]
_HALF = (torch.float16, torch.bfloat16)


def mean(link: Link, values: torch.Tensor) -> torch.Tensor:
    """The mean over the ranks of ``link`` of ``values``, in their own dtype."""
    if values.dtype in _HALF:
        return link.all_reduce(values / link.size)
    return link.all_reduce(values) / link.size


@dataclass
class Pending:
    """The deferred tensors' all-reduces under way: per dtype, the wait, the size to divide by
    afterwards (1 where the values were divided before), and where the means go."""

    parts: list[tuple[Callable[[], torch.Tensor], int, list[tuple[torch.Tensor, int, int]]]]

    def finish(self) -> bool:
        """Wait, and write every mean into its bucket; True (and nothing written) if some
        rank's values were not finite."""
        means = [wait() / divisor if divisor > 1 else wait() for wait, divisor, _ in self.parts]
        if not all(bool(torch.isfinite(m).all()) for m in means):
            return True
        for averaged, (_, _, spans) in zip(means, self.parts, strict=True):
            start = 0
            for buffer, o, n in spans:
                buffer[o : o + n].copy_(averaged[start : start + n])
                start += n
        return False


def start_deferred(link: Link, deferred: Deferred) -> Pending:
    """Start averaging every excluded span of the ``deferred`` buckets: one all-reduce per
    dtype of all of them in the model's parameter order. A ring all-reduce adds in an order set
    by where an element sits in the tensor, so this way the sums do not depend on how DDP
    grouped the parameters into buckets (which differs in a resumed process's first step), and
    a resumed run stays bitwise identical to an uninterrupted one."""
    pieces = sorted(
        (index, k, offset, n)
        for k, (_, plan) in enumerate(deferred)
        for index, (offset, n) in zip(plan.excluded_indices, plan.excluded, strict=True)
    )
    parts = []
    for dtype in dict.fromkeys(deferred[k][0].dtype for _, k, _, _ in pieces):
        mine = [(deferred[k][0], o, n) for _, k, o, n in pieces if deferred[k][0].dtype == dtype]
        values = torch.cat([buffer[o : o + n] for buffer, o, n in mine])
        half = dtype in _HALF  # as mean(): 16-bit values divided first, so they do not overflow
        wait = link.start_all_reduce(values / link.size if half else values)
        parts.append((wait, 1 if half else link.size, mine))
    return Pending(parts)
