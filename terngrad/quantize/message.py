"""The registry of quantizers (name <-> class <-> the method id a frame carries) and
:class:`Encoded`, one encoded gradient exactly as it travels.

A quantizer class registers itself by subclassing
(``class X(Quantizer, name="x", method_id=9)``, :class:`~terngrad.quantize.base.Quantizer`);
a frame's header names its method by id, so ids never change once released.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass

import torch

from terngrad.quantize.layout import Layout
from terngrad.wire import Codec, FrameHeader, read_frame, write_frame

#: name -> the :class:`~terngrad.quantize.base.Quantizer` subclass (typed ``type`` here: the
#: interface imports this module, not the other way round)
_REGISTRY: dict[str, type] = {}


def register(cls: type, name: str, method_id: int) -> None:
    """Record ``cls`` as the quantizer ``name`` with frame id ``method_id`` (each once)."""
    if name in _REGISTRY or method_id in {q.method_id for q in _REGISTRY.values()}:
        raise RuntimeError(f"quantizer {name!r} (id {method_id}) is registered twice")
    cls.name, cls.method_id = name, method_id
    _REGISTRY[name] = cls


def lookup(name: str) -> type:
    """The quantizer class registered as ``name``; a clear error with suggestions if none."""
    if not isinstance(name, str):
        raise TypeError(f"a quantizer name is a string (quantize.names()), got {name!r}")
    if name not in _REGISTRY:
        close = difflib.get_close_matches(str(name), list(_REGISTRY), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(
            f"unknown quantizer {name!r}{hint}; choose one of: {', '.join(registered_names())}"
        )
    return _REGISTRY[name]


def registered_names() -> list[str]:
    """Registered names in method-id order."""
    return sorted(_REGISTRY, key=lambda name: _REGISTRY[name].method_id)


# --------------------------------------------------------------------------- the message


@dataclass(frozen=True, eq=False)
class Encoded:
    """One encoded gradient: everything a receiver needs to decode it.

    ``scales`` (float32, 1-D) and ``payload`` (uint8, 1-D: the packed digits, or raw floats for
    ``fp32``/``fp16``) travel in one frame with a small header; ``nbytes`` is that frame's exact
    size. ``levels``, ``bucket_size`` (0 = one bucket per segment) and ``segments`` (the layer
    lengths of a flat buffer; empty = one segment) are the header's method parameters, so
    decoding needs nothing but this object.
    """

    method: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    codec: Codec
    levels: int
    bucket_size: int
    scales: torch.Tensor
    payload: torch.Tensor
    segments: tuple[int, ...] = ()

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def layout(self) -> Layout:
        return Layout.of(self.numel, self.segments or None, self.bucket_size or None)

    @property
    def header(self) -> FrameHeader:
        return FrameHeader(
            method_id=lookup(self.method).method_id,
            codec=self.codec,
            dtype=self.dtype,
            shape=self.shape,
            levels=self.levels,
            bucket_size=self.bucket_size,
            n_scales=self.scales.numel(),
            segments=self.segments,
        )

    @property
    def nbytes(self) -> int:
        """Exact bytes of this message on the wire: header + 4 * scales + payload."""
        return self.header.nbytes

    @property
    def bits_per_element(self) -> float:
        """Wire bits per gradient element, everything included (``inf`` for an empty tensor)."""
        return 8 * self.nbytes / self.numel if self.numel else math.inf

    def to_frame(self) -> torch.Tensor:
        """The message as one contiguous uint8 tensor (see :mod:`terngrad.wire.frame`)."""
        return write_frame(self.header, self.scales, self.payload)

    @classmethod
    def from_frame(cls, frame: torch.Tensor | bytes | bytearray | memoryview) -> Encoded:
        """Parse a frame; ``ValueError`` if it is damaged or names an unknown method."""
        header, scales, payload = read_frame(frame)
        methods = {q.method_id: name for name, q in _REGISTRY.items()}
        if header.method_id not in methods:
            raise ValueError(f"terngrad frame names unknown method id {header.method_id}")
        return cls(
            method=methods[header.method_id],
            shape=header.shape,
            dtype=header.dtype,
            codec=header.codec,
            levels=header.levels,
            bucket_size=header.bucket_size,
            scales=scales,
            payload=payload,
            segments=header.segments,
        )
