"""The checks every public door of the quantizers runs on what it is given (the gradient, the
random draws or generator, an imposed scale, the output buffer) and on the messages it decodes.

Each bad input gets one exception, ``TypeError`` for the wrong kind of object and ``ValueError``
for a wrong value, as PyTorch does, with a one-line message that says what is wrong and what to
do. Every check is O(1) or O(number of scales), except the two that say they scan the values.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Protocol

import torch

from terngrad.quantize.layout import Layout
from terngrad.wire import Codec, check_scales

FLOAT32_MAX = torch.finfo(torch.float32).max


def flat_gradient(grad: Any) -> torch.Tensor:
    """The gradient as a flat, contiguous float32 tensor (no copy if it is one already):
    ``TypeError`` unless a tensor, ``ValueError`` unless floating point, or for a float64
    gradient holding a finite value beyond float32's range (that check scans a float64
    gradient, which the conversion reads anyway; float32, float16 and bfloat16 need none)."""
    if not isinstance(grad, torch.Tensor):
        raise TypeError(f"gradient must be a torch.Tensor, got {type(grad).__name__}")
    check_dense("gradient", grad, "grad.to_dense()")
    if not grad.dtype.is_floating_point:
        raise ValueError(
            f"gradient must be a floating-point tensor (float32, float16, bfloat16, float64), "
            f"got {grad.dtype}"
        )
    flat = grad.detach().reshape(-1).to(torch.float32).contiguous()
    if grad.dtype == torch.float64 and bool(torch.isinf(flat).any()):
        source = grad.detach().reshape(-1)
        beyond = torch.isinf(flat) & torch.isfinite(source)
        count = int(beyond.sum())
        if count:
            largest = float(source[beyond].abs().max())
            raise ValueError(
                f"gradient has {count} finite float64 value(s) beyond float32's range (largest "
                f"|g| = {largest:.4g} > {FLOAT32_MAX:.4g}); the quantizers work in float32: "
                "scale the loss or the gradient down, or clip it (torch.nn.utils.clip_grad_norm_)"
            )
    return flat


def check_dense(name: str, tensor: torch.Tensor, instead: str, meta: bool = True) -> None:
    """``TypeError`` for a sparse (COO, CSR, ...) or (with ``meta``) a meta tensor, which hold
    no dense values to read (torch's own errors would say "do not have is_contiguous" or
    "item() cannot be called on meta tensors"); ``instead``: what to pass. (Draws or an ``out``
    on the meta device are refused for their device, as on any other device.)"""
    if tensor.layout != torch.strided:
        raise TypeError(
            f"{name} must be a dense (strided) tensor, got a {str(tensor.layout)[6:]} one: "
            f"pass {instead}"
        )
    if meta and tensor.is_meta:
        raise TypeError(
            f"{name} is a meta tensor (a shape without values), which cannot be quantized: "
            "pass a tensor that holds its values"
        )


def check_finite(flat: torch.Tensor) -> torch.Tensor:
    """``flat`` itself, or a clear error naming how many of its values are NaN or Inf."""
    bad = flat.numel() - int(torch.isfinite(flat).sum())
    if bad:
        raise ValueError(
            f"gradient has {bad} non-finite value(s) (NaN or Inf) out of {flat.numel()}; "
            "they cannot be quantized: skip this step or find where the loss diverged"
        )
    return flat


def check_gradient(grad: Any) -> torch.Tensor:
    """The gradient as a flat float32 tensor; a clear error for anything a quantizer can't take."""
    return check_finite(flat_gradient(grad))


def check_generator(generator: Any) -> torch.Generator | None:
    """``generator`` if it is ``None`` or a ``torch.Generator``, else ``TypeError``."""
    if generator is None or isinstance(generator, torch.Generator):
        return generator
    raise TypeError(
        f"generator must be a torch.Generator or None, got {type(generator).__name__}: "
        "pass torch.Generator().manual_seed(seed)"
    )


def check_uniform(uniform: Any, flat: torch.Tensor, scan: bool = True) -> torch.Tensor:
    """Given draws as a flat tensor: ``TypeError`` unless a tensor; ``ValueError`` unless
    float32, one per element of ``flat`` and on its device; with ``scan`` (a caller's own
    draws) also unless every draw lies in [0, 1), NaN not: one pass over the draws, which the
    exchange's generated draws (``torch.rand``, the counter streams) skip."""
    n = flat.numel()
    if not isinstance(uniform, torch.Tensor):
        raise TypeError(
            f"uniform must be a torch.Tensor of {n} draws in [0, 1), got "
            f"{type(uniform).__name__}: pass torch.rand({n}, generator=...)"
        )
    check_dense("uniform", uniform, f"torch.rand({n}, generator=...)", meta=False)
    if uniform.dtype != torch.float32 or uniform.numel() != n:
        raise ValueError(
            f"uniform must be a float32 tensor of {n} draws in [0, 1), one per element, got "
            f"{uniform.numel()} of {uniform.dtype}: pass torch.rand({n}, generator=...)"
        )
    if uniform.device != flat.device:
        raise ValueError(
            f"uniform is on {uniform.device}, the gradient on {flat.device}: draw them on the "
            f"gradient's device (torch.rand({n}, device=grad.device))"
        )
    if scan and n:
        outside = n - int(((uniform >= 0) & (uniform < 1)).sum())
        if outside:
            raise ValueError(
                f"uniform must hold draws in [0, 1), but {outside} of {n} are outside it "
                "(negative, >= 1 or NaN) and would bias the rounding: draw them with torch.rand"
            )
    return uniform.reshape(-1)


