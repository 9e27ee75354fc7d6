"""``policy="auto"``: quantize a DDP bucket only where it makes the bucket's exchange faster.

At registration the hook measures, on its own process group and kernels:

* the link: an fp32 all-reduce of one element (``t_0``: ``2 (N-1)`` message latencies) and of
  4 MiB (``t_1``), giving latency ``α = t_0 / (2 (N-1))`` and rate
  ``B = 2 (N-1)/N x 4 MiB / (t_1 - t_0)``;
* the codec: statistics, rounding, packing, the owner's sum and decoding of 2^14 and 2^20
  elements, giving a fixed cost per bucket ``c_0`` and a cost per element ``κ``.

Every rank takes the largest of each measurement over all ranks, so all make the same choices.
Then for each bucket of ``n`` quantizable elements it compares (see :mod:`terngrad.bench.model`)

* fp32: ``2 (N-1)/N x 4n / B + 2 (N-1) α``
* quantized: ``c_0 + κ n + bytes / B + messages x α``, bytes and messages of the topology from
  :func:`~terngrad.comm.exchanges.exchange.grid_traffic` (the busiest rank's critical path),

and quantizes the bucket only if that is faster. Small buckets (latency and per-call cost
dominate) and fast links (the codec costs more than the bytes it saves) stay fp32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from terngrad.comm.exchanges.grid_step import GridStep
from terngrad.comm.exchanges.traffic import grid_traffic, ring_bytes
from terngrad.kernels import Kernels, Streams
from terngrad.quantize import Layout, SymmetricGrid
from terngrad.util.timing import median_seconds

PROBE_NUMEL = 2**20  # 4 MiB of float32
CODEC_SIZES = (2**14, 2**20)


@dataclass(frozen=True)
class Estimate:
    """What the auto policy decides from: link rate and latency, codec costs."""

    bytes_per_s: float
    latency_s: float
    codec_fixed_s: float
    codec_s_per_element: float

    def fp32_seconds(self, numel: int, world: int) -> float:
        """A ring all-reduce of ``numel`` float32 values."""
        return ring_bytes(4 * numel, world) / self.bytes_per_s + 2 * (world - 1) * self.latency_s

    def quantized_seconds(
        self, topology: str, numel: int, n_scales: int, world: int, m: int
    ) -> float:
        """The exchange of ``numel`` elements on the shared grid, codec included."""
        ranks = grid_traffic(topology, numel, n_scales, world, m)
        busiest = max(t.path for t in ranks)
        return (
            self.codec_fixed_s
            + self.codec_s_per_element * numel
            + busiest / self.bytes_per_s
            + ranks[0].messages * self.latency_s
        )


@dataclass(frozen=True)
class Decision:
    """The choice for one bucket and the two predicted times behind it."""

    quantize: bool
    fp32_seconds: float
    quantized_seconds: float


def decide(estimate: Estimate, topology: str, layout: Layout, world: int, m: int) -> Decision:
    """Quantize the elements of ``layout`` only if it is predicted to be faster than fp32
    (never on one rank: there is nothing to send)."""
    if layout.numel == 0 or world < 2:
        return Decision(False, 0.0, 0.0)
    fp32 = estimate.fp32_seconds(layout.numel, world)
    quantized = estimate.quantized_seconds(topology, layout.numel, layout.n_buckets, world, m)
    return Decision(quantized < fp32, fp32, quantized)


def _sync(device) -> None:
    """Wait for the device's queued work (GPU kernels and collectives return early)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def agree(estimate: Estimate, group: dist.ProcessGroup | None, device) -> Estimate:
    """The largest of each field over all ranks of ``group`` (a collective), so that every
    rank decides from the same numbers."""
    values = torch.tensor(
        [estimate.bytes_per_s, estimate.latency_s, estimate.codec_fixed_s,
         estimate.codec_s_per_element], dtype=torch.float64, device=device,
    )  # fmt: skip
    dist.all_reduce(values, dist.ReduceOp.MAX, group=group)
    return Estimate(*values.tolist())


def _codec_seconds(kernels: Kernels, q: SymmetricGrid, numel: int, device) -> float:
    flat = torch.randn(numel, generator=torch.Generator().manual_seed(0)).to(device)
    layout = Layout.of(numel, [numel], q.bucket_size)
    out = torch.empty_like(flat)

    def once() -> None:
        grid = kernels.grid_prepare(q, flat, layout)
        step = GridStep(kernels, grid, grid.local, Streams((1,)))
        total = step.sum_frames([step.frame(0, numel)], numel, 1)
        step.decode(total, 0, out, 1, 0)
        _sync(device)

    return median_seconds(once, 3, warmup=1)  # first call: allocations, compilation caches


def measure(
    group: dist.ProcessGroup | None, kernels: Kernels, q: SymmetricGrid, device
) -> Estimate:
    """Measure link and codec on this rank, then agree on the largest of each over all ranks
    (a collective: every rank of ``group`` must call it)."""
    world = dist.get_world_size(group)
    small = torch.zeros(1, device=device)
    large = torch.zeros(PROBE_NUMEL, device=device)
    dist.all_reduce(large, group=group)  # connections up, buffers allocated
    dist.barrier(group=group)
    t0 = median_seconds(lambda: (dist.all_reduce(small, group=group), _sync(device)), 5)
    t1 = median_seconds(lambda: (dist.all_reduce(large, group=group), _sync(device)), 3)
    c_small, c_large = (_codec_seconds(kernels, q, n, device) for n in CODEC_SIZES)
    agreed = torch.tensor([t0, t1, c_small, c_large], dtype=torch.float64, device=device)
    dist.all_reduce(agreed, dist.ReduceOp.MAX, group=group)
    t0, t1, c_small, c_large = agreed.tolist()
    per_element = max(c_large - c_small, 0.0) / (CODEC_SIZES[1] - CODEC_SIZES[0])
    return Estimate(
        bytes_per_s=ring_bytes(4 * PROBE_NUMEL, world) / max(t1 - t0, 1e-9),
        latency_s=t0 / (2 * (world - 1)) if world > 1 else 0.0,
        codec_fixed_s=max(c_small - per_element * CODEC_SIZES[0], 0.0),
        codec_s_per_element=per_element,
    )


class AutoPolicy:
    """The auto policy of one exchange: the measurements every rank agreed on, and the choice
    made for each bucket (by its quantizable parameters' names) with both predicted times."""

    def __init__(self, estimate: Estimate, topology: str, world: int, m: int) -> None:
        self.estimate, self.topology, self.world, self.m = estimate, topology, world, m
        self.decisions: dict[tuple[str, ...], Decision] = {}

    @classmethod
    def agreed(
        cls,
        group: dist.ProcessGroup | None,
        kernels: Kernels,
        q: SymmetricGrid,
        device,
        topology: str,
        given: Estimate | None = None,
    ) -> AutoPolicy:
        """Measured on ``group`` (or ``given``), agreed over its ranks (a collective)."""
        estimate = (
            agree(given, group, device) if given is not None else measure(group, kernels, q, device)
        )
        return cls(estimate, topology, dist.get_world_size(group), q.m)

    def keep_full_precision(self, names: tuple[str, ...], layout: Layout) -> bool:
        """Whether a bucket of ``layout`` goes in full precision; the choice is recorded."""
        decision = decide(self.estimate, self.topology, layout, self.world, self.m)
        self.decisions[names] = decision
        return not decision.quantize
