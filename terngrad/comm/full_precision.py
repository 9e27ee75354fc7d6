"""The parameters kept in full precision: averaged by all-reduce in their own dtype.

A bf16 or fp16 tensor goes as 16-bit values (divided by N before the sum, as PyTorch's fp16 hook
does, so fp16 does not overflow); fp32 and fp64 ones are summed in their own dtype and then
divided by N. What the DDP hook defers to the step's end goes in one all-reduce per dtype, in
the model's parameter order (:func:`reduce_deferred`).
"""

from __future__ import annotations

import torch

from terngrad.comm.link import Link
from terngrad.comm.plans import BucketPlan

Deferred = list[tuple[torch.Tensor, BucketPlan]]


def mean(link: Link, values: torch.Tensor) -> torch.Tensor:
    """The mean over the ranks of ``link`` of ``values``, in their own dtype."""
    if values.dtype in (torch.float16, torch.bfloat16):
        return link.all_reduce(values / link.size)
    return link.all_reduce(values) / link.size


def reduce_deferred(link: Link, deferred: Deferred) -> bool:
    """Average every excluded span of the ``deferred`` buckets in place: one all-reduce per
    dtype of all of them in the model's parameter order. A ring all-reduce adds in an order set
    by where an element sits in the tensor, so this way the sums do not depend on how DDP
    grouped the parameters into buckets (which differs in a resumed process's first step), and
    a resumed run stays bitwise identical to an uninterrupted one. Returns True if some rank's
    values were not finite (then the buckets are left as they are)."""
    pieces = sorted(
        (index, k, offset, n)
        for k, (_, plan) in enumerate(deferred)
        for index, (offset, n) in zip(plan.excluded_indices, plan.excluded, strict=True)
    )
    for dtype in dict.fromkeys(deferred[k][0].dtype for _, k, _, _ in pieces):
        mine = [(deferred[k][0], o, n) for _, k, o, n in pieces if deferred[k][0].dtype == dtype]
        averaged = mean(link, torch.cat([buffer[o : o + n] for buffer, o, n in mine]))
        if not bool(torch.isfinite(averaged).all()):
            return True
        start = 0
        for buffer, o, n in mine:
            buffer[o : o + n].copy_(averaged[start : start + n])
            start += n
    return False
