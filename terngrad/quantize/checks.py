"""The checks every quantizer runs on its input and on the messages it decodes, each with an
error that says what is wrong and what to do."""

from __future__ import annotations

from typing import Any

import torch


def flat_gradient(grad: Any) -> torch.Tensor:
    """The gradient as a flat, contiguous float32 tensor (no copy if it is one already); a
    clear error for anything that is not a floating-point tensor."""
    if not isinstance(grad, torch.Tensor):
        raise TypeError(f"gradient must be a torch.Tensor, got {type(grad).__name__}")
    if not grad.dtype.is_floating_point:
        raise ValueError(
            f"gradient must be a floating-point tensor (float32, float16, bfloat16, float64), "
            f"got {grad.dtype}"
        )
    return grad.detach().reshape(-1).to(torch.float32).contiguous()


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


def check_digits(name: str, digits: torch.Tensor, levels: int) -> None:
    """A clear error if a message of method ``name`` holds a digit beyond its ``levels``
    (a corrupted payload: a 2-bit field can hold 3 in a message of 3 levels)."""
    if digits.numel() and int(digits.max()) >= levels:
        raise ValueError(
            f"{name} message has a digit {int(digits.max())} beyond its {levels} levels "
            "(corrupted payload)"
        )


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
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}")
    return value