def check_scale(
    scale: Any, count: int, device: torch.device, name: str, accepts: bool
) -> torch.Tensor | None:
    """An imposed scale as one float32 value per bucket (``count``) on ``device``, or ``None``:
    ``ValueError`` if the method takes none (``accepts``), for the wrong number of values, or
    for a NaN, an Inf or a negative value; ``TypeError`` unless a number or a tensor."""
    if scale is None:
        return None
    if not accepts:
        raise ValueError(
            f"{name} chooses its own levels per bucket and takes no imposed scale; pass scale=None"
        )
    try:
        s = torch.as_tensor(scale, dtype=torch.float32, device=device).reshape(-1)
    except (TypeError, ValueError, RuntimeError):
        s = None
    if s is None or isinstance(scale, bool | str):
        raise TypeError(
            f"scale must be a number or a tensor of one value per bucket, got "
            f"{type(scale).__name__}"
        )
    if s.numel() == 1 and count != 1:
        s = s.expand(count)
    if s.numel() != count:
        raise ValueError(
            f"scale must be one number or one value per bucket ({count} here), "
            f"got {s.numel()} values"
        )
    if count and not (bool(torch.isfinite(s).all()) and float(s.min()) >= 0):
        raise ValueError(
            "scale must be finite and non-negative (and within float32's range): "
            "pass the buckets' max |g| (or their max over the workers)"
        )
    return s.contiguous()


def check_out(out: Any, numel: int, device: torch.device) -> torch.Tensor:
    """The buffer a decode writes into: ``TypeError`` unless a tensor; ``ValueError`` unless
    a contiguous float32 tensor of ``numel`` elements (any shape) on ``device``, the message's
    (as PyTorch's ``out=``), that does not require grad."""
    if not isinstance(out, torch.Tensor):
        raise TypeError(
            f"out must be a torch.Tensor (float32, {numel} elements) or None, got "
            f"{type(out).__name__}"
        )
    check_dense("out", out, f"torch.empty({numel}, device={str(device)!r})", meta=False)
    if (
        out.dtype != torch.float32
        or out.numel() != numel
        or not out.is_contiguous()
        or out.device != device
    ):
        layout = "contiguous" if out.is_contiguous() else "not contiguous"
        raise ValueError(
            f"out must be a contiguous float32 tensor of {numel} elements on {device}, got "
            f"{out.dtype} of shape {tuple(out.shape)} ({layout}) on {out.device}: pass "
            f"torch.empty({numel}, device={str(device)!r}) or decode without out"
        )
    if out.requires_grad:
        raise ValueError("out requires grad, which decode cannot write into: pass out.detach()")
    return out


def check_layout_input(flat: Any, layout: Any) -> torch.Tensor:
    """``flat`` for :meth:`Quantizer.quantize`: a finite floating-point tensor (flattened to
    float32) of ``layout.numel`` elements, ``layout`` a :class:`Layout` (``TypeError``)."""
    if not isinstance(layout, Layout):
        raise TypeError(f"layout must be a terngrad.quantize.Layout, got {type(layout).__name__}")
    values = check_gradient(flat)
    if values.numel() != layout.numel:
        raise ValueError(
            f"the gradient has {values.numel()} elements, its layout {layout.numel}: "
            "pass Layout.of(grad.numel(), segments, bucket_size)"
        )
    return values


def check_digits(name: str, digits: torch.Tensor, levels: int) -> None:
    """A clear error if a message of method ``name`` holds a digit beyond its ``levels``
    (a corrupted payload: a 2-bit field can hold 3 in a message of 3 levels)."""
    if digits.numel() and int(digits.max()) >= levels:
        raise ValueError(
            f"{name} message has a digit {int(digits.max())} beyond its {levels} levels "
            "(corrupted payload)"
        )


def corrupted(name: str, field: str, detail: str) -> ValueError:
    """The one-line error of a message of method ``name`` whose ``field`` contradicts the
    method or the rest of the message."""
    return ValueError(
        f"{name} message: bad {field}: {detail} (a corrupted or forged message: discard it; "
        "decode only what terngrad's encode wrote)"
    )


def _sizes(value: Any, name: str, field: str) -> tuple[int, ...]:
    """A tuple of torch sizes (integers in [0, 2**63)), or :func:`corrupted`."""
    sizes = tuple(value) if isinstance(value, Sequence) else None
    if sizes is None or any(
        isinstance(n, bool) or not isinstance(n, int) or not 0 <= n < 2**63 for n in sizes
    ):
        raise corrupted(name, field, f"{value!r} is not a tuple of sizes")
    return sizes


