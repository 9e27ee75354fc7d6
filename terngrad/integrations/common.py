"""What the framework integrations share: the local steps a callback runs, dropping a skipped
step's gradients, the warning for one process, the refusal of loss scaling, and the route of a
model the framework sharded with FSDP2's ``fully_shard`` to :func:`terngrad.fsdp.register`."""

from __future__ import annotations

import warnings
from typing import Any

from torch import nn

import terngrad.fsdp
from terngrad.comm.spec.local import LocalSteps
from terngrad.comm.spec.options import Options
from terngrad.local_steps import local_of


def callback_local(settings: dict[str, Any], **keywords: Any) -> LocalSteps | None:
    """The local steps a callback runs (``None``: the hook every step): the method's in
    ``settings`` with the ``keywords`` over it, as :class:`terngrad.diloco.DiLoCo` takes them
    (:func:`~terngrad.local_steps.local_of`), where the callback's ``H`` is 1 unless given. A
    setting of the outer step given without local steps is refused in one line."""
    local = local_of(settings, 1, **keywords)
    if local.every != 1:
        return local
    plain = LocalSteps(1).keywords()
    if local.keywords() != plain:
        name = next(k for k, v in local.keywords().items() if v != plain[k])
        raise ValueError(
            f"{name}={keywords.get(name)!r} is a setting of local steps, and the callback has "
            "none: give local_steps too (or a method with local steps), or leave it out"
        )
    return None


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


def fully_sharded(model: nn.Module) -> bool:
    """Whether the framework sharded ``model`` with FSDP2's ``fully_shard`` (some submodule is
    an ``FSDPModule``): its gradients go through FSDP's reduce-scatter, not DDP's buckets."""
    from torch.distributed.fsdp import FSDPModule

    return any(isinstance(m, FSDPModule) for m in model.modules())


def register_sharded(model: nn.Module, options: Options | None,
                     local: LocalSteps | None) -> terngrad.fsdp.State:  # fmt: skip
    """TernGrad as the reduce-scatter of every FSDP module of ``model``, which the framework
    ``fully_shard``-ed (:func:`terngrad.fsdp.register`, with the callback's ``options``; None:
    the defaults). Local steps are refused first, before any collective: they average whole
    replicas, and FSDP keeps none."""
    if local is not None:
        raise ValueError(
            "terngrad: local steps average whole replicas, and FSDP shards the model: give "
            "TernGradCallback no local_steps with FSDP, or train through DDP"
        )
    return terngrad.fsdp.register(model, options or Options())
