"""Frames of summed grid digits: what the shared-grid exchanges send after scalar sharing.

On a shared grid every rank's digit of an element is a signed integer in ``[-m, m]`` (TernGrad:
``m = 1``). The sum over ``count`` ranks lies in ``[-count m, count m]``; it travels offset by
``count m`` in base ``2 count m + 1`` (:meth:`Codec.base`: planar words, see
:mod:`terngrad.wire.pack`), in a frame with no scales (the receiver has the shared ones). A
rank's own message is the case ``count = 1``.
"""

from __future__ import annotations

import torch

from terngrad.wire.codec import Codec
from terngrad.wire.frame import FrameHeader, frame_nbytes


def codes_codec(count: int, m: int) -> Codec:
    """The codec of digits summed over ``count`` ranks: base ``2 count m + 1``."""
    return Codec.base(2 * count * m + 1)


def codes_header(method_id: int, numel: int, count: int, m: int) -> FrameHeader:
    """The header of a frame of ``numel`` grid digits summed over ``count`` ranks: each digit is
    a signed sum in ``[-count m, count m]`` plus ``count m``, in base ``2 count m + 1``."""
    codec = codes_codec(count, m)
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
    """Exact bytes of a frame of ``numel`` digits summed over ``count`` ranks."""
    return frame_nbytes(1, 0, codes_codec(count, m).nbytes(numel))
