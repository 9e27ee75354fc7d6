"""What every rank must agree on before the first exchange, and what a saved hook state must
match: the exchange's configuration, as one comparable dict."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import torch
import torch.distributed as dist

from terngrad.comm.exchanges.link import Link
from terngrad.comm.spec.options import Options
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
#: the options' fields that are not compared as they are: a rank's own wait (``timeout``), and
#: the exclusions, compared by their effect (``excluded``: the names kept in full precision)
_NOT_COMPARED = ("timeout", "quantize_last", "min_numel")


def exchange_config(
    options: Options,
    quantizer: Quantizer,
    kernels: Kernels,
    excluded: set[str],
    world: int,
    params: Sequence[tuple[str, torch.Tensor]],
) -> dict[str, Any]:
    """The configuration ranks compare and hook states carry: every field of ``options`` (a
    setting added to :class:`Options` is compared without a change here) but
    :data:`_NOT_COMPARED`, the quantizer as made, the backend, the world, the parameters, and
    the exclusions as names (so a state saved before ``quantize_last`` and ``min_numel`` had
    those names still loads)."""
    fields = options.to_dict()
    return {
        **{k: v for k, v in fields.items() if k not in _NOT_COMPARED},
        "quantizer": quantizer.name,
        "quantizer_options": quantizer.options,
        "kernels": kernels.name,
        "excluded": sorted(excluded),
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
    """Refuse a hook state saved with another configuration than ``config`` (a state of an
    earlier version has the defaults of the settings added since, and its ``own_scales`` is
    the topology ``own-scales``)."""
    defaults = Options().to_dict()
    saved = {**{k: defaults[k] for k in config if k in defaults}, **saved}
    if saved.pop("own_scales", False) is True:
        saved["topology"] = "own-scales"
    found = differences(config, saved, RESUMABLE_ACROSS)
    if found:
        raise ValueError(
            "this hook state was saved with another configuration (saved value instead of this "
            "hook's): " + "; ".join(found)
        )
