"""The wire layer: integer codes to bytes and back, and the frame that carries one message.

It knows byte tensors only; nothing here knows a quantizer. See ``pack`` for the bit layouts,
``codec`` for the codec ids and ``frame`` for the header.
"""

from terngrad.wire.codec import Codec
from terngrad.wire.frame import (
    FORMAT_VERSION,
    FrameHeader,
    check_header,
    check_scales,
    frame_nbytes,
    header_nbytes,
    new_frame,
    read_frame,
    seal_frame,
    write_frame,
)
from terngrad.wire.pack import (
    BLOCK_WORDS,
    base_nbytes,
    nbit_nbytes,
    pack_2bit,
    pack_base,
    pack_base3,
    pack_nbit,
    unpack_2bit,
    unpack_base,
    unpack_base3,
    unpack_nbit,
    word_layout,
)
from terngrad.wire.sums import codes_codec, codes_frame_nbytes, codes_header

__all__ = [
    "BLOCK_WORDS",
    "FORMAT_VERSION",
    "Codec",
    "FrameHeader",
    "base_nbytes",
    "check_header",
    "check_scales",
    "codes_codec",
    "codes_frame_nbytes",
    "codes_header",
    "frame_nbytes",
    "header_nbytes",
    "nbit_nbytes",
    "new_frame",
    "pack_2bit",
    "pack_base",
    "pack_base3",
    "pack_nbit",
    "read_frame",
    "seal_frame",
    "unpack_2bit",
    "unpack_base",
    "unpack_base3",
    "unpack_nbit",
    "word_layout",
    "write_frame",
]
