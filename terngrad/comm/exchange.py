"""The exchange algorithms: the mean of a flat gradient over all ranks, through quantized bytes.

Every rank calls :meth:`Exchange.reduce` with its own gradient and the same layout; every rank
gets the same result, bit for bit. How the messages are combined depends on the quantizer:

* **Shared grid** (``terngrad``, ``qsgd``): scalar sharing first — one all-reduce (MAX) of the
  per-bucket scales — so every rank rounds onto the same grid ``s * j / m``. Codes are integers
  in ``[-m, m]``; the sum over N ranks is an integer in ``[-N m, N m]``, exact, and travels in
  base ``2 N m + 1``; the mean is ``s * sum / (N m)`` (TernGrad: ``s * sum / N``). Nothing is
  re-quantized, so the second phase adds no error.
* **Messages** (every other method): each rank's message is decoded to floats and averaged in
  rank order. Where the average must travel on (``sharded``, ``ps``), it is re-quantized with
  the same quantizer plus server-side error feedback (``aggregate="requantize"``), or sent as
  fp16 (``aggregate="fp16"``); the rank that did this uses the decoded message itself, like every
  other rank, so replicas stay bitwise identical.

Topologies (N ranks, d elements):

* ``sharded``: the gradient is cut into N shards; all-to-all sends shard k of every rank to rank
  k, which aggregates it; all-gather returns the N aggregated shards to everyone.
* ``ps``: rank 0 gathers every rank's message, aggregates, and broadcasts the result (the
  TernGrad paper's parameter server).
* ``allgather``: every rank gathers every rank's message and aggregates locally.

The per-step work on the grid path — statistics, clip, rounding, packing, the owner's sum,
decoding into the output — runs on a :mod:`terngrad.kernels` backend (fused numba kernels, or
the torch reference); both give the same bytes.

A rank whose gradient holds a NaN or Inf is detected by every rank at the first collective
(the shared MAX of the scales propagates it; the message path all-reduces a flag); then
nothing is averaged and every rank gets ``Result(None, None)``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.distributed as dist

from terngrad import quantize
from terngrad.comm.link import Link
from terngrad.kernels import GridInput, Kernels, Streams, TorchKernels
from terngrad.quantize import Encoded, Layout, Quantizer, SymmetricGrid
from terngrad.wire import Codec, FrameHeader, frame_nbytes, new_frame, read_frame, seal_frame

Draws = Streams | torch.Tensor | None

AGGREGATES = ("requantize", "fp16")


class ExchangeMismatch(RuntimeError):
    """A rank received a message that does not fit its own configuration."""


@dataclass(frozen=True)
class Result:
    """``mean``: the averaged gradient (``None`` if some rank's gradient was not finite);
    ``own``: what this rank's own message decodes to (for worker-side error feedback)."""

    mean: torch.Tensor | None
    own: torch.Tensor | None


def _part(uniform: torch.Tensor | None, start: int, stop: int) -> torch.Tensor | None:
    return None if uniform is None else uniform[start:stop]


def shard_bounds(numel: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous shards of ``numel`` elements, sizes differing by at most one."""
    base, extra = divmod(numel, parts)
    bounds, start = [], 0
    for k in range(parts):
        stop = start + base + (k < extra)
        bounds.append((start, stop))
        start = stop
    return bounds


# --------------------------------------------------------------------------- code frames


def _codes_codec(count: int, m: int) -> Codec:
    return Codec.base(2 * count * m + 1)


def codes_header(method_id: int, numel: int, count: int, m: int) -> FrameHeader:
    """The header of a frame of ``numel`` grid digits summed over ``count`` ranks: each digit is
    a signed sum in ``[-count m, count m]`` plus ``count m``, in base ``2 count m + 1``."""
    codec = _codes_codec(count, m)
    return FrameHeader(
        method_id=method_id,
        codec=codec,
        dtype=torch.float32,
        shape=(numel,),
        levels=codec.param,
        bucket_size=0,
        n_scales=0,
    )


def codes_frame_nbytes(numel: int, count: int, m: int) -> int:
    return frame_nbytes(1, 0, _codes_codec(count, m).nbytes(numel))


def read_codes(frame: torch.Tensor, method_id: int, numel: int, count: int, m: int, sender):
    """The payload of a frame of digits; :class:`ExchangeMismatch` if it is not what was
    expected (``ValueError`` if it is damaged)."""
    header, _, payload = read_frame(frame)
    levels = 2 * count * m + 1
    if (header.method_id, header.levels, header.numel) != (method_id, levels, numel):
        raise ExchangeMismatch(
            f"rank {sender} sent {header.numel} codes of method id {header.method_id} with "
            f"{header.levels} levels; this rank expected {numel} of method id {method_id} with "
            f"{levels}: the ranks disagree on the model, the bucket layout or the quantizer"
        )
    return payload


@dataclass(frozen=True)
class GridStep:
    """One rank's gradient on the shared grid for one step: everything needed to pack any range
    of its digits into a frame and to decode frames of summed digits."""

    kernels: Kernels
    grid: GridInput
    shared: torch.Tensor
    draws: Streams | torch.Tensor

    @property
    def quantizer(self) -> SymmetricGrid:
        return self.grid.quantizer

    def frame(self, lo: int, hi: int) -> torch.Tensor:
        """A frame of this rank's digits of elements ``[lo, hi)`` (count 1)."""
        q = self.quantizer
        frame, payload = new_frame(codes_header(q.method_id, hi - lo, 1, q.m), torch.empty(0))
        self.kernels.grid_pack(
            self.grid, self.shared, self.draws, lo, hi, _codes_codec(1, q.m), payload
        )
        return seal_frame(frame)

    def sum_frames(self, frames: list[torch.Tensor], numel: int, count: int) -> torch.Tensor:
        """A frame of the sum of ``frames`` (from ranks 0.., each a sum over ``count`` ranks)."""
        q = self.quantizer
        payloads = [
            read_codes(f, q.method_id, numel, count, q.m, sender) for sender, f in enumerate(frames)
        ]
        total = count * len(frames)
        frame, payload = new_frame(codes_header(q.method_id, numel, total, q.m), torch.empty(0))
        self.kernels.sum_packed(
            payloads, numel, _codes_codec(count, q.m), _codes_codec(total, q.m), payload
        )
        return seal_frame(frame)

    def decode(self, frame: torch.Tensor, lo: int, out: torch.Tensor, count: int, sender) -> None:
        """``out`` (the elements from ``lo`` on) gets the mean of ``count`` ranks' quantized
        values from ``frame``, their summed digits: ``s * sum / (count m)``."""
        q = self.quantizer
        payload = read_codes(frame, q.method_id, out.numel(), count, q.m, sender)
        self.kernels.decode_into(
            out, payload, _codes_codec(count, q.m), count * q.m, count * q.m, lo,
            self.grid.layout, self.shared,
        )  # fmt: skip


# --------------------------------------------------------------------------- traffic


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
    if topology not in Exchange.registry:
        raise ValueError(
            f"unknown topology {topology!r}; choose one of: {', '.join(Exchange.registry)}"
        )
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


# --------------------------------------------------------------------------- exchanges


class Exchange(ABC):
    """Averages flat gradients over the ranks of ``link``; subclasses are the topologies."""

    name: ClassVar[str]
    registry: ClassVar[dict[str, type[Exchange]]] = {}

    def __init_subclass__(cls, *, name: str | None = None, **kw) -> None:
        super().__init_subclass__(**kw)
        if name:
            cls.name = name
            Exchange.registry[name] = cls

    def __init__(
        self,
        quantizer: Quantizer,
        link: Link,
        aggregate: str = "requantize",
        kernels: Kernels | None = None,
    ) -> None:
        if aggregate not in AGGREGATES:
            raise ValueError(f"aggregate must be one of {AGGREGATES}, got {aggregate!r}")
        self.quantizer = quantizer
        self.link = link
        self.kernels = kernels if kernels is not None else TorchKernels()
        self.aggregator = quantizer if aggregate == "requantize" else quantize.get("fp16")
        #: server-side error feedback of re-quantized aggregates, by (bucket key, shard)
        self.server_residuals: dict[Hashable, torch.Tensor] = {}

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
        """The mean over all ranks of ``flat`` (float32, 1-D, in ``layout``), identical on every
        rank, written into ``out`` if given (float32, may be ``flat`` itself: it is read before
        it is written). ``draws`` are this rank's random draws for rounding ``flat``: a
        :class:`~terngrad.kernels.Streams` (one stream per segment), one uniform per element,
        or ``None`` (drawn from ``generator``); ``generator`` also draws any re-quantization
        of an aggregate; ``key`` names the bucket for server-side error feedback; ``own=False``
        skips decoding this rank's own message (needed only for worker-side error feedback)."""
        q = self.quantizer
        if isinstance(q, SymmetricGrid):
            grid = self.kernels.grid_prepare(q, flat, layout)
            shared = self._share_scales(grid.local)
            if shared is None:
                return Result(None, None)
            if draws is None:
                draws = torch.rand(flat.numel(), generator=generator, device=flat.device)
            step = GridStep(self.kernels, grid, shared, draws)
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

    # --- helpers shared by the topologies

    def _share_scales(self, local: torch.Tensor) -> torch.Tensor | None:
        """Scalar sharing: the MAX over ranks of each bucket's ``local`` scale; ``None`` if some
        rank's gradient is not finite (its scale then is not). A flag travels with the scales,
        because a MAX reduction need not propagate NaN (max(1, NaN) may be 1)."""
        finite = torch.isfinite(local)
        flag = (~finite).any().to(local.dtype).reshape(1)
        shared = self.link.all_reduce(
            torch.cat([local.where(finite, 0.0), flag]), dist.ReduceOp.MAX
        )
        return shared[:-1] if float(shared[-1]) == 0.0 else None

    def _all_finite(self, flat: torch.Tensor) -> bool:
        """True if every rank's gradient is finite (one all-reduce of a flag)."""
        flag = torch.tensor([0.0 if bool(torch.isfinite(flat).all()) else 1.0], device=flat.device)
        return float(self.link.all_reduce(flag, dist.ReduceOp.MAX)) == 0.0

    def _mean(self, values: list[torch.Tensor]) -> torch.Tensor:
        """Sum in rank order, then divide: the same bits wherever it is computed."""
        total = values[0].clone()
        for v in values[1:]:
            total += v
        return total / self.link.size

    @staticmethod
    def _read_message(frame: torch.Tensor, q: Quantizer, numel: int, sender: int):
        enc = Encoded.from_frame(frame)
        if enc.method != q.name or enc.numel != numel:
            raise ExchangeMismatch(
                f"rank {sender} sent a {enc.method} message of {enc.numel} elements; this rank "
                f"expected {q.name} with {numel}: the ranks disagree on the model, the bucket "
                "layout or the quantizer"
            )
        return q.decode(enc).reshape(-1)

    def _requantize(self, mean, layout: Layout, key: Hashable, generator) -> Encoded:
        """The aggregate as a message again, with server-side error feedback: the part the
        re-quantization drops is added to the next aggregate of the same bucket and shard."""
        residual = self.server_residuals.get(key)
        if residual is not None and residual.shape == mean.shape:
            mean = mean + residual
        enc = self.aggregator.encode(mean, generator, segments=layout.segments)
        if self.aggregator.name != "fp32":
            self.server_residuals[key] = mean - self.aggregator.decode(enc).reshape(-1)
        return enc


class ShardedExchange(Exchange, name="sharded"):
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
            q.encode(flat[a:b], generator, segments=part.segments, uniform=_part(uniform, a, b))
            for (a, b), part in zip(bounds, parts, strict=True)
        ]
        own = torch.cat([q.decode(m).reshape(-1) for m in messages])
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


class ParameterServerExchange(Exchange, name="ps"):
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
        message = q.encode(flat, generator, segments=layout.segments, uniform=uniform)
        gathered = link.gather(message.to_frame(), self.root)
        result = None
        if gathered is not None:
            mean = self._mean([self._read_message(f, q, d, r) for r, f in enumerate(gathered)])
            result = self._requantize(mean, layout, key, generator).to_frame()
        size = self.aggregator.message_nbytes(d, layout.segments)
        frame = link.broadcast(result, size, self.root, torch.device("cpu"))  # frames: host
        return Result(self._read_message(frame, self.aggregator, d, self.root), q.decode(message))


class AllGatherExchange(Exchange, name="allgather"):
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
        message = q.encode(flat, generator, segments=layout.segments, uniform=uniform)
        gathered = link.all_gather(
            message.to_frame(), [q.message_nbytes(d, layout.segments)] * link.size
        )
        mean = self._mean([self._read_message(f, q, d, r) for r, f in enumerate(gathered)])
        return Result(mean, q.decode(message).reshape(-1))


TOPOLOGIES = tuple(Exchange.registry)


def make_exchange(
    topology: str,
    quantizer: Quantizer,
    link: Link,
    aggregate: str = "requantize",
    kernels: Kernels | None = None,
) -> Exchange:
    """The exchange named ``topology`` (``kernels``: the backend of its per-step operations,
    the torch reference by default); ``ValueError`` listing the choices otherwise."""
    if topology not in Exchange.registry:
        raise ValueError(
            f"unknown topology {topology!r}; choose one of: {', '.join(Exchange.registry)}"
        )
    return Exchange.registry[topology](quantizer, link, aggregate, kernels)
