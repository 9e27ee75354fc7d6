"""One rank's gradient on the shared grid for one step: the scales shared by all ranks
(:func:`share_scales`; with ``fit_scale`` also the least-squares value of a digit,
:func:`share_fitted_scales`), then (:class:`GridStep`) its digits packed into frames of any range,
frames of summed digits added, and sums decoded into the mean.

The per-element work runs on a :mod:`terngrad.kernels` backend; the frames are those of
:mod:`terngrad.wire.sums`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from terngrad.comm.errors import ExchangeMismatch
from terngrad.comm.exchanges.link import Link
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
    return _max_if_finite(link, local)


def share_fitted_scales(
    link: Link, local: torch.Tensor, fit: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """:func:`share_scales` and, in the same all-reduce, the value a digit decodes to per
    bucket (``fit_scale``): ``min(min_r fit_r, s)``, ``fit_r`` each rank's least-squares
    value (:func:`least_squares_values`) and ``s`` the shared scale. Returns ``(s, values)``,
    identical on every rank, or ``None`` if some rank's gradient is not finite."""
    agreed = _max_if_finite(link, torch.cat([local, -fit]))
    if agreed is None:
        return None
    shared, fitted = agreed.split(local.numel())
    return shared, torch.minimum(-fitted, shared)


def _max_if_finite(link: Link, values: torch.Tensor) -> torch.Tensor | None:
    finite = torch.isfinite(values)
    flag = (~finite).any().to(values.dtype).reshape(1)
    agreed = link.all_reduce(torch.cat([values.where(finite, 0.0), flag]), dist.ReduceOp.MAX)
    return agreed[:-1] if float(agreed[-1]) == 0.0 else None


def least_squares_values(grid: GridInput) -> torch.Tensor:
    """Per bucket, the value ``v = <y, g> / ||y||_1`` (float32) that makes ``v t`` the
    least-squares fit of the gradient ``g`` among the multiples of this rank's ternary digits
    ``t`` (``y`` the clipped ``g``; one level a side, ``m = 1``): with ``s`` the grid's scale,
    ``E[t] = y / s`` and ``E||t||^2 = ||y||_1 / s``, so ``E||g - v t||^2`` is least at
    ``v = <E t, g> / E||t||^2``. Decoding digits to ``v`` instead of ``s`` shrinks what is
    sent by ``v / s``, which makes the compression a contraction (``E||g - C(g)||^2 <
    ||g||^2``): worker-side error feedback needs one (Karimireddy et al. 2019, Assumption A;
    Beznosikov et al. 2020, unbiased compressors scaled by ``1 / (1 + omega)``). Plain
    TernGrad's ``E||g - Q(g)||^2 = s ||y||_1 - ||y||^2`` exceeds ``||g||^2`` when
    ``s ||y||_1 > 2 ||y||^2`` (evenly spread values, as AdamW's updates are), and the
    residual can then grow without bound. A bucket of zeros gets 0."""
    y = grid.flat.double()
    clipped = y
    if grid.bound is not None:
        bound = grid.bound.double()
        bound = grid.layout.expand(torch.where(bound > 0, bound, torch.inf))
        clipped = torch.maximum(torch.minimum(y, bound), -bound)
    dot = grid.layout.reduce(clipped * y, lambda rows: rows.sum(1))
    l1 = grid.layout.reduce(clipped.abs(), lambda rows: rows.sum(1))
    return torch.where(l1 > 0, dot / l1.clamp_min(1e-300), 0.0).float()


@dataclass(frozen=True)
class GridStep:
    """One rank's gradient on the shared grid for one step: everything needed to pack any range
    of its digits into a frame and to decode frames of summed digits."""

    kernels: Kernels
    grid: GridInput
    shared: torch.Tensor
    draws: Streams | torch.Tensor
    #: what a digit decodes to per bucket, if not the shared scale (``fit_scale``)
    values: torch.Tensor | None = None

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
        values from ``frame``, their summed digits: ``s * sum / (count m)`` (``values`` in
        place of ``s`` if given)."""
        q = self.quantizer
        payload = read_codes(frame, q.method_id, out.numel(), count, q.m, sender)
        self.kernels.decode_into(
            out, payload, codes_codec(count, q.m), count * q.m, count * q.m, lo,
            self.grid.layout, self.shared if self.values is None else self.values,
        )  # fmt: skip
