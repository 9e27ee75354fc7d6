"""The :class:`Quantizer` interface every method shares (the registry and the :class:`Encoded`
message: :mod:`terngrad.quantize.message`; bucketing: :mod:`terngrad.quantize.layout`; the input
checks: :mod:`terngrad.quantize.checks`; stochastic rounding: :mod:`terngrad.quantize.random`).

A quantizer maps a gradient ``g`` (any shape, float) to a few float32 *scales* per bucket and one
integer *digit* per element; the wire layer packs the digits, and :class:`Encoded` is exactly
what travels: ``Encoded.nbytes`` is the size of its frame (header + scales + payload).
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from terngrad.quantize.checks import (
    check_digits,
    check_finite,
    check_generator,
    check_gradient,
    check_layout_input,
    check_message,
    check_out,
    check_scale,
    check_uniform,
    flat_gradient,
)
from terngrad.quantize.kernels import Draws, Kernels, resolve
from terngrad.quantize.layout import Layout
from terngrad.quantize.message import Encoded, register
from terngrad.quantize.random import Streams
from terngrad.wire import Codec, frame_nbytes

# --------------------------------------------------------------------------- the interface


class Quantizer(ABC):
    """A gradient quantizer: ``encode`` a tensor to an :class:`Encoded`, ``decode`` it back.

    Subclasses register themselves by name: ``class X(Quantizer, name="x", method_id=9)``;
    the method id is what a frame header carries, so ids never change once released.
    """

    name: ClassVar[str]
    method_id: ClassVar[int]
    #: True if encoding draws random numbers (the ``generator`` argument matters).
    stochastic: ClassVar[bool] = False
    #: True if ``encode`` takes ``scale=`` (an imposed, shared scale per bucket).
    accepts_scale: ClassVar[bool] = False
    #: True if every scale is a magnitude (>= 0): a message with a negative one is refused.
    nonnegative_scales: ClassVar[bool] = False

    def __init_subclass__(cls, *, name: str | None = None, method_id: int | None = None, **kw):
        super().__init_subclass__(**kw)
        if name is None:
            return  # an abstract family, not a method
        register(cls, name, method_id)

    # --- configuration, set by each method's __init__
    bucket_size: int | None = None

    @property
    @abstractmethod
    def unbiased(self) -> bool:
        """True where E[decode(encode(g))] == g for every g."""

    @property
    @abstractmethod
    def levels(self) -> int:
        """Distinct values per bucket (0 for the float baselines); the header's ``levels``."""

    @property
    @abstractmethod
    def codec(self) -> Codec:
        """How the digits (or floats) are packed."""

    @classmethod
    def option_names(cls) -> list[str]:
        """The keyword options the method's constructor takes."""
        return [p for p in inspect.signature(cls.__init__).parameters if p != "self"]

    @property
    def options(self) -> dict[str, Any]:
        """The constructor options of this instance: ``quantize.get(q.name, **q.options)``."""
        return {p: getattr(self, p) for p in self.option_names()}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.options.items())
        return f"quantize.get({self.name!r}{', ' if args else ''}{args})"

    # --- the public operations

    def encode(
        self,
        grad: torch.Tensor,
        generator: torch.Generator | None = None,
        scale: float | torch.Tensor | None = None,
        segments: Sequence[int] | None = None,
        uniform: torch.Tensor | None = None,
        kernels: str | Kernels | None = None,
    ) -> Encoded:
        """Quantize ``grad`` (any shape, floating point, finite) into one wire message.

        ``generator`` supplies the random draws of stochastic rounding (the global RNG if
        ``None``), or ``uniform`` gives them: one value in [0, 1) per element, in flat order;
        ``scale`` imposes the scale of each bucket (a number or one value per bucket) where the
        method supports it; ``segments`` gives the lengths of the layers packed one after
        another in a flat ``grad``, so that each gets its own scales. ``kernels`` is the
        backend that runs (:func:`~terngrad.quantize.kernels.resolve`: ``None``/``"auto"``
        the fused kernels where they run, ``"torch"`` the reference, or a
        :class:`~terngrad.quantize.kernels.Kernels`); every backend gives the same bytes.

        Checked (:mod:`~terngrad.quantize.checks`), each with one ``TypeError`` or
        ``ValueError``: the gradient (floating point, finite, within float32's range), the
        generator's type, the draws (float32, one per element, on the gradient's device, every
        one in [0, 1): one pass over them), the scale (finite, >= 0, one per bucket) and
        the segments.
        """
        return self._encode_message(grad, generator, scale, segments, uniform, kernels, True)

    def _encode_message(
        self, grad: torch.Tensor, generator: torch.Generator | None,
        scale: float | torch.Tensor | None, segments: Sequence[int] | None,
        uniform: torch.Tensor | None, kernels: str | Kernels | None, scan_draws: bool,
    ) -> Encoded:  # fmt: skip
        """:meth:`encode`; ``scan_draws=False`` for draws the caller generated itself (the
        exchange's ``torch.rand`` or counter streams, every step): their count, dtype and
        device are checked, their values not scanned."""
        flat = flat_gradient(grad)
        layout = Layout.of(flat.numel(), segments, self.bucket_size)
        scale_t = self._check_scale(scale, layout, flat.device)
        draws = self._draws(flat, layout, generator, uniform, scan_draws)
        backend = resolve(kernels, flat.device)
        if flat.numel():
            scales, payload = self._encode(backend, flat, layout, draws, scale_t)
        else:  # nothing for a kernel to do
            scales, payload = self._encode_reference(flat, layout, draws, scale_t)
        return self._message(grad, layout, scales, payload)

    def _message(
        self, grad: torch.Tensor, layout: Layout, scales: torch.Tensor, payload: torch.Tensor
    ) -> Encoded:
        """The message of this method holding ``scales`` and ``payload`` for ``grad`` (its
        shape and dtype) in ``layout``."""
        return Encoded(
            method=self.name,
            shape=tuple(grad.shape),
            dtype=grad.dtype,
            codec=self.codec,
            levels=self.levels,
            bucket_size=self.bucket_size or 0,
            scales=scales,
            payload=payload,
            segments=layout.wire_segments,
        )

    def message_nbytes(self, numel: int, segments: Sequence[int] | None = None) -> int:
        """Exact bytes of the frame ``encode`` makes of a flat (1-D) gradient of ``numel``
        elements in ``segments``, without encoding anything."""
        layout = Layout.of(numel, segments, self.bucket_size)
        n_scales = layout.n_buckets * self._scales_per_bucket(self.levels)
        return frame_nbytes(1, n_scales, self.codec.nbytes(numel), len(layout.wire_segments))

    def decode(
        self,
        encoded: Encoded,
        out: torch.Tensor | None = None,
        kernels: str | Kernels | None = None,
    ) -> torch.Tensor:
        """The float32 tensor ``encoded`` stands for, in the original shape; written into
        ``out`` if given (a contiguous float32 tensor of as many elements on the payload's
        device, e.g. the gradient's own buffer: no allocation of the tensor's size, as the DDP
        hook decodes). ``kernels`` as in :meth:`encode`, on the payload's device.

        Checked before anything is allocated (:func:`~terngrad.quantize.checks.check_message`):
        every field of the message against this method and the others, so a forged message
        (say a checksummed frame with a contradicting header) raises one ``ValueError`` naming
        the field; and ``out`` (:func:`~terngrad.quantize.checks.check_out`)."""
        if not isinstance(encoded, Encoded):
            raise TypeError(f"decode takes an Encoded, got {type(encoded).__name__}")
        if encoded.method != self.name:
            raise ValueError(
                f"this message was encoded by {encoded.method!r}; decode it with "
                f"quantize.get({encoded.method!r}) or quantize.decode()"
            )
        layout = check_message(self, encoded)
        if out is not None:
            check_out(out, layout.numel, encoded.payload.device)
        backend = resolve(kernels, encoded.payload.device)
        flat_out = None if out is None else out.view(-1)
        if layout.numel:
            flat = self._decode(backend, encoded, layout, flat_out)
        else:  # nothing for a kernel to do
            flat = self._decode_reference(encoded, layout, flat_out)
        return flat.reshape(encoded.shape) if out is None else out

    def quantize(
        self,
        flat: torch.Tensor,
        layout: Layout,
        generator: torch.Generator | None = None,
        scale: float | torch.Tensor | None = None,
        uniform: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The unpacked form of :meth:`encode`, for the exchange algorithms: the float32 scales
        (one or more per bucket of ``layout``) and one value per element of the flat, finite
        float32 ``flat`` (a digit for :attr:`codec`, or a float for fp32/fp16). The random draws
        are ``uniform`` if given (float32 in [0, 1), one per element in order), else the
        counter-based streams :meth:`Streams.from_generator` keys from ``generator``. Checked
        as :meth:`encode` checks (``flat`` of ``layout.numel`` elements, finite)."""
        flat = check_layout_input(flat, layout)
        scale_t = self._check_scale(scale, layout, flat.device)
        draws = self._draws(flat, layout, generator, uniform, True)
        return self._quantize_drawn(flat, layout, draws, scale_t)

    def _draws(
        self,
        flat: torch.Tensor,
        layout: Layout,
        generator: torch.Generator | None,
        uniform: torch.Tensor | None,
        scan: bool,
    ) -> Draws | None:
        """The draws of one encoding: ``uniform`` (checked; its values scanned if ``scan``),
        or one counter-based stream per segment keyed from ``generator`` (its type checked);
        ``None`` for a deterministic method."""
        check_generator(generator)
        if uniform is not None:
            uniform = check_uniform(uniform, flat, scan)
        if not self.stochastic:
            return None
        if uniform is not None:
            return uniform
        return Streams.from_generator(generator, len(layout.segments))

    def _quantize_drawn(
        self,
        flat: torch.Tensor,
        layout: Layout,
        draws: Draws | None,
        scale: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The reference's ``(scales, values)`` for the given draws."""
        if not flat.numel():
            return flat.new_empty(0), flat.new_empty(0, dtype=torch.int64)
        uniform = (
            draws.uniform(layout.segments).to(flat.device) if isinstance(draws, Streams) else draws
        )
        scales, values = self._quantize(flat, layout, uniform, scale)
        return scales.to(torch.float32).reshape(-1), values

    # --- what runs: each family overrides these with its kernels' operations

    def _encode(
        self,
        kernels: Kernels,
        flat: torch.Tensor,
        layout: Layout,
        draws: Draws | None,
        scale: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(scales, payload)`` of a non-empty flat float32 gradient (``ValueError`` if it is
        not finite): by default the reference, no kernels (the float baselines)."""
        return self._encode_reference(flat, layout, draws, scale)

    def _decode(
        self,
        kernels: Kernels,
        encoded: Encoded,
        layout: Layout,
        out: torch.Tensor | None,
    ) -> torch.Tensor:
        """The flat float32 values of a non-empty, checked message, written into the flat
        ``out`` if given: by default the reference, no kernels (the float baselines)."""
        return self._decode_reference(encoded, layout, out)

    def _encode_reference(
        self, flat: torch.Tensor, layout: Layout, draws: Draws | None, scale: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`quantize` and the codec's packing."""
        scales, values = self._quantize_drawn(check_finite(flat), layout, draws, scale)
        return scales, self.codec.pack(values)

    def _decode_reference(
        self, encoded: Encoded, layout: Layout, out: torch.Tensor | None
    ) -> torch.Tensor:
        """The codec's unpacking, the digits' range and :meth:`dequantize`."""
        values = encoded.codec.unpack(encoded.payload, layout.numel)
        if not encoded.codec.is_float:
            check_digits(self.name, values, encoded.levels)
        flat = self.dequantize(encoded.scales, values, layout, encoded.levels)
        return flat if out is None else out.copy_(flat)

    def _digit_payload(self, encoded: Encoded, device: torch.device) -> torch.Tensor:
        """The payload of a checked message of digits, on ``device``, for the kernels: its
        digits are checked first where its codec can hold one beyond the message's levels (a
        2-bit field in a message of 3 levels); the kernels check the words of a base-``levels``
        codec."""
        codec = encoded.codec
        if codec != Codec.base(encoded.levels):
            numel = encoded.layout.numel
            check_digits(self.name, codec.unpack(encoded.payload, numel), encoded.levels)
        return encoded.payload.to(device)

    def dequantize(
        self, scales: torch.Tensor, values: torch.Tensor, layout: Layout, levels: int
    ) -> torch.Tensor:
        """Inverse of :meth:`quantize`: the flat float32 values."""
        if not layout.numel:
            return torch.zeros(0)
        return self._dequantize(scales.to(torch.float32), values, layout, levels)

    def variance(
        self,
        grad: torch.Tensor,
        scale: float | torch.Tensor | None = None,
        segments: Sequence[int] | None = None,
        kernels: str | Kernels | None = None,
    ) -> float:
        """Exact ``E||decode(encode(g)) - g||^2`` over the random draws (no sampling).

        For unbiased methods this is the variance; for biased ones it includes the squared
        bias (clipping, clamping, deterministic rounding). ``kernels`` as in :meth:`encode`
        (the level quantizers' fit runs on them).
        """
        flat = check_gradient(grad)
        layout = Layout.of(flat.numel(), segments, self.bucket_size)
        scale_t = self._check_scale(scale, layout, flat.device)
        backend = resolve(kernels, flat.device)
        if not flat.numel():
            return 0.0
        return float(self._expected_sq_error(flat, layout, scale_t, backend))

    # --- what each method implements

    @abstractmethod
    def _quantize(
        self,
        flat: torch.Tensor,
        layout: Layout,
        uniform: torch.Tensor | None,
        scale: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(scales, values)`` for a non-empty flat float32 gradient: what ``codec`` packs."""

    @abstractmethod
    def _dequantize(
        self, scales: torch.Tensor, values: torch.Tensor, layout: Layout, levels: int
    ) -> torch.Tensor:
        """The flat float32 values from a message's scales and unpacked values."""

    @abstractmethod
    def _expected_sq_error(
        self, flat: torch.Tensor, layout: Layout, scale: torch.Tensor | None, kernels: Kernels
    ) -> torch.Tensor:
        """Exact ``E||Q(g) - g||^2`` for a non-empty flat float32 gradient (``kernels`` runs
        whatever the formula needs fitted)."""

    def _scales_per_bucket(self, levels: int) -> int:
        """Float32 scales each bucket sends, for a message of ``levels`` levels."""
        return 1

    def _message_levels_problem(self, levels: int) -> str | None:
        """What is wrong with a message's ``levels`` for this method, or ``None``: a method
        whose levels are not an option always has :attr:`levels`; the others 2 to 65535."""
        if "levels" not in self.option_names():
            fixed = levels == self.levels
            return None if fixed else f"{levels}, where {self.name} has {self.levels}"
        return None if 2 <= levels <= 65535 else f"{levels}, outside [2, 65535]"

    def _check_scale(
        self, scale: float | torch.Tensor | None, layout: Layout, device: torch.device
    ) -> torch.Tensor | None:
        """An imposed scale as one float32 value per bucket, or ``None`` (checked:
        :func:`~terngrad.quantize.checks.check_scale`)."""
        return check_scale(scale, layout.n_buckets, device, self.name, self.accepts_scale)
