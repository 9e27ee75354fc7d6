"""The preconditioned momentum exchanged in place of the gradient (1-bit Adam's scheme, Tang et
al., ICML 2021, Algorithm 1, with TernGrad's compression, and the momentum divided by the frozen
denominator): for an optimizer whose variance is frozen — :class:`terngrad.optim.
FrozenVarianceAdamW` after its warm-up — each rank turns its gradient ``g_i`` into
``u_i = (beta1 m + (1 - beta1) g_i) / d`` (``m``: the momentum all ranks agreed on at the last
step; ``d``: Adam's frozen denominator, the same on every rank) before the bucket is exchanged;
the exchange (with error feedback, ``Options(error_feedback=True)``) then averages the ``u_i``,
and the optimizer steps along the average. As ``u_i`` is linear in ``g_i``, the average of the
uncompressed ``u_i`` is exactly the preconditioned momentum of the averaged gradient.

The optimizer is duck-typed (:class:`MomentumSource`): this layer imports nothing above it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import torch


@runtime_checkable
class MomentumSource(Protocol):
    """An optimizer whose momentum a hook may exchange."""

    def bind_exchange(self) -> None:
        """From now on ``p.grad`` holds the exchanged momentum after the warm-up."""

    def exchanged_momentum(
        self, param: torch.Tensor
    ) -> tuple[torch.Tensor, float, torch.Tensor] | None:
        """``(m, beta1, d)`` if this step exchanges ``param``'s momentum, else ``None``."""


def check_source(optimizer: Any) -> MomentumSource:
    """``optimizer`` if it can have its momentum exchanged, else ``TypeError`` saying which can."""
    if not isinstance(optimizer, MomentumSource):
        raise TypeError(
            f"optimizer={type(optimizer).__name__}: the hook exchanges the momentum of an "
            "optimizer that freezes its variance, terngrad.optim.FrozenVarianceAdamW; any other "
            "optimizer takes the averaged gradient as usual (leave optimizer= out)"
        )
    return optimizer


def to_local_momentum(
    source: MomentumSource, params: Sequence[torch.Tensor], buffer: torch.Tensor
) -> None:
    """Turn the gradients in a DDP bucket's flat ``buffer`` (the ``params``' in order) into this
    rank's preconditioned momenta, in place: ``g <- (g + beta1 (m - g)) / d`` for each parameter
    whose momentum is exchanged this step; the others' gradients are left as they are."""
    offset = 0
    for p in params:
        n = p.numel()
        found = source.exchanged_momentum(p)
        if found is not None:
            momentum, beta1, denominator = found
            part = buffer[offset : offset + n]
            part.lerp_(momentum.reshape(-1), beta1).div_(denominator.reshape(-1))
        offset += n
