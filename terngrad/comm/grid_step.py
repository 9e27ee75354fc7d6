"""One rank's gradient on the shared grid for one step: the scales shared by all ranks
(:func:`share_scales`), then (:class:`GridStep`) its digits packed into frames of any range,
frames of summed digits added, and sums decoded into the mean.

The per-element work runs on a :mod:`terngrad.kernels` backend; the frames are those of
:mod:`terngrad.wire.sums`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from terngrad.comm.errors import ExchangeMismatch
from terngrad.comm.link import Link
from terngrad.kernels import GridInput, Kernels, Streams
from terngrad.quantize import SymmetricGrid
from terngrad.wire import codes_codec, codes_header, new_frame, read_frame, seal_frame


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


def share_scales(link: Link, local: torch.Tensor) -> torch.Tensor | None:
    """Scalar sharing (the TernGrad paper's Sec. 3.2): the MAX over the ranks of ``link`` of
    each bucket's ``local`` scale, so that every rank rounds onto the same grid; ``None`` if
    some rank's gradient is not finite (its scale then is not). A flag travels with the
    scales, because a MAX reduction need not propagate NaN (max(1, NaN) may be 1)."""
    finite = torch.isfinite(local)
    flag = (~finite).any().to(local.dtype).reshape(1)
    shared = link.all_reduce(torch.cat([local.where(finite, 0.0), flag]), dist.ReduceOp.MAX)
    return shared[:-1] if float(shared[-1]) == 0.0 else None


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
            self.grid, self.shared, self.draws, lo, hi, codes_codec(1, q.m), payload
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
            payloads, numel, codes_codec(count, q.m), codes_codec(total, q.m), payload
        )
        return seal_frame(frame)

    def decode(self, frame: torch.Tensor, lo: int, out: torch.Tensor, count: int, sender) -> None:
        """``out`` (the elements from ``lo`` on) gets the mean of ``count`` ranks' quantized
        values from ``frame``, their summed digits: ``s * sum / (count m)``."""
        q = self.quantizer
        payload = read_codes(frame, q.method_id, out.numel(), count, q.m, sender)
        self.kernels.decode_into(
            out, payload, codes_codec(count, q.m), count * q.m, count * q.m, lo,
            self.grid.layout, self.shared,
        )  # fmt: skip
