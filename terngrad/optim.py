"""AdamW whose variance freezes after a warm-up, so that the DDP hook can exchange its momentum,
compressed, instead of the gradient: 1-bit Adam's recipe (Tang et al., ICML 2021) with TernGrad
in place of the sign.

Why not plain AdamW over a compressed gradient: Adam divides by ``sqrt(v)``, ``v`` the running
mean of ``g^2``; a quantized gradient ``g + n`` (unbiased noise ``n``) makes it the mean of
``g^2 + n^2`` — the noise inflates the variance, and every step shrinks, most where the noise is
largest (Tang et al., Sec. 3: error feedback cannot undo that, as ``v`` is not linear in ``g``).
Measured here: TernGrad with AdamW ends +9.9% in loss on the GPT (docs/results/transformer.md).

The remedy, two phases:

1. **Warm-up** (``warmup_steps``): AdamW as usual (decoupled weight decay, Loshchilov & Hutter
   2019; bias corrections), over whatever the hook exchanges (a full-precision warm-up:
   ``Options(full_precision_steps=...)``).
2. **Frozen variance**: ``v`` stays as the warm-up left it, and with it the denominator
   ``d = sqrt(v / (1 - beta2^W)) + eps``; the update is ``p <- p (1 - lr wd) - lr u /
   (1 - beta1^t)`` with ``u = m / d``, the *preconditioned* momentum. ``d`` is the same on every
   rank and fixed, so ``u`` is linear in the gradient: each rank may compute its own,
   ``u_i = (beta1 m + (1 - beta1) g_i) / d``, and the hook averages those, compressed with error
   feedback (:mod:`terngrad.comm.momentum`): ``u <- mean_i C(u_i + e_i)`` — the same ``u`` on
   every rank, which the optimizer receives as ``p.grad``; it keeps ``m = u d``.

   Why ``u`` and not ``m`` (1-bit Adam sends ``m``): TernGrad's noise on an element is about
   ``sqrt(s |x|)`` for a scale ``s`` (the bucket's largest ``|x|``), and Adam divides the
   momentum by ``d``, which is tiny where the warm-up saw tiny gradients: noise on ``m`` becomes
   steps of hundreds of learning rates there (measured: a 5-step warm-up then diverged at once).
   On ``u`` the scale is that of Adam's own steps, and the noise stays of their size.

Bound to a terngrad hook (``terngrad.ddp.register(ddp, optimizer=opt, ...)``), the optimizer
takes ``p.grad`` as that exchanged momentum from the step after the warm-up on; unbound (one
process, or PyTorch's own all-reduce), it computes the momentum from the gradient itself, and is
simply AdamW with a frozen variance. Its ``state_dict`` holds everything (the step, the
momentum, the frozen variance); with the hook's (residuals, generator) a resumed run is exact.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch


class FrozenVarianceAdamW(torch.optim.Optimizer):
    """AdamW for ``warmup_steps`` steps, then with its second moment frozen and its first moment
    exchanged by the terngrad hook (see the module's docstring).

    ``lr``, ``betas``, ``eps``, ``weight_decay`` as :class:`torch.optim.AdamW` (per parameter
    group); ``warmup_steps``: the steps of plain AdamW, at least 1 (the variance needs them);
    ``variance_floor``: when it freezes, each tensor's variance is raised to at least this
    fraction of its mean — an element the warm-up saw no gradient for (a ReLU unit dead then)
    would otherwise be divided by ``eps`` alone once it gets one: steps of ``1e7`` learning
    rates (measured on an MLP, 3,640 such weights out of 65,536 after a 10-step warm-up)."""

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
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
        _check_hyper(lr, betas, eps, weight_decay)
        if not (isinstance(variance_floor, int | float) and 0 <= variance_floor <= 1):
            raise ValueError(f"variance_floor must be a number in [0, 1], got {variance_floor!r}")
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay}
        super().__init__(params, defaults)
        for group in self.param_groups:
            _check_hyper(group["lr"], group["betas"], group["eps"], group["weight_decay"])
        self.warmup_steps = warmup_steps
        self.variance_floor = variance_floor
        #: set by the terngrad hook that exchanges the momentum (:meth:`bind_exchange`)
        self.momentum_exchanged = False

    # --- what the hook reads (terngrad.comm.momentum)

    def bind_exchange(self) -> None:
        """A terngrad hook exchanges this optimizer's momentum from now on: after the warm-up,
        ``p.grad`` is the averaged momentum, not a gradient."""
        self.momentum_exchanged = True

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
        """``d = sqrt(max(v, floor mean(v)) / (1 - beta2^W)) + eps`` of the variance the warm-up
        left (made once)."""
        if "denom" not in state:
            v = state["exp_avg_sq"]
            floored = torch.maximum(v, self.variance_floor * v.mean())
            correction = math.sqrt(1 - group["betas"][1] ** self.warmup_steps)
            state["denom"] = (floored.sqrt() / correction).add_(group["eps"])
        return state["denom"]

    def _group_of(self, param: torch.Tensor) -> dict[str, Any] | None:
        if not hasattr(self, "_groups_by_param"):
            self._groups_by_param = {id(p): g for g in self.param_groups for p in g["params"]}
        return self._groups_by_param.get(id(param))

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)
        self.__dict__.pop("_groups_by_param", None)

    def state_dict(self) -> dict[str, Any]:
        saved = super().state_dict()
        saved["warmup_steps"] = self.warmup_steps
        return saved

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state_dict = dict(state_dict)
        warmup = state_dict.pop("warmup_steps", self.warmup_steps)
        if warmup != self.warmup_steps:
            raise ValueError(
                f"this state was saved with warmup_steps={warmup}, and this optimizer has "
                f"{self.warmup_steps}: resume with the same warm-up"
            )
        super().load_state_dict(state_dict)
        self.__dict__.pop("_groups_by_param", None)  # the groups are new dicts now

    # --- the step

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        """One update of every parameter with a gradient (see the class's docstring)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            lr, eps, decay = group["lr"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("FrozenVarianceAdamW does not take sparse gradients")
                state = self.state[p]
                if not state:
                    state["step"] = torch.tensor(0.0)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                warm = int(state["step"]) < self.warmup_steps
                state["step"] = state["step"] + 1  # a new tensor: a loaded state may share it
                t = int(state["step"])
                m, v, g = state["exp_avg"], state["exp_avg_sq"], p.grad
                p.mul_(1 - lr * decay)
                if warm:  # AdamW
                    m.lerp_(g, 1 - beta1)
                    v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
                    denom = (v.sqrt() / math.sqrt(1 - beta2**t)).add_(eps)
                    p.addcdiv_(m, denom, value=-lr / (1 - beta1**t))
                elif self.momentum_exchanged:  # g: the u = m / d every rank agreed on
                    m.copy_(g).mul_(self._frozen_denominator(state, group))
                    p.add_(g, alpha=-lr / (1 - beta1**t))
                else:
                    m.lerp_(g, 1 - beta1)
                    p.addcdiv_(
                        m, self._frozen_denominator(state, group), value=-lr / (1 - beta1**t)
                    )
        return loss


def _check_hyper(lr: Any, betas: Any, eps: Any, weight_decay: Any) -> None:
    """AdamW's own checks, as one-line ``ValueError``s."""
    if not (isinstance(lr, int | float) and math.isfinite(lr) and lr >= 0):
        raise ValueError(f"lr must be a finite number >= 0, got {lr!r}")
    if not (
        isinstance(betas, tuple | list)
        and len(betas) == 2
        and all(isinstance(b, int | float) and 0 <= b < 1 for b in betas)
    ):
        raise ValueError(f"betas must be two numbers in [0, 1), got {betas!r}")
    if not (isinstance(eps, int | float) and math.isfinite(eps) and eps > 0):
        raise ValueError(f"eps must be a finite number > 0, got {eps!r}")
    if not (isinstance(weight_decay, int | float) and math.isfinite(weight_decay)):
        raise ValueError(f"weight_decay must be a finite number, got {weight_decay!r}")


__all__ = ["FrozenVarianceAdamW"]
