"""AdamW over whatever the hook exchanges for a warm-up, then its variance frozen and its
preconditioned momentum exchanged: 1-bit Adam's recipe (:mod:`terngrad.optim`)."""

from __future__ import annotations

import math
from typing import Any

import torch

from terngrad.optim.momentum_adamw import MomentumExchangedAdamW, Params


class FrozenVarianceAdamW(MomentumExchangedAdamW):
    """AdamW for ``warmup_steps`` steps, then with its second moment frozen and its first moment
    exchanged by the terngrad hook (see the module's docstring).

    ``lr``, ``betas``, ``eps``, ``weight_decay`` as :class:`torch.optim.AdamW` (per parameter
    group); ``warmup_steps``: the steps of plain AdamW, at least 1 (the variance needs them);
    ``variance_floor``: see :class:`MomentumExchangedAdamW`."""

    _resume_setting = ("warmup_steps", "the same warm-up")

    def __init__(
        self,
        params: Params,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        *,
        warmup_steps: int,
        variance_floor: float = 0.01,
    ) -> None:
        if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 1:
            raise ValueError(
                f"warmup_steps must be an integer of at least 1 (the steps that measure the "
                f"variance before it freezes), got {warmup_steps!r}"
            )
        super().__init__(params, lr, betas, eps, weight_decay, variance_floor)
        self.warmup_steps = warmup_steps

    # --- what the hook reads (terngrad.comm.rank.momentum)

    def exchanged_momentum(
        self, param: torch.Tensor
    ) -> tuple[torch.Tensor, float, torch.Tensor] | None:
        """``(m, beta1, d)`` for ``param`` if the step now being exchanged is past the warm-up
        (each rank then sends ``u_i = (beta1 m + (1 - beta1) g_i) / d``), else ``None`` (the
        gradient itself is sent). ``None`` for a tensor this optimizer does not update."""
        group = self._group_of(param)
        if group is None:
            return None
        state = self.state[param]
        if not state or int(state["step"]) < self.warmup_steps:
            return None
        return state["exp_avg"], group["betas"][0], self._frozen_denominator(state, group)

    def _frozen_denominator(self, state: dict[str, Any], group: dict[str, Any]) -> torch.Tensor:
        """``d`` of the variance the warm-up left (made once)."""
        if "denom" not in state:
            state["denom"] = self._denominator(state["exp_avg_sq"], group, self.warmup_steps)
        return state["denom"]

    # --- the step

    def _update(self, p: torch.Tensor, group: dict[str, Any]) -> None:
        beta1, beta2 = group["betas"]
        state = self._new_state(p)
        if "exp_avg_sq" not in state:
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        warm = int(state["step"]) < self.warmup_steps
        t = self._advance(state)
        m, v, g = state["exp_avg"], state["exp_avg_sq"], p.grad
        p.mul_(1 - group["lr"] * group["weight_decay"])
        if warm:  # AdamW
            m.lerp_(g, 1 - beta1)
            v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
            denom = (v.sqrt() / math.sqrt(1 - beta2**t)).add_(group["eps"])
            p.addcdiv_(m, denom, value=-group["lr"] / (1 - beta1**t))
        elif self.momentum_exchanged:
            self._step_along_exchanged(p, state, group, self._frozen_denominator(state, group), t)
        else:
            m.lerp_(g, 1 - beta1)
            p.addcdiv_(
                m, self._frozen_denominator(state, group), value=-group["lr"] / (1 - beta1**t)
            )
