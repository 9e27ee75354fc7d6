"""What each exchange moves, exactly: the byte and message formulas the performance model and the
auto policy predict from, tested equal to what :class:`~terngrad.comm.exchanges.link.Link` counts.

Each collective is counted as :class:`~terngrad.comm.exchanges.link.Link` counts it (N ranks): a
ring all-reduce of ``b`` bytes sends and receives ``2 (N-1)/N b`` in ``2 (N-1)`` messages; an
all-to-all sends every other rank its chunk (N-1 messages); a ring all-gather of chunks padded
to the widest ``w`` moves ``(N-1) w`` each way (N-1 messages); a gather sends the root one
message; a broadcast is the root's N-1 messages. An exchange's :class:`Traffic` at a rank is
the sum over its collectives; its critical path adds, per collective, the larger of what the
rank sends and receives (links are full duplex, the collectives one after the other).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from terngrad import quantize
from terngrad.comm.exchanges.exchange import PLAIN, ExchangeSettings, shard_bounds
from terngrad.comm.exchanges.topologies import TOPOLOGIES
from terngrad.quantize import Layout, LevelQuantizer, Quantizer, SymmetricGrid
from terngrad.wire import codes_frame_nbytes


@dataclass(frozen=True)
class Traffic:
    """What one exchange moves at one rank: bytes sent and received; ``path``, the bytes on
    its critical path (per collective the larger of what it sends and receives); and the
    point-to-point messages it sends (what per-message latency multiplies)."""

    sent: int = 0
    received: int = 0
    path: int = 0
    messages: int = 0

    def __add__(self, other: Traffic) -> Traffic:
        return Traffic(
            self.sent + other.sent,
            self.received + other.received,
            self.path + other.path,
            self.messages + other.messages,
        )


NONE = Traffic()


def _moved(sent: int, received: int, messages: int) -> Traffic:
    return Traffic(sent, received, max(sent, received), messages)


def ring_bytes(nbytes: int, world: int) -> int:
    """Bytes each rank sends (and receives) in a bandwidth-optimal ring all-reduce of a
    tensor of ``nbytes``: ``2 (N-1)/N nbytes`` (reduce-scatter, then all-gather)."""
    return 2 * (world - 1) * nbytes // world


def all_reduce(nbytes: int, world: int) -> list[Traffic]:
    """Per rank, a ring all-reduce of a tensor of ``nbytes``."""
    b = ring_bytes(nbytes, world)
    return [_moved(b, b, 2 * (world - 1))] * world


def all_to_all(sizes: Sequence[Sequence[int]]) -> list[Traffic]:
    """Per rank, an all-to-all where rank r sends ``sizes[r][j]`` bytes to rank j."""
    world = len(sizes)
    return [
        _moved(
            sum(sizes[r]) - sizes[r][r],
            sum(sizes[j][r] for j in range(world)) - sizes[r][r],
            world - 1,
        )
        for r in range(world)
    ]


def all_gather(sizes: Sequence[int]) -> list[Traffic]:
    """Per rank, an all-gather of chunks of ``sizes`` bytes (padded to the widest)."""
    world, width = len(sizes), max(sizes)
    return [_moved((world - 1) * width, (world - 1) * width, world - 1)] * world


def gather(nbytes: int, world: int, root: int = 0) -> list[Traffic]:
    """Per rank, a gather of every rank's ``nbytes`` at ``root``."""
    return [
        _moved(0, (world - 1) * nbytes, 0) if r == root else _moved(nbytes, 0, 1)
        for r in range(world)
    ]


def broadcast(nbytes: int, world: int, root: int = 0) -> list[Traffic]:
    """Per rank, ``root``'s ``nbytes`` sent to every other rank."""
    return [
        _moved((world - 1) * nbytes, 0, world - 1) if r == root else _moved(0, nbytes, 0)
        for r in range(world)
    ]


def plus(*parts: list[Traffic]) -> list[Traffic]:
    """Per rank, collectives one after the other."""
    return [sum(ranks, NONE) for ranks in zip(*parts, strict=True)]


# --------------------------------------------------------------------------- the exchanges


def grid_traffic(
    topology: str, numel: int, n_scales: int, world: int, m: int, fit_scale: bool = False
) -> list[Traffic]:
    """Per rank, what :meth:`Exchange.reduce` of a shared-grid quantizer (``m`` levels a side:
    TernGrad 1) moves for ``numel`` elements with ``n_scales`` scales on ``world`` ranks with
    scalar sharing (topologies ``sharded``, ``ps``, ``allgather``): the scale all-reduce (with
    its non-finite flag, and with ``fit_scale`` the fitted values), then the topology's frames
    (sizes from :func:`codes_frame_nbytes`)."""
    if topology not in TOPOLOGIES or topology == "own-scales":
        raise ValueError(
            f"grid_traffic covers the topologies with scalar sharing, not {topology!r}"
        )
    scales = all_reduce(4 * (n_scales * (2 if fit_scale else 1) + 1), world)
    one, agg = codes_frame_nbytes(numel, 1, m), codes_frame_nbytes(numel, world, m)
    if topology == "sharded":  # scales; all-to-all of shards; all-gather of the owners' sums
        shards = [codes_frame_nbytes(b - a, 1, m) for a, b in shard_bounds(numel, world)]
        sums = [codes_frame_nbytes(b - a, world, m) for a, b in shard_bounds(numel, world)]
        return plus(scales, all_to_all([shards] * world), all_gather(sums))
    if topology == "ps":  # scales; gather at the root; broadcast from it
        return plus(scales, gather(one, world), broadcast(agg, world))
    return plus(scales, all_gather([one] * world))  # allgather


def exchange_traffic(
    quantizer: Quantizer,
    topology: str,
    layout: Layout,
    world: int,
    settings: ExchangeSettings = PLAIN,
) -> list[Traffic]:
    """Per rank, what :meth:`Exchange.reduce` moves for a gradient of ``layout`` on ``world``
    ranks with ``settings``: the shared grid with scalar sharing (:func:`grid_traffic`); each
    rank's own scales (one all-gather of the messages, a finite-flag byte after each); or
    messages (a finite-flag
    all-reduce, then the topology's messages, the aggregate re-quantized or in fp16 where it
    travels on). ``ValueError`` for the coherent levels (their agreement is not modelled)."""
    q, n = quantizer, layout.numel
    aggregate, fit_scale = settings.aggregate, settings.fit_scale
    if topology == "own-scales":
        return all_gather([q.message_nbytes(n, layout.segments) + 1] * world)
    if isinstance(q, SymmetricGrid):
        return grid_traffic(topology, n, layout.n_buckets, world, q.m, fit_scale)
    if aggregate == "coherent" and isinstance(q, LevelQuantizer):
        raise ValueError("the traffic of aggregate 'coherent' is not modelled")
    agg = quantize.get("fp16") if aggregate == "fp16" else q
    flag = all_reduce(4, world)
    if topology == "sharded":
        bounds = shard_bounds(n, world)
        parts = [layout.slice(a, b) for a, b in bounds]
        mine = [
            q.message_nbytes(b - a, p.segments) for (a, b), p in zip(bounds, parts, strict=True)
        ]
        owned = [
            agg.message_nbytes(b - a, p.segments) for (a, b), p in zip(bounds, parts, strict=True)
        ]
        return plus(flag, all_to_all([mine] * world), all_gather(owned))
    one = q.message_nbytes(n, layout.segments)
    if topology == "ps":
        return plus(
            flag, gather(one, world), broadcast(agg.message_nbytes(n, layout.segments), world)
        )
    return plus(flag, all_gather([one] * world))
