"""What the framework integrations share: dropping a skipped step's gradients, the warning for
one process, and the refusal of loss scaling."""

from __future__ import annotations

import warnings
from typing import Any


def drop_gradients(optimizer: Any) -> None:
    """Make the coming ``optimizer.step()`` a no-op, for a step terngrad skipped (a NaN or Inf
    gradient on some rank, zeroed on every rank): every torch optimizer leaves a parameter
    without a gradient alone — no update, no momentum, no weight decay — on every rank alike."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            p.grad = None


def warn_one_process(stacklevel: int = 3) -> None:
    """One process has nothing to exchange: say that the hook is not used."""
    warnings.warn(
        "terngrad: one process, nothing to exchange: the terngrad hook is not used",
        RuntimeWarning,
        stacklevel=stacklevel,
    )


def loss_scaling_refused(setting: str, instead: str) -> RuntimeError:
    """The error for a framework setting (``setting``) that scales the loss with a GradScaler;
    ``instead`` names what to use."""
    return RuntimeError(
        f"terngrad: {setting} scales the loss with a GradScaler, which lowers its scale only "
        "when it sees an Inf gradient; terngrad zeroes a step whose gradient is not finite on "
        f"some rank, so the scaler would never see one. Use {instead} with terngrad"
    )
