"""AdamW for the terngrad hook to exchange the *momentum* of, compressed, instead of the gradient:
1-bit Adam's recipe (Tang et al., ICML 2021) with TernGrad in place of the sign, in two forms.

Why not plain AdamW over a compressed gradient: Adam divides by ``sqrt(v)``, ``v`` the running
mean of ``g^2``; a quantized gradient ``g + n`` (unbiased noise ``n``) makes it the mean of
``g^2 + n^2`` — the noise inflates the variance, and every step shrinks, most where the noise is
largest (Tang et al., Sec. 3: error feedback cannot undo that, as ``v`` is not linear in ``g``).
TernGrad's noise on an element is ``s |g| - g^2`` (``s`` the bucket's scale), so an element
whose gradient is small beside its bucket's largest sees ``v`` inflated by ``s / |g|``.
Measured here: TernGrad with AdamW ends +5.1% in loss on the GPT (docs/results/transformer.md).

Both forms step alike once the momentum is exchanged. With a denominator ``d`` that is the same
on every rank and fixed within the step, ``u = m / d`` (the *preconditioned* momentum) is linear
in the gradient: each rank computes its own ``u_i = (beta1 m + (1 - beta1) g_i) / d``, and the
hook averages those, compressed with error feedback (:mod:`terngrad.comm.momentum`):
``u <- mean_i C(u_i + e_i)`` — the same ``u`` on every rank, which the optimizer receives as
``p.grad``; it keeps ``m = u d`` and steps ``p <- p (1 - lr wd) - lr u / (1 - beta1^t)``.

Why ``u`` and not ``m`` (1-bit Adam sends ``m``): TernGrad's noise on an element is about
``sqrt(s |x|)`` for a scale ``s`` (the bucket's largest ``|x|``), and Adam divides the momentum by
``d``, which is tiny where the variance is tiny: noise on ``m`` becomes steps of hundreds of
learning rates there (measured: a 5-step warm-up then diverged at once). On ``u`` the scale is
that of Adam's own steps, and the noise stays of their size.

The two forms differ in where ``d`` comes from:

* :class:`FrozenVarianceAdamW` (1-bit Adam): AdamW over whatever the hook exchanges for
  ``warmup_steps``, then ``v`` frozen. Measured on the GPT (1,000 steps, 3 seeds): +42% in loss,
  its frozen ``v`` about ten times AdamW's own — early gradients, and the warm-up's compression
  noise, frozen in.
* :class:`LocalVarianceAdamW`: each rank keeps ``v_i`` and ``m_i``, the running means of its
  *own* gradient's squares and of the gradient itself, which are exact and cost no bytes (the
  hook keeps them, as it sees each rank's gradient before it turns it into a momentum); every
  so often the ranks average them (one all-reduce) and ``d`` is made anew. No compression noise
  enters ``v``, and ``v`` follows training instead of freezing.

  ``v_i`` alone would not do: it is the second moment of one rank's batch, ``mu^2 + N sigma^2``
  for a gradient of mean ``mu`` whose global batch has noise variance ``sigma^2``, where AdamW
  divides by ``mu^2 + sigma^2``: in the noise-dominated elements its steps would be ``sqrt(N)``
  times shorter (measured on gpt-small, 4 ranks, no compression: +3.2% in loss at step 200).
  The mean of the ranks' momenta ``M`` estimates ``mu`` with ``1 / N`` of a rank's noise (and
  ``(1 - beta1) / (1 + beta1)`` of that again), so the global batch's second moment is
  estimated by ``v = mean(v_i) / N + (1 - 1 / N) M^2`` (bias-corrected each): ``mu^2 + sigma^2``
  up to terms of ``sigma^2 / (19 N)``. Measured the same way: -0.8% against AdamW at step 200.

Bound to a terngrad hook (``terngrad.ddp.register(ddp, optimizer=opt, ...)``), the optimizer
takes ``p.grad`` as the exchanged momentum; unbound (one process, or PyTorch's own all-reduce),
it computes the momentum and the variance from the gradient itself. Its ``state_dict`` holds
everything the ranks share (the step, the momentum, the variance or denominator); each rank's
own (error-feedback residuals, the local variance, the generator) is in the hook's state, so a
resumed run is exact.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch

Params = Iterable[torch.Tensor] | Iterable[dict[str, Any]]


class _MomentumExchangedAdamW(torch.optim.Optimizer):
    """What both forms share: the hyper-parameters, the binding to a hook, the denominator
    ``d = sqrt(max(v, floor mean(v)) / (1 - beta2^t)) + eps`` and the step along an exchanged
    ``u``.

    ``variance_floor``: when ``d`` is made, each tensor's variance is raised to at least this
    fraction of its mean — an element the variance saw no gradient for (a ReLU unit dead then)
    would otherwise be divided by ``eps`` alone once it gets one: steps of ``1e7`` learning rates
    (measured on an MLP, 3,640 such weights out of 65,536 after a 10-step warm-up)."""

    def __init__(self, params: Params, lr: float, betas: tuple[float, float], eps: float,
                 weight_decay: float, variance_floor: float) -> None:  # fmt: skip
        _check_hyper(lr, betas, eps, weight_decay)
        if not (isinstance(variance_floor, int | float) and 0 <= variance_floor <= 1):
            raise ValueError(f"variance_floor must be a number in [0, 1], got {variance_floor!r}")
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay}
        super().__init__(params, defaults)  # each group through add_param_group: checked there
        self.variance_floor = variance_floor
        #: set by the terngrad hook that exchanges the momentum (:meth:`bind_exchange`)
        self.momentum_exchanged = False

    def bind_exchange(self) -> None:
        """A terngrad hook exchanges this optimizer's momentum from now on: once the momentum
        is exchanged, ``p.grad`` is the averaged ``u``, not a gradient."""
        self.momentum_exchanged = True

    def _denominator(self, v: torch.Tensor, group: dict[str, Any], steps: int) -> torch.Tensor:
        """``d`` of a running mean ``v`` of ``steps`` squares (bias-corrected, floored)."""
        floored = torch.maximum(v, self.variance_floor * v.mean())
        correction = math.sqrt(1 - group["betas"][1] ** steps)
        return (floored.sqrt() / correction).add_(group["eps"])

    def _new_state(self, param: torch.Tensor) -> dict[str, Any]:
        state = self.state[param]
        if not state:
            state["step"] = torch.tensor(0.0)
            state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
        return state

    def _group_of(self, param: torch.Tensor) -> dict[str, Any] | None:
        if not hasattr(self, "_groups_by_param"):
            self._groups_by_param = {id(p): g for g in self.param_groups for p in g["params"]}
        return self._groups_by_param.get(id(param))

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """torch's, with the constructor's checks of the group's hyper-parameters."""
        if isinstance(param_group, dict):
            _check_group({**self.defaults, **param_group}, f"param group {len(self.param_groups)}")
        super().add_param_group(param_group)
        self.__dict__.pop("_groups_by_param", None)

    #: the setting a saved state must have been made with, and what to resume with otherwise
    _resume_setting: tuple[str, str]

    def state_dict(self) -> dict[str, Any]:
        saved = super().state_dict()
        name, _ = self._resume_setting
        saved[name] = getattr(self, name)
        return saved

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        name, advice = self._resume_setting
        if not isinstance(state_dict, dict):
            raise ValueError(f"not a {type(self).__name__} state: a {type(state_dict).__name__}")
        state_dict = dict(state_dict)
        mine = getattr(self, name)
        saved = state_dict.pop(name, mine)
        if saved != mine:
            raise ValueError(
                f"this state was saved with {name}={saved}, and this optimizer has {mine}: "
                f"resume with {advice}"
            )
        self._check_saved(state_dict)
        super().load_state_dict(state_dict)
        self.__dict__.pop("_groups_by_param", None)  # the groups are new dicts now

    def _check_saved(self, saved: dict[str, Any]) -> None:
        """A one-line ``ValueError`` for a saved state this optimizer cannot step from: its
        groups' hyper-parameters (loading takes them) and each parameter's tensors."""
        kind = type(self).__name__
        groups, state = saved.get("param_groups"), saved.get("state")
        if not isinstance(groups, list) or not isinstance(state, dict):
            raise ValueError(f"not a {kind} state (a dict with 'state' and 'param_groups')")
        if len(groups) != len(self.param_groups):
            raise ValueError(
                f"this {kind} state has {len(groups)} parameter groups, this optimizer "
                f"{len(self.param_groups)}"
            )
        for k, (group, mine) in enumerate(zip(groups, self.param_groups, strict=True)):
            if not isinstance(group, dict) or not isinstance(group.get("params"), list):
                raise ValueError(f"not a {kind} state: its parameter group {k} is not a group")
            if len(group["params"]) != len(mine["params"]):
                raise ValueError(
                    f"this {kind} state's parameter group {k} has {len(group['params'])} "
                    f"parameters, this optimizer's {len(mine['params'])}"
                )
            _check_group({**self.defaults, **group}, f"the saved state's param group {k}")
            for j, (key, p) in enumerate(zip(group["params"], mine["params"], strict=True)):
                _check_param_state(state.get(key), p, f"{kind} state, group {k} parameter {j}")

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        """One update of every parameter with a gradient (see the module's docstring)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError(f"{type(self).__name__} does not take sparse gradients")
                self._update(p, group)
        return loss

    def _update(self, p: torch.Tensor, group: dict[str, Any]) -> None:
        raise NotImplementedError

    @staticmethod
    def _advance(state: dict[str, Any]) -> int:
        state["step"] = state["step"] + 1  # a new tensor: a loaded state may share it
        return int(state["step"])

    @staticmethod
    def _step_along_exchanged(p: torch.Tensor, state: dict[str, Any], group: dict[str, Any],
                              denom: torch.Tensor, t: int) -> None:  # fmt: skip
        """``p.grad`` is the ``u = m / d`` every rank agreed on: ``m <- u d``, the step along
        ``u`` (weight decay already applied)."""
        state["exp_avg"].copy_(p.grad).mul_(denom)
        p.add_(p.grad, alpha=-group["lr"] / (1 - group["betas"][0] ** t))


class FrozenVarianceAdamW(_MomentumExchangedAdamW):
    """AdamW for ``warmup_steps`` steps, then with its second moment frozen and its first moment
    exchanged by the terngrad hook (see the module's docstring).

    ``lr``, ``betas``, ``eps``, ``weight_decay`` as :class:`torch.optim.AdamW` (per parameter
    group); ``warmup_steps``: the steps of plain AdamW, at least 1 (the variance needs them);
    ``variance_floor``: see :class:`_MomentumExchangedAdamW`."""

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

    # --- what the hook reads (terngrad.comm.momentum)

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


class LocalVarianceAdamW(_MomentumExchangedAdamW):
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
    ``variance_floor``: see :class:`_MomentumExchangedAdamW`.

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

    # --- what the hook reads and gives (terngrad.comm.momentum)

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


def _check_group(group: dict[str, Any], where: str) -> None:
    """:func:`_check_hyper` of a parameter group, its message starting with ``where``."""
    try:
        _check_hyper(group.get("lr"), group.get("betas"), group.get("eps"),
                     group.get("weight_decay"))  # fmt: skip
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


#: the tensors a parameter's saved state may hold, each of the parameter's shape
_PARAM_TENSORS = ("exp_avg", "exp_avg_sq", "denom")


def _check_param_state(state: Any, p: torch.Tensor, where: str) -> None:
    """A parameter's saved state: a dict whose ``step`` is a number and whose moments are
    floating-point tensors of ``p``'s shape (none saved yet: ``None``)."""
    if state is None:
        return
    if not isinstance(state, dict):
        raise ValueError(f"{where}: a {type(state).__name__}, not a dict")
    step = state.get("step")
    number = isinstance(step, int | float) or (isinstance(step, torch.Tensor) and step.numel() == 1)
    if isinstance(step, bool) or not number:
        raise ValueError(f"{where}: its step is {step!r}, not a number")
    for name in _PARAM_TENSORS:
        t = state.get(name)
        if name not in state:
            continue
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            found = t.dtype if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{where}: {name} is {found}, not a floating-point tensor")
        if t.shape != p.shape:
            raise ValueError(
                f"{where}: {name} has shape {tuple(t.shape)}, the parameter {tuple(p.shape)}"
            )


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
    if not (
        isinstance(weight_decay, int | float) and math.isfinite(weight_decay) and weight_decay >= 0
    ):
        raise ValueError(f"weight_decay must be a finite number >= 0, got {weight_decay!r}")


__all__ = ["FrozenVarianceAdamW", "LocalVarianceAdamW"]
