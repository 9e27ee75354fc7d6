"""Levels kept coherent among the workers: the first broadcast option of the optimal-quantization
paper's Algorithm 2 (Xu, Huo, Huang 2020), for the quantizers that fit their own levels per
bucket (Linear, ORQ, BinGrad-b/pb, scaled sign).

One step of one rank (:class:`CoherentStep`):

1. every rank fits its levels to its (clipped) gradient, bucket by bucket, and all-gathers the
   float32 scales that define them (a few per bucket: ``k * 4`` bytes per bucket and rank);
2. every rank combines them in rank order into one set
   (:meth:`~terngrad.quantize.LevelQuantizer.coherent_scales`: ORQ and Linear keep the smallest
   min and the largest max as end levels, so no rank's value falls outside them; the rest is
   the mean), and rounds its own gradient onto those levels with the method's own rounding;
3. the digits travel without scales, in base ``s`` (``log2 s`` bits; BinGrad and sign 1 bit);
4. whoever aggregates (the parameter server, or a shard's owner) decodes each rank's digits on
   the shared levels, averages them in rank order, and rounds the average onto *the same
   levels* by unbiased random rounding. The average of values on the levels lies inside their
   span, so this adds variance, no bias, and needs no error feedback; the broadcast is again
   ``log2 s`` bits an element. (``allgather`` averages locally and sends no aggregate.)

Every rank decodes the same digits on the same levels: replicas stay bitwise identical. The
second option, each rank on its own levels and the average re-quantized with fresh levels plus
server-side error feedback, is ``aggregate="requantize"`` (:mod:`terngrad.comm.exchanges.exchange`).

The sharded exchange cuts shards at bucket boundaries (:func:`bucket_shard_bounds`), so each
shard's owner holds whole buckets and their levels.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from terngrad.comm.errors import ExchangeMismatch
from terngrad.comm.exchanges.link import Link
from terngrad.kernels import Kernels
from terngrad.quantize import Layout, LevelQuantizer
from terngrad.wire import Codec, FrameHeader, frame_nbytes, read_frame, write_frame


def bucket_shard_bounds(layout: Layout, parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous element ranges covering ``layout``, each cut at a bucket boundary
    nearest to an equal split (a range may be empty when there are fewer buckets than parts)."""
    starts = layout.bucket_starts
    numel = int(starts[-1])
    cuts = [0]
    for k in range(1, parts):
        target = torch.tensor([k * numel / parts], dtype=torch.float64)
        i = int(torch.searchsorted(starts.double(), target).clamp(max=len(starts) - 1))
        if i > 0 and target - starts[i - 1] < starts[i] - target:
            i -= 1
        cuts.append(max(cuts[-1], int(starts[i])))
    cuts.append(numel)
    return list(itertools.pairwise(cuts))


