"""What each exchange moves, exactly: the byte formulas the performance model and the auto
policy predict from, tested equal to what :class:`~terngrad.comm.link.Link` counts."""

from __future__ import annotations

from dataclasses import dataclass

from terngrad.comm.exchange import TOPOLOGIES, shard_bounds
from terngrad.wire import codes_frame_nbytes


@dataclass(frozen=True)
class Traffic:
    """What one exchange moves at one rank: bytes sent and received; ``path``, the bytes on
    its critical path (per phase the larger of what it sends and receives, as links are full
    duplex, the phases one after the other); and the point-to-point messages on that path
    (what per-message latency multiplies)."""

    sent: int
    received: int
    path: int
    messages: int


def ring_bytes(nbytes: int, world: int) -> int:
    """Bytes each rank sends (and receives) in a bandwidth-optimal ring all-reduce of a
    tensor of ``nbytes``: ``2 (N-1)/N nbytes`` (reduce-scatter, then all-gather)."""
    return 2 * (world - 1) * nbytes // world


def grid_traffic(topology: str, numel: int, n_scales: int, world: int, m: int) -> list[Traffic]:
    """Per rank, what :meth:`Exchange.reduce` of a shared-grid quantizer (``m`` levels a side:
    TernGrad 1) moves for ``numel`` elements with ``n_scales`` scales on ``world`` ranks —
    exactly what :class:`~terngrad.comm.link.Link` counts: the scale all-reduce (with its
    non-finite flag), then the topology's frames (sizes from :func:`codes_frame_nbytes`)."""
    if topology not in TOPOLOGIES:
        raise ValueError(f"unknown topology {topology!r}; choose one of: {', '.join(TOPOLOGIES)}")
    scales, hops = ring_bytes(4 * (n_scales + 1), world), world - 1
    one, agg = codes_frame_nbytes(numel, 1, m), codes_frame_nbytes(numel, world, m)
    if topology == "sharded":  # scales; all-to-all of shards; all-gather of the owners' sums
        sizes = [b - a for a, b in shard_bounds(numel, world)]
        ones = [codes_frame_nbytes(n, 1, m) for n in sizes]
        gathered = hops * max(codes_frame_nbytes(n, world, m) for n in sizes)
        out = []
        for r in range(world):
            sent, received = sum(ones) - ones[r], hops * ones[r]
            out.append(
                Traffic(
                    scales + sent + gathered,
                    scales + received + gathered,
                    scales + max(sent, received) + gathered,
                    4 * hops,
                )
            )
        return out
    if topology == "ps":  # scales; gather at the root; broadcast from it
        root = Traffic(
            scales + hops * agg, scales + hops * one, scales + hops * (one + agg), 4 * hops
        )
        worker = Traffic(scales + one, scales + agg, scales + one + agg, 4 * hops)
        return [root] + [worker] * hops
    gathered = scales + hops * one  # allgather: scales; every rank's frame to every rank
    return [Traffic(gathered, gathered, gathered, 3 * hops)] * world
