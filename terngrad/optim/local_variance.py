"""AdamW whose preconditioned momentum is exchanged and whose variance is each rank's own,
averaged over the ranks every so often (:mod:`terngrad.optim`)."""

from __future__ import annotations

from typing import Any

import torch

from terngrad.optim.momentum_adamw import MomentumExchangedAdamW, Params


class LocalVarianceAdamW(MomentumExchangedAdamW):
    """AdamW whose momentum the terngrad hook exchanges, compressed, from the first step, and
    whose variance each rank measures from its own gradient; the ranks average their variances
    at the steps :meth:`syncs_at` names (see the module's docstring).

    ``lr``, ``betas``, ``eps``, ``weight_decay`` as :class:`torch.optim.AdamW` (per parameter
    group). ``sync_every`` (K): the ranks average their variances, and ``d`` is made anew, at
    steps 1, 2, 4, ... below K (the variance moves fastest early, as in 0/1 Adam's schedule,
    Lu et al., ICLR 2023) and at every K-th step; each is one all-reduce of twice the parameters
    in ``share_dtype``: bfloat16 by default, an fp32 step's bytes, about ``2 / K`` of an fp32
    run's over a long run. (bfloat16 has float32's range, which squared gradients need, fp16's
    would flush them to zero; its 8 significant bits give ``d`` to 0.2%.)
    ``variance_floor``: see :class:`MomentumExchangedAdamW`.

    Bound to the hook, the hook keeps each rank's ``v_i`` and ``m_i`` and hands their means over
    the ranks to :meth:`share_variance`; unbound, the optimizer keeps ``v`` of its own gradient
    (one process: AdamW whose denominator is made anew at those steps only)."""

    _resume_setting = ("sync_every", "the same schedule")

    def __init__(
        self,
        params: Params,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        *,
        sync_every: int = 100,
        share_dtype: torch.dtype = torch.bfloat16,
        variance_floor: float = 0.01,
    ) -> None:
        if isinstance(sync_every, bool) or not isinstance(sync_every, int) or sync_every < 1:
            raise ValueError(
                f"sync_every must be an integer of at least 1 (the steps between the ranks' "
                f"averages of their variances), got {sync_every!r}"
            )
        if share_dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(
                f"share_dtype must be torch.float32 or torch.bfloat16 (float32's range: squared "
                f"gradients underflow in float16), got {share_dtype!r}"
            )
        super().__init__(params, lr, betas, eps, weight_decay, variance_floor)
        self.sync_every = sync_every
        #: the dtype the ranks' variances are averaged in (read by the hook)
        self.share_dtype = share_dtype

    def syncs_at(self, step: int) -> bool:
        """Whether the ranks average their variances at ``step`` (counted from 1)."""
        if step < self.sync_every:
            return step & (step - 1) == 0  # a power of two
        return step % self.sync_every == 0

    # --- what the hook reads and gives (terngrad.comm.rank.momentum)

    def exchanged_momentum(
        self, param: torch.Tensor
    ) -> tuple[torch.Tensor, float, torch.Tensor] | None:
        """``(m, beta1, d)`` for ``param`` (every step: each rank then sends ``u_i = (beta1 m +
        (1 - beta1) g_i) / d``); ``None`` for a tensor this optimizer does not update."""
        group = self._group_of(param)
        if group is None:
            return None
        state = self._new_state(param)
        if "denom" not in state:
            raise RuntimeError(
                "LocalVarianceAdamW: no variance was shared before its momentum was exchanged; "
                "the hook must be made with this optimizer (terngrad.ddp.register(ddp, "
                "optimizer=opt)) before the first backward pass"
            )
        return state["exp_avg"], group["betas"][0], state["denom"]

    def local_variance(self, param: torch.Tensor) -> tuple[float, float, bool] | None:
        """``(beta1, beta2, due)`` for ``param``: the decays of each rank's running means of its
        own gradient and of its squares, and whether the ranks average those at the step now
        being exchanged; ``None`` for a tensor this optimizer does not update."""
        group = self._group_of(param)
        if group is None:
            return None
        beta1, beta2 = group["betas"]
        return beta1, beta2, self.syncs_at(int(self._new_state(param)["step"]) + 1)

    def share_variance(
        self, param: torch.Tensor, variance: torch.Tensor, momentum: torch.Tensor, ranks: int
    ) -> None:
        """The means over ``ranks`` ranks of their running ``variance`` (``v_i``) and
        ``momentum`` (``m_i``) of ``param`` at the step now being exchanged: ``d`` is made anew
        from ``mean(v_i) / N + (1 - 1 / N) M^2``, each bias-corrected (the class's docstring)."""
        group = self._group_of(param)
        assert group is not None
        beta1, beta2 = group["betas"]
        state = self._new_state(param)
        t = int(state["step"]) + 1
        v = variance.reshape(param.shape)
        if ranks > 1:  # in v's uncorrected units: M_hat^2 (1 - beta2^t)
            m = momentum.reshape(param.shape)
            scale = (1 - 1 / ranks) * (1 - beta2**t) / (1 - beta1**t) ** 2
            v = (v / ranks).addcmul_(m, m, value=scale)
        state["denom"] = self._denominator(v, group, t)

    # --- the step

    def _update(self, p: torch.Tensor, group: dict[str, Any]) -> None:
        state = self._new_state(p)
        if self.momentum_exchanged:
            if "denom" not in state:
                self.exchanged_momentum(p)  # raises, saying why
            t = self._advance(state)
            p.mul_(1 - group["lr"] * group["weight_decay"])
            self._step_along_exchanged(p, state, group, state["denom"], t)
            return
        beta1, beta2 = group["betas"]
        if "exp_avg_sq" not in state:
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        v, g = state["exp_avg_sq"], p.grad
        v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        if self.syncs_at(int(state["step"]) + 1):
            self.share_variance(p, v, state["exp_avg"], ranks=1)
        t = self._advance(state)
        p.mul_(1 - group["lr"] * group["weight_decay"])
        state["exp_avg"].lerp_(g, 1 - beta1)
        p.addcdiv_(state["exp_avg"], state["denom"], value=-group["lr"] / (1 - beta1**t))