@dataclass(frozen=True)
class CoherentStep:
    """One rank's gradient on levels shared by all ranks, for one step."""

    quantizer: LevelQuantizer
    layout: Layout
    scales: torch.Tensor  # (n_buckets, k) float32, the same on every rank
    digits: torch.Tensor  # this rank's digits, flat order

    @classmethod
    def agree(
        cls,
        q: LevelQuantizer,
        flat: torch.Tensor,
        layout: Layout,
        link: Link,
        uniform: torch.Tensor | None,
        kernels: str | Kernels | None = None,
    ) -> CoherentStep:
        """Fit, share and combine the levels, and round this rank's gradient onto them
        (``uniform``: its draws, one per element, for stochastic rounding; ``kernels``: the
        backend of the fit, as :meth:`~terngrad.quantize.LevelQuantizer.scales` takes it)."""
        y = q.prepare(flat, layout)
        local = q.scales(y, layout, kernels).to(torch.float32).contiguous()
        size = local.numel() * 4
        gathered = link.all_gather(local.reshape(-1).view(torch.uint8), [size] * link.size)
        stacked = torch.stack([g.clone().view(torch.float32).view(local.shape) for g in gathered])
        scales = q.coherent_scales(stacked).contiguous()
        return cls(q, layout, scales, q.round_onto(y, layout, scales, uniform))

    @property
    def codec(self) -> Codec:
        return Codec.base(self.quantizer.levels)

    def frame_nbytes(self, lo: int, hi: int) -> int:
        """Bytes of a frame of the digits of elements ``[lo, hi)``."""
        return frame_nbytes(1, 0, self.codec.nbytes(hi - lo))

    def _header(self, numel: int) -> FrameHeader:
        q = self.quantizer
        return FrameHeader(
            method_id=q.method_id, codec=self.codec, dtype=torch.float32, shape=(numel,),
            levels=q.levels, bucket_size=0, n_scales=0,
        )  # fmt: skip

    def frame(self, lo: int, hi: int, digits: torch.Tensor | None = None) -> torch.Tensor:
        """A frame of this rank's digits of ``[lo, hi)`` (or of ``digits`` for that range)."""
        values = self.digits[lo:hi] if digits is None else digits
        return write_frame(self._header(hi - lo), torch.empty(0), self.codec.pack(values))

    def values(self, frame: torch.Tensor, lo: int, hi: int, sender: int) -> torch.Tensor:
        """The float32 values a frame of digits of ``[lo, hi)`` stands for on the levels."""
        header, _, payload = read_frame(frame)
        q = self.quantizer
        if (header.method_id, header.levels, header.numel) != (q.method_id, q.levels, hi - lo):
            raise ExchangeMismatch(
                f"rank {sender} sent {header.numel} digits of method id {header.method_id} with "
                f"{header.levels} levels; this rank expected {hi - lo} of method id "
                f"{q.method_id} with {q.levels}: the ranks disagree on the model, the bucket "
                "layout or the quantizer"
            )
        digits = self.codec.unpack(payload, hi - lo)
        if digits.numel() and int(digits.max()) >= q.levels:
            raise ExchangeMismatch(f"rank {sender} sent a digit beyond {q.levels} levels")
        return self._decode(digits, lo, hi)

    def own_values(self) -> torch.Tensor:
        """What this rank's own digits decode to (for worker-side error feedback)."""
        return self._decode(self.digits, 0, self.layout.numel)

    def mean(self, frames: list[torch.Tensor], lo: int, hi: int) -> torch.Tensor:
        """The mean of every rank's values of ``[lo, hi)``, summed in rank order."""
        total = self.values(frames[0], lo, hi, 0).clone()
        for sender, frame in enumerate(frames[1:], start=1):
            total += self.values(frame, lo, hi, sender)
        return total / len(frames)

    def reround(
        self, mean: torch.Tensor, lo: int, hi: int, generator: torch.Generator | None
    ) -> torch.Tensor:
        """Digits of ``mean`` (elements ``[lo, hi)``) on the same levels, by unbiased random
        rounding with draws from ``generator``."""
        part, scales = self._part(lo, hi)
        uniform = torch.rand(hi - lo, generator=generator, device=mean.device)
        return self.quantizer.round_onto(mean, part, scales, uniform, rounding="stochastic")

    def _part(self, lo: int, hi: int) -> tuple[Layout, torch.Tensor]:
        """The layout of ``[lo, hi)`` (whole buckets) and its buckets' scales."""
        if (lo, hi) == (0, self.layout.numel):
            return self.layout, self.scales
        starts = self.layout.bucket_starts
        first = int(torch.searchsorted(starts, torch.tensor([lo]))[0])
        last = int(torch.searchsorted(starts, torch.tensor([hi]))[0])
        part = self.layout.slice(lo, hi)
        assert int(starts[first]) == lo and int(starts[last]) == hi, "shards cut buckets"
        assert part.n_buckets == last - first
        return part, self.scales[first:last]

    def _decode(self, digits: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
        part, scales = self._part(lo, hi)
        return self.quantizer.dequantize(scales.reshape(-1), digits, part, self.quantizer.levels)
