"""The preconditioned momentum exchanged in place of the gradient (1-bit Adam's scheme, Tang et
al., ICML 2021, Algorithm 1, with TernGrad's compression, and the momentum divided by the frozen
denominator): for an optimizer whose variance is frozen — :class:`terngrad.optim.
FrozenVarianceAdamW` after its warm-up — each rank turns its gradient ``g_i`` into
``u_i = (beta1 m + (1 - beta1) g_i) / d`` (``m``: the momentum all ranks agreed on at the last
step; ``d``: Adam's frozen denominator, the same on every rank) before the bucket is exchanged;
the exchange (with error feedback, ``Options(error_feedback=True)``) then averages the ``u_i``,
and the optimizer steps along the average. As ``u_i`` is linear in ``g_i``, the average of the
uncompressed ``u_i`` is exactly the preconditioned momentum of the averaged gradient.

An optimizer that measures its variance on each rank (:class:`terngrad.optim.
LocalVarianceAdamW`, a :class:`VarianceSource`) also has the hook keep, per rank, the running
means of that rank's own gradient and of its squares, ``m_i <- beta1 m_i + (1 - beta1) g_i``
and ``v_i <- beta2 v_i + (1 - beta2) g_i^2`` (:class:`LocalVariance`, before ``g_i`` becomes
``u_i``), and average them over the ranks at the steps the optimizer names: one counted
all-reduce of the bucket's ``v_i`` and ``m_i`` (in the optimizer's ``share_dtype``), from whose
means the optimizer makes its denominator before this step's ``u_i`` are formed.

The optimizer is duck-typed (:class:`MomentumSource`, :class:`VarianceSource`): this layer
imports nothing above it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import torch

from terngrad.comm.exchanges.link import Link
from terngrad.comm.rank import saved_state


@runtime_checkable
class MomentumSource(Protocol):
    """An optimizer whose momentum a hook may exchange."""

    def bind_exchange(self) -> None:
        """From now on ``p.grad`` holds the exchanged momentum after the warm-up."""

    def exchanged_momentum(
        self, param: torch.Tensor
    ) -> tuple[torch.Tensor, float, torch.Tensor] | None:
        """``(m, beta1, d)`` if this step exchanges ``param``'s momentum, else ``None``."""


@runtime_checkable
class VarianceSource(Protocol):
    """An optimizer whose variance each rank measures from its own gradient, averaged over the
    ranks at the steps it names."""

    def local_variance(self, param: torch.Tensor) -> tuple[float, float, bool] | None:
        """``(beta1, beta2, due)``: the decays of the running means of the gradient and of its
        squares, and whether the ranks average them at the step now being exchanged; ``None``
        for a tensor it does not update."""

    def share_variance(
        self, param: torch.Tensor, variance: torch.Tensor, momentum: torch.Tensor, ranks: int
    ) -> None:
        """The means over ``ranks`` ranks of their running means of ``param``'s gradient's
        squares and of the gradient, at the step now being exchanged."""

    #: the dtype the ranks' variances are averaged in
    share_dtype: torch.dtype


class LocalVariance:
    """This rank's running means of its own gradients and of their squares, by parameter name,
    and their averages over the ranks when they are due (see the module's docstring). Its state
    is the rank's own: save it with the rank's hook state."""

    def __init__(self, source: VarianceSource, names: Mapping[int, str]) -> None:
        self.source = source
        self.names = names  # id(param) -> its name, the key of the saved state
        self.variances: dict[str, torch.Tensor] = {}
        self.momenta: dict[str, torch.Tensor] = {}

    def observe(self, params: Sequence[torch.Tensor], buffer: torch.Tensor, link: Link) -> None:
        """Fold the gradients in a DDP bucket's flat ``buffer`` (the ``params``' in order) into
        this rank's running means (nothing if the bucket holds a non-finite value: the step is
        skipped on every rank); where the source says it is due, average the bucket's means
        over the ranks (one all-reduce, counted by ``link``) and hand them to the source."""
        due: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        finite = bool(torch.isfinite(buffer).all())
        offset = 0
        for p in params:
            n = p.numel()
            found = self.source.local_variance(p)
            if found is not None:
                beta1, beta2, sync = found
                g = buffer[offset : offset + n]
                name = self.names[id(p)]
                if name not in self.variances:
                    self.variances[name] = torch.zeros(n, dtype=torch.float32, device=g.device)
                    self.momenta[name] = torch.zeros(n, dtype=torch.float32, device=g.device)
                v, m = self.variances[name], self.momenta[name]
                if finite:
                    v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
                    m.lerp_(g.to(torch.float32), 1 - beta1)
                if sync:
                    due.append((p, v, m))
            offset += n
        if not due:
            return
        flat = torch.cat([t for _, v, m in due for t in (v, m)]).to(self.source.share_dtype)
        flat = link.all_reduce(flat).to(torch.float32).div_(link.size)
        means = flat.split([t.numel() for _, v, m in due for t in (v, m)])
        for k, (p, _, _) in enumerate(due):
            self.source.share_variance(p, means[2 * k], means[2 * k + 1], link.size)

    def state_dict(self) -> dict[str, dict[str, torch.Tensor]]:
        return {
            "variances": {name: v.clone() for name, v in self.variances.items()},
            "momenta": {name: m.clone() for name, m in self.momenta.items()},
        }

    def load_state_dict(
        self,
        state: Mapping[str, Mapping[str, torch.Tensor]],
        sizes: Mapping[str, int] | None = None,
    ) -> None:
        """Restore :meth:`state_dict` (``sizes``: the parameters' elements by name, to check the
        tensors against)."""
        check_local_variance(state, sizes)
        self.variances = {n: v.clone().to(torch.float32) for n, v in state["variances"].items()}
        self.momenta = {n: m.clone().to(torch.float32) for n, m in state["momenta"].items()}


def check_local_variance(state: Any, sizes: Mapping[str, int] | None = None) -> None:
    """Refuse, in one ``ValueError`` line, what is not a :meth:`LocalVariance.state_dict`: two
    dicts of float tensors by parameter name (with ``sizes``, each flat of that many
    elements)."""
    kind = "terngrad local-variance state"
    if not isinstance(state, Mapping) or set(state) != {"variances", "momenta"}:
        raise ValueError(f"not a {kind} (variances and momenta)")
    for key in ("variances", "momenta"):
        saved_state.tensors(state[key], key, kind, sizes)


def check_local_variance_entry(
    state: dict[str, Any], expected: bool, sizes: Mapping[str, int] | None
) -> None:
    """``state``'s local variance, if any: there exactly when the hook has one (``expected``:
    its optimizer measures the variance on each rank), of the form
    :meth:`LocalVariance.state_dict` saves."""
    saved = state.get("local_variance")
    if (saved is None) == expected:
        raise ValueError(
            "this hook state was saved "
            + ("without" if saved is None else "with")
            + " a variance measured on each rank (LocalVarianceAdamW), and this State has "
            + ("one" if saved is None else "none")
            + ": resume with the same optimizer"
        )
    if saved is not None:
        check_local_variance(saved, sizes)


def check_source(optimizer: Any) -> MomentumSource:
    """``optimizer`` if it can have its momentum exchanged, else ``TypeError`` saying which can."""
    if not isinstance(optimizer, MomentumSource):
        raise TypeError(
            f"optimizer={type(optimizer).__name__}: the hook exchanges the momentum of an "
            "optimizer built for it, terngrad.optim.FrozenVarianceAdamW or LocalVarianceAdamW; "
            "any other optimizer takes the averaged gradient as usual (leave optimizer= out)"
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