class MessageRules(Protocol):
    """What :func:`check_message` asks of the method that decodes a message (a
    :class:`~terngrad.quantize.base.Quantizer`, which imports this module)."""

    @property
    def name(self) -> str: ...

    @property
    def codec(self) -> Codec: ...

    @property
    def nonnegative_scales(self) -> bool: ...

    def _message_levels_problem(self, levels: int) -> str | None: ...

    def _scales_per_bucket(self, levels: int) -> int: ...


class MessageFields(Protocol):
    """What :func:`check_message` reads of a message (an :class:`~terngrad.quantize.base.
    Encoded`, whose module imports this one): its fields as a forged message may hold them —
    anything, checked one by one — and the layout they give."""

    @property
    def levels(self) -> Any: ...

    @property
    def codec(self) -> Any: ...

    @property
    def shape(self) -> Any: ...

    @property
    def segments(self) -> Any: ...

    @property
    def bucket_size(self) -> Any: ...

    @property
    def payload(self) -> Any: ...

    @property
    def scales(self) -> Any: ...

    @property
    def layout(self) -> Layout: ...


def check_message(q: MessageRules, message: MessageFields) -> Layout:
    """Every field of ``message`` against ``q`` and the others, before a decode allocates or
    reads anything: the levels the method can have, a codec of its kind (floats, or digits
    enough for the levels; the digits themselves are checked as they are unpacked), the shape,
    bucket size and segments, a payload of exactly the codec's length for the shape (so a
    forged shape allocates nothing), the number of scales the layout needs, and finite scales
    (non-negative where the method's scales are magnitudes). One :func:`corrupted` error names
    the first field that is wrong; O(header + scales). Returns the message's layout."""
    name = q.name
    levels, codec = message.levels, message.codec
    if isinstance(levels, bool) or not isinstance(levels, int):
        raise corrupted(name, "levels", f"{levels!r} is not an integer")
    problem = q._message_levels_problem(levels)
    if problem:
        raise corrupted(name, "levels", problem)
    if not isinstance(codec, Codec):
        raise corrupted(name, "codec", f"{codec!r} is not a Codec")
    if q.codec.is_float and codec != q.codec:
        raise corrupted(name, "codec", f"it packs {codec} where {name} packs {q.codec} floats")
    if codec.is_float and not q.codec.is_float:
        raise corrupted(name, "codec", f"it packs {codec} floats where it packs digits")
    if codec.capacity and codec.capacity < levels:
        raise corrupted(name, "codec", f"{codec} holds {codec.capacity} digits, not {levels}")
    shape = _sizes(message.shape, name, "shape")
    segments = _sizes(message.segments, name, "segments")
    numel = math.prod(shape)
    if segments and sum(segments) != numel:
        raise corrupted(name, "segments", f"they sum to {sum(segments)}, its shape holds {numel}")
    bucket = message.bucket_size
    if isinstance(bucket, bool) or not isinstance(bucket, int) or not 0 <= bucket < 2**32:
        raise corrupted(name, "bucket_size", f"{bucket!r} is not an integer in [0, 2**32)")
    payload, scales = message.payload, message.scales
    if not isinstance(payload, torch.Tensor) or not isinstance(scales, torch.Tensor):
        raise TypeError(f"{name} message: payload and scales must be torch.Tensors")
    if payload.dtype != torch.uint8 or payload.numel() != codec.nbytes(numel):
        raise corrupted(
            name, "payload",
            f"{numel} elements in {codec} take {codec.nbytes(numel)} uint8 bytes, got "
            f"{payload.numel()} of {payload.dtype}",
        )  # fmt: skip
    layout = message.layout
    need = layout.n_buckets * q._scales_per_bucket(levels)
    if scales.numel() != need or not scales.dtype.is_floating_point:
        raise corrupted(
            name, "n_scales",
            f"a message of {numel} elements in {layout.n_buckets} buckets needs {need} scales, "
            f"got {scales.numel()} of {scales.dtype}",
        )  # fmt: skip
    check_scales(scales, f"{name} message")
    if q.nonnegative_scales and need and float(scales.min()) < 0:
        low = float(scales.min())
        raise corrupted(name, "scales", f"a scale of {low:.4g} where {name}'s are >= 0")
    return layout


def check_bucket_size(bucket_size: Any) -> int | None:
    """``None`` (one bucket per tensor) or a positive integer below 2**32."""
    if bucket_size is None:
        return None
    if (
        isinstance(bucket_size, bool)
        or not isinstance(bucket_size, int)
        or not (1 <= bucket_size < 2**32)
    ):
        raise ValueError(f"bucket_size must be None or a positive integer, got {bucket_size!r}")
    return bucket_size


def check_levels(levels: Any, name: str) -> int:
    """A number of distinct values: an integer in [2, 65535]."""
    if isinstance(levels, bool) or not isinstance(levels, int) or not 2 <= levels <= 65535:
        raise ValueError(
            f"{name}: levels counts the distinct quantized values and must be an integer in "
            f"[2, 65535], got {levels!r}"
        )
    return levels


def check_choice(name: str, value: Any, choices: tuple[str, ...]) -> str:
    """``value`` if it is one of ``choices``, else ``ValueError`` listing them."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}")
    return value
