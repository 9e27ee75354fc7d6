"""What every rank must agree on before the first exchange, and what a saved hook state must
match: the exchange's configuration, as one comparable dict."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import torch
import torch.distributed as dist

from terngrad.comm.link import Link
from terngrad.comm.options import Options
from terngrad.kernels import Kernels
from terngrad.quantize import Quantizer
from terngrad.util.differences import differences

#: configuration entries that may differ between ranks and between a state and its hook: kernel
#: backends round to the same bytes given the same scales, and every rank decodes the same
#: all-reduced scales and summed digits, so replicas stay identical whichever runs where
INTERCHANGEABLE = ("kernels",)
#: what a saved hook state may differ in besides: fused buckets or not, the state (generator,
#: residuals by parameter name, counters) is the same
RESUMABLE_ACROSS = (*INTERCHANGEABLE, "fuse_buckets")


def exchange_config(
    options: Options,
    quantizer: Quantizer,
    kernels: Kernels,
    excluded: set[str],
    world: int,
    params: Sequence[tuple[str, torch.Tensor]],
) -> dict[str, Any]:
    """The configuration ranks compare and hook states carry (the exclusions as names, so a
    state saved before ``quantize_last`` and ``min_numel`` had those names still loads)."""
    return {
        "quantizer": quantizer.name,
        "quantizer_options": quantizer.options,
        "topology": options.topology,
        "error_feedback": options.error_feedback,
        "aggregate": options.aggregate,
        "full_precision_steps": options.full_precision_steps,
        "excluded": sorted(excluded),
        "seed": options.seed,
        "kernels": kernels.name,
        "policy": options.policy,
        "fuse_buckets": options.fuse_buckets,
        "own_scales": options.own_scales,
        "world_size": world,
        "parameters": [(name, tuple(p.shape), str(p.dtype)) for name, p in params],
    }


def differing_ranks(
    mine: dict[str, Any], group: dist.ProcessGroup | None = None, ignore: Collection[str] = ()
) -> list[str]:
    """``rank r: <differences>`` for every rank of ``group`` whose ``mine`` differs from rank
    0's (a collective: every rank calls it; every rank gets the same list)."""
    every: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(every, mine, group=group)
    return [
        f"rank {r}: " + ", ".join(found)
        for r, other in enumerate(every)
        if (found := differences(every[0], other, ignore))
    ]


def check_same_config(link: Link, config: dict[str, Any]) -> None:
    """Fail on every rank of ``link``, naming the differences, unless all ranks have the same
    ``config`` (a collective)."""
    problems = differing_ranks(config, link.group, INTERCHANGEABLE)
    if problems:
        raise ValueError(
            "terngrad: the ranks registered different exchange configurations (compared with "
            "rank 0) — " + " | ".join(problems)
        )


def check_saved_config(config: dict[str, Any], saved: dict[str, Any]) -> None:
    """Refuse a hook state saved with another configuration than ``config``."""
    # a state saved before ``policy`` and ``own_scales`` existed had their defaults
    found = differences(config, {"policy": "quantize", "own_scales": False, **saved},
                        RESUMABLE_ACROSS)  # fmt: skip
    if found:
        raise ValueError(
            "this hook state was saved with another configuration (saved value instead of this "
            "hook's): " + "; ".join(found)
        )
