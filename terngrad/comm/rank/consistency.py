"""Replica consistency: every rank must hold bitwise the same parameters.

Parameter localization (each rank applies the same averaged gradient to its own replica) keeps
replicas identical as long as every rank computes the same thing. A bug, a flipped bit in
memory or a rank running other code breaks that silently; :func:`check_replicas` finds it: one
CRC-32 per parameter tensor, gathered from every rank (a few bytes a parameter), compared.
"""

from __future__ import annotations

import zlib
from collections import Counter

import torch
import torch.distributed as dist
from torch import nn


class ReplicasDiverged(RuntimeError):
    """The ranks' parameters are not bitwise identical."""


def parameter_checksums(module: nn.Module) -> list[tuple[str, int]]:
    """CRC-32 of the bytes of every parameter of ``module``, by name."""
    out = []
    for name, p in module.named_parameters():
        data = p.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy()
        out.append((name, zlib.crc32(memoryview(data))))
    return out


def check_replicas(
    module: nn.Module, group: dist.ProcessGroup | None = None, step: int | None = None
) -> None:
    """Raise :class:`ReplicasDiverged` on every rank, naming the ranks and the first parameter
    that differ, unless all ranks of ``group`` hold the same parameters (a collective)."""
    mine = parameter_checksums(module)
    world = dist.get_world_size(group)
    every: list = [None] * world
    dist.all_gather_object(every, mine, group=group)
    if all(other == every[0] for other in every):
        return
    keys = [tuple(c for _, c in sums) for sums in every]
    (majority, _), *_ = Counter(keys).most_common()
    odd = [r for r, k in enumerate(keys) if k != majority]
    reference = keys.index(majority)
    ref, bad = every[reference], every[odd[0]]
    differing = [n for (n, a), (m, b) in zip(ref, bad, strict=False) if n != m or a != b]
    name = differing[0] if differing and len(ref) == len(bad) else "the parameter lists"
    when = f" at step {step}" if step is not None else ""
    raise ReplicasDiverged(
        f"replicas diverged{when}: rank(s) {', '.join(map(str, odd))} hold other parameters "
        f"than rank {reference} and the rest (first difference: {name}); training cannot go "
        "on consistently: resume every rank from the last checkpoint"
    )
