"""Codecs: which packer turns a message's values into payload bytes, named by a small id.

A :class:`Codec` is what a frame header records about its payload, so a receiver can unpack it
without knowing the quantizer that produced it:

=========  ======  ==========================================  ===========================
kind       id      param                                       payload
=========  ======  ==========================================  ===========================
``raw32``  0       0                                           float32 values, little-endian
``raw16``  1       0                                           float16 values, little-endian
``nbit``   2       bits per digit, 1..16                       :func:`~terngrad.wire.pack.pack_nbit`
``base``   3       base B, 2..65535                            :func:`~terngrad.wire.pack.pack_base`
=========  ======  ==========================================  ===========================
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import ClassVar

import torch

from terngrad.wire import pack

if sys.byteorder != "little":  # raw float payloads are the host's bytes
    raise ImportError("terngrad's wire format assumes a little-endian host")


@dataclass(frozen=True)
class Codec:
    """A payload encoding: ``kind`` (one of :attr:`KINDS`) and its integer ``param``."""

    kind: str
    param: int = 0

    KINDS: ClassVar[tuple[str, ...]] = ("raw32", "raw16", "nbit", "base")
    _FLOAT: ClassVar[dict[str, torch.dtype]] = {"raw32": torch.float32, "raw16": torch.float16}

    def __post_init__(self) -> None:
        if self.kind not in self.KINDS:
            raise ValueError(f"unknown codec kind {self.kind!r}; known: {', '.join(self.KINDS)}")
        if self.kind in self._FLOAT and self.param != 0:
            raise ValueError(f"codec {self.kind} takes no parameter, got {self.param}")
        if self.kind == "nbit":
            pack.nbit_nbytes(0, self.param)  # validates bits
        if self.kind == "base":
            pack.word_layout(self.param)  # validates base

    @classmethod
    def raw32(cls) -> Codec:
        return cls("raw32")

    @classmethod
    def raw16(cls) -> Codec:
        return cls("raw16")

    @classmethod
    def nbit(cls, bits: int) -> Codec:
        return cls("nbit", bits)

    @classmethod
    def base(cls, base: int) -> Codec:
        return cls("base", base)

    @property
    def kind_id(self) -> int:
        return self.KINDS.index(self.kind)

    @classmethod
    def from_ids(cls, kind_id: int, param: int) -> Codec:
        """The codec a frame header names; ``ValueError`` for an unknown id or bad param."""
        if not 0 <= kind_id < len(cls.KINDS):
            raise ValueError(f"unknown codec id {kind_id} in frame header")
        try:
            return cls(cls.KINDS[kind_id], param)
        except ValueError as bad:
            raise ValueError(f"frame header field codec param: {bad} (corrupted header)") from None

    @property
    def capacity(self) -> int:
        """The distinct digits a payload can hold: ``2**bits`` or the base (0 for floats)."""
        if self.is_float:
            return 0
        return 1 << self.param if self.kind == "nbit" else self.param

    @property
    def is_float(self) -> bool:
        """True for the raw float codecs, whose payload holds values rather than digits."""
        return self.kind in self._FLOAT

    def nbytes(self, numel: int) -> int:
        """Exact payload bytes for ``numel`` values (a non-negative integer)."""
        pack.check_count(numel)
        if self.is_float:
            return numel * self._FLOAT[self.kind].itemsize
        if self.kind == "nbit":
            return pack.nbit_nbytes(numel, self.param)
        return pack.base_nbytes(numel, self.param)

    def pack(self, values: torch.Tensor) -> torch.Tensor:
        """Payload bytes (1-D uint8) for ``values``: floats for raw codecs, digits otherwise."""
        if self.is_float:
            flat = values.reshape(-1).to(self._FLOAT[self.kind]).contiguous()
            return flat.view(torch.uint8)
        if self.kind == "nbit":
            return pack.pack_nbit(values, self.param)
        return pack.pack_base(values, self.param)

    def unpack(self, payload: torch.Tensor, numel: int) -> torch.Tensor:
        """Inverse of :meth:`pack`: ``numel`` floats (raw codecs) or digits."""
        if self.is_float:
            payload = pack.check_packed(payload, self.nbytes(numel), f"{self.kind} unpack")
            # clone: the payload may sit at an offset inside a frame that is not float-aligned
            return payload.reshape(-1).clone().view(self._FLOAT[self.kind])
        if self.kind == "nbit":
            return pack.unpack_nbit(payload, self.param, numel)
        return pack.unpack_base(payload, self.param, numel)

    def __str__(self) -> str:
        return self.kind if self.is_float else f"{self.kind}{self.param}"
