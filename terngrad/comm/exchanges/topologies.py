"""The topologies: how every rank's codes reach where they are averaged (N ranks, d elements).

* ``sharded`` (:class:`ShardedExchange`): the gradient is cut into N shards; all-to-all sends
  shard k of every rank to rank k, which aggregates it; all-gather returns the N aggregated
  shards to everyone.
* ``ps`` (:class:`ParameterServerExchange`): rank 0 gathers every rank's message, aggregates,
  and broadcasts the result (the TernGrad paper's parameter server).
* ``allgather`` (:class:`AllGatherExchange`): every rank gathers every rank's message and
  aggregates locally.
* ``own-scales`` (:class:`OwnScalesExchange`, the shared-grid quantizers): no scalar sharing —
  each rank rounds on its own scales and sends them with its codes; every rank decodes every
  message and averages in rank order: one collective a bucket instead of two.

The first three route codes on the quantizer's path (:class:`RoutedExchange`); the interface
they implement, and what the paths are, is :mod:`terngrad.comm.exchanges.exchange`.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Hashable

import torch

from terngrad.comm.errors import ExchangeMismatch
from terngrad.comm.exchanges.coherent import CoherentStep, bucket_shard_bounds
from terngrad.comm.exchanges.exchange import (
    PLAIN,
    Draws,
    Exchange,
    ExchangeSettings,
    Result,
    shard_bounds,
)
from terngrad.comm.exchanges.grid_step import (
    GridStep,
    least_squares_values,
    share_fitted_scales,
    share_scales,
)
from terngrad.comm.exchanges.link import Link
from terngrad.kernels import Kernels, Streams
from terngrad.quantize import Encoded, Layout, LevelQuantizer, Quantizer, SymmetricGrid
from terngrad.wire import codes_frame_nbytes


def _part(uniform: torch.Tensor | None, start: int, stop: int) -> torch.Tensor | None:
    return None if uniform is None else uniform[start:stop]


class RoutedExchange(Exchange):
    """The topologies that route codes to where they are aggregated — ``sharded``, ``ps``,
    ``allgather`` — on whichever path the quantizer takes: scalar sharing and exact sums for
    the shared grid, messages averaged (and re-quantized where they travel on) otherwise, or
    levels agreed by all ranks (``aggregate="coherent"``)."""

    def reduce(
        self,
        flat: torch.Tensor,
        layout: Layout,
        draws: Draws,
        generator: torch.Generator | None,
        key: Hashable = None,
        *,
        out: torch.Tensor | None = None,
        own: bool = True,
    ) -> Result:
        q = self.quantizer
        if isinstance(q, SymmetricGrid):
            grid = self.kernels.grid_prepare(q, flat, layout)
            if self.fit_scale:
                agreed = share_fitted_scales(self.link, grid.local, least_squares_values(grid))
            else:
                shared = share_scales(self.link, grid.local)
                agreed = None if shared is None else (shared, None)
            if agreed is None:
                return Result(None, None)
            shared, values = agreed
            if draws is None:
                draws = torch.rand(flat.numel(), generator=generator, device=flat.device)
            step = GridStep(self.kernels, grid, shared, draws, values)
            mean_parts, own_parts = self._grid_exchange(step, flat.numel())
            own_values = None
            if own:
                own_values = torch.empty_like(flat)
                for lo, hi, frame in own_parts:
                    step.decode(frame, lo, own_values[lo:hi], 1, self.link.rank)
            mean = out if out is not None else torch.empty_like(flat)
            for lo, hi, frame, sender in mean_parts:
                step.decode(frame, lo, mean[lo:hi], self.link.size, sender)
            return Result(mean, own_values)
        if isinstance(draws, Streams):
            draws = self.kernels.uniform(draws, layout, flat.device)
        if not self._all_finite(flat):
            return Result(None, None)
        if self.coherent and isinstance(q, LevelQuantizer):
            step = CoherentStep.agree(q, flat, layout, self.link, draws, self.kernels)
            result = Result(self._coherent_exchange(step, generator), step.own_values())
        else:
            result = self._reduce_messages(flat, layout, draws, generator, key)
        if out is not None:
            out.copy_(result.mean)
            return Result(out, result.own)
        return result

    @abstractmethod
    def _grid_exchange(self, step: GridStep, numel: int):
        """Shared-grid quantizers: move this rank's digits (``step.frame(lo, hi)``) so that
        every rank ends with frames of the digits summed over all ranks. Returns the frames
        to decode, ``[(lo, hi, frame, sender)]`` covering ``[0, numel)``, and this rank's own
        frames ``[(lo, hi, frame)]``."""

    @abstractmethod
    def _reduce_messages(self, flat, layout, uniform, generator, key) -> Result:
        """Other quantizers (every rank's gradient is finite): decode, average, and re-quantize
        where the average travels on."""

    @abstractmethod
    def _coherent_exchange(self, step: CoherentStep, generator) -> torch.Tensor:
        """Level quantizers on coherent levels: move this rank's digits so that every rank
        ends with the same mean; return it."""

    def _requantize(self, mean, layout: Layout, key: Hashable, generator) -> Encoded:
        """The aggregate as a message again, with server-side error feedback: the part the
        re-quantization drops is added to the next aggregate of the same bucket and shard."""
        residual = self.server_residuals.get(key)
        if residual is not None and residual.shape == mean.shape:
            mean = mean + residual
        enc = self._encode(self.aggregator, mean, generator, layout.segments)
        if self.aggregator.name != "fp32":
            self.server_residuals[key] = mean - self._decode(self.aggregator, enc)
        return enc


class ShardedExchange(RoutedExchange, name="sharded"):
    """All-to-all of shards, aggregation by each shard's owner, all-gather of the results.

    Per rank and step: (N-1)/N d (b + b_N) bits, with b the bits per element of one message
    (1.6 for TernGrad) and b_N those of the aggregate (log2(2N+1) packed: 3.2 for N = 4),
    against 2 (N-1)/N d 32 bits for a ring all-reduce in fp32.
    """

    def _grid_exchange(self, step, numel):
        link, m = self.link, step.quantizer.m
        bounds = shard_bounds(numel, link.size)
        lo, hi = bounds[link.rank]
        mine = [step.frame(a, b) for a, b in bounds]
        received = link.all_to_all(mine, [codes_frame_nbytes(hi - lo, 1, m)] * link.size)
        gathered = link.all_gather(
            step.sum_frames(received, hi - lo, 1),
            [codes_frame_nbytes(b - a, link.size, m) for a, b in bounds],
        )
        mean_parts = [
            (a, b, f, r) for r, (f, (a, b)) in enumerate(zip(gathered, bounds, strict=True))
        ]
        return mean_parts, [(a, b, f) for f, (a, b) in zip(mine, bounds, strict=True)]

    def _reduce_messages(self, flat, layout, uniform, generator, key):
        link, q = self.link, self.quantizer
        bounds = shard_bounds(flat.numel(), link.size)
        parts = [layout.slice(a, b) for a, b in bounds]
        messages = [
            self._encode(q, flat[a:b], generator, part.segments, _part(uniform, a, b))
            for (a, b), part in zip(bounds, parts, strict=True)
        ]
        own = torch.cat([self._decode(q, m) for m in messages])
        me = link.rank
        lo, hi = bounds[me]
        received = link.all_to_all(
            [m.to_frame() for m in messages],
            [q.message_nbytes(hi - lo, parts[me].segments)] * link.size,
        )
        mean = self._mean([self._read_message(f, q, hi - lo, r) for r, f in enumerate(received)])
        result = self._requantize(mean, parts[me], (key, me), generator)
        agg = self.aggregator
        gathered = link.all_gather(
            result.to_frame(),
            [
                agg.message_nbytes(b - a, p.segments)
                for (a, b), p in zip(bounds, parts, strict=True)
            ],
        )
        mean = torch.cat(
            [
                self._read_message(f, agg, b - a, r)
                for r, (f, (a, b)) in enumerate(zip(gathered, bounds, strict=True))
            ]
        )
        return Result(mean, own)

    def _coherent_exchange(self, step, generator):
        link = self.link
        bounds = bucket_shard_bounds(step.layout, link.size)
        lo, hi = bounds[link.rank]
        received = link.all_to_all(
            [step.frame(a, b) for a, b in bounds], [step.frame_nbytes(lo, hi)] * link.size
        )
        mean = step.mean(received, lo, hi)
        mine = step.frame(lo, hi, step.reround(mean, lo, hi, generator))
        gathered = link.all_gather(mine, [step.frame_nbytes(a, b) for a, b in bounds])
        pairs = enumerate(zip(gathered, bounds, strict=True))
        return torch.cat([step.values(f, a, b, r) for r, (f, (a, b)) in pairs])


class ParameterServerExchange(RoutedExchange, name="ps"):
    """Rank 0 gathers every message, aggregates, broadcasts: the TernGrad paper's topology.

    A worker sends d b bits and receives d b_N bits per step; rank 0 receives and sends N-1
    times that, the bottleneck the sharded topology removes.
    """

    root = 0

    def _grid_exchange(self, step, numel):
        link = self.link
        mine = step.frame(0, numel)
        gathered = link.gather(mine, self.root)
        total = None if gathered is None else step.sum_frames(gathered, numel, 1)
        size = codes_frame_nbytes(numel, link.size, step.quantizer.m)
        frame = link.broadcast(total, size, self.root, torch.device("cpu"))  # frames: host
        return [(0, numel, frame, self.root)], [(0, numel, mine)]

    def _reduce_messages(self, flat, layout, uniform, generator, key):
        link, q = self.link, self.quantizer
        d = flat.numel()
        message = self._encode(q, flat, generator, layout.segments, uniform)
        gathered = link.gather(message.to_frame(), self.root)
        result = None
        if gathered is not None:
            mean = self._mean([self._read_message(f, q, d, r) for r, f in enumerate(gathered)])
            result = self._requantize(mean, layout, key, generator).to_frame()
        size = self.aggregator.message_nbytes(d, layout.segments)
        frame = link.broadcast(result, size, self.root, torch.device("cpu"))  # frames: host
        return Result(
            self._read_message(frame, self.aggregator, d, self.root), self._decode(q, message)
        )

    def _coherent_exchange(self, step, generator):
        link, d = self.link, step.layout.numel
        gathered = link.gather(step.frame(0, d), self.root)
        result = None
        if gathered is not None:
            result = step.frame(0, d, step.reround(step.mean(gathered, 0, d), 0, d, generator))
        frame = link.broadcast(result, step.frame_nbytes(0, d), self.root, torch.device("cpu"))
        return step.values(frame, 0, d, self.root)


class AllGatherExchange(RoutedExchange, name="allgather"):
    """Every rank gathers every rank's message and aggregates locally: one collective after
    the scales, no re-quantization, but each rank receives (N-1) d b bits, growing with N."""

    def _grid_exchange(self, step, numel):
        mine = step.frame(0, numel)
        m = step.quantizer.m
        gathered = self.link.all_gather(mine, [codes_frame_nbytes(numel, 1, m)] * self.link.size)
        return [(0, numel, step.sum_frames(gathered, numel, 1), self.link.rank)], [(0, numel, mine)]

    def _reduce_messages(self, flat, layout, uniform, generator, key):
        link, q = self.link, self.quantizer
        d = flat.numel()
        message = self._encode(q, flat, generator, layout.segments, uniform)
        gathered = link.all_gather(
            message.to_frame(), [q.message_nbytes(d, layout.segments)] * link.size
        )
        mean = self._mean([self._read_message(f, q, d, r) for r, f in enumerate(gathered)])
        return Result(mean, self._decode(q, message))

    def _coherent_exchange(self, step, generator):
        d = step.layout.numel
        gathered = self.link.all_gather(
            step.frame(0, d), [step.frame_nbytes(0, d)] * self.link.size
        )
        return step.mean(gathered, 0, d)  # averaged here: nothing is sent on, nothing re-rounded


class OwnScalesExchange(Exchange, name="own-scales"):
    """Every rank rounds on its own scales and sends them with its codes; every rank gathers
    every message and averages them: no scalar sharing, so one collective a bucket (the
    all-gather) instead of two, at the all-gather's traffic ((N-1) d b bits received per rank).
    The shared-grid quantizers only (their messages decode from their own scales); the auto
    policy, which models scalar sharing, does not serve it."""

    quantizers = (SymmetricGrid,)
    policies = ("quantize",)

    def reduce(self, flat, layout, draws, generator, key=None, *, out=None, own=True) -> Result:
        """The mean of every rank's TernGrad (or QSGD) message, each rounded
        on its sender's own scales ``s_r`` — Eq. 4 with ``s`` the rank's own
        ``max |g_r|`` (``‖g_r‖`` for QSGD) instead of the MAX over the ranks (scalar sharing,
        Sec. 3.2) — in **one** collective: the all-gather of the messages, scales included.
        Every rank decodes the N messages and sums ``s_r b_r`` in rank order (each message
        decoded and added in one pass: ``decode_into(..., accumulate=True)``), then divides
        by N: the same float operations on every rank, so the replicas stay bitwise
        identical; the sum is exact in the sense that every rank computes the same bits, not
        an integer sum (the grid differs between senders). Unbiased as with sharing, with
        less variance (``s_r <= max_r s_r``); ``(N - 1)`` messages received per rank.

        A byte after each message says whether its sender's gradient was finite (a rank
        whose gradient is not sends zero scales and that flag): every rank sees the flags in
        the gathered messages and skips the step — no separate round for them."""
        q, link = self.quantizer, self.link
        n = flat.numel()
        grid = self.kernels.grid_prepare(q, flat, layout)
        finite = bool(torch.isfinite(grid.local).all())
        if draws is None:
            draws = torch.rand(n, generator=generator, device=flat.device)
        scales, payload = q._pack(
            self.kernels, grid, grid.local if finite else torch.zeros_like(grid.local), draws
        )
        if self.fit_scale and finite:  # digits rounded on s, decoded to the fitted value
            scales = torch.minimum(least_squares_values(grid), scales)
        mine = q._message(flat, layout, scales, payload)
        frame = mine.to_frame()
        flag = torch.tensor([0 if finite else 1], dtype=torch.uint8, device=frame.device)
        nbytes = q.message_nbytes(n, layout.segments) + 1
        gathered = link.all_gather(torch.cat([frame, flag]), [nbytes] * link.size)
        if any(int(f[-1]) for f in gathered):
            return Result(None, None)
        form = (mine.codec, mine.levels, mine.bucket_size, mine.segments)
        total = out if out is not None else torch.empty_like(flat)
        own_values = torch.empty_like(flat) if own else None
        for r, f in enumerate(gathered):
            enc = self._parse_message(f[:-1], q, n, r)  # intact (CRC-32), of this method
            if (enc.codec, enc.levels, enc.bucket_size, enc.segments) != form:
                raise ExchangeMismatch(
                    f"rank {r} sent a message of another codec, levels, buckets or segments "
                    "than this rank's: the ranks disagree on the bucket layout or the quantizer"
                )
            if own_values is not None and r == link.rank:
                q._decode(self.kernels, enc, layout, own_values)
                if r:
                    total += own_values
                else:
                    total.copy_(own_values)
            else:  # decoded and added in one pass: the bits of decoding, then adding
                q._decode(self.kernels, enc, layout, total, accumulate=r > 0)
        total /= link.size
        return Result(total, own_values)


#: the topologies' names, in the order above
TOPOLOGIES = tuple(Exchange.registry)


def make_exchange(
    topology: str,
    quantizer: Quantizer,
    link: Link,
    settings: ExchangeSettings = PLAIN,
    kernels: Kernels | None = None,
) -> Exchange:
    """The exchange named ``topology`` with ``settings`` (``kernels``: the backend of its
    per-step operations and its messages' ``encode``/``decode``, the torch reference by
    default); ``ValueError`` listing the choices otherwise, or naming what the topology does
    not combine with."""
    if topology not in Exchange.registry:
        raise ValueError(
            f"unknown topology {topology!r}; choose one of: {', '.join(Exchange.registry)}"
        )
    return Exchange.registry[topology](quantizer, link, settings, kernels)
