"""The DDP model a hook serves: whether a model can take terngrad's hook
(:func:`check_registrable`), which registered model a :class:`~terngrad.comm.front.hook.State`
serves when it was not told (:func:`registered_model`), and what is said about it (a tied last
layer, a state that was never used)."""

from __future__ import annotations

import gc
import warnings
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

DDP = nn.parallel.DistributedDataParallel

PYTHON_REDUCER = (
    "terngrad: compiled DDP with torch._dynamo.config.optimize_ddp='python_reducer' hands the "
    "hook one gradient at a time, without buckets, inside a traced graph, where terngrad's "
    "exchange (its own collectives on a worker thread) cannot run; use optimize_ddp=True (the "
    "default DDPOptimizer) or False with terngrad"
)


def check_registrable(ddp_model: nn.Module) -> None:
    """Raise unless ``ddp_model`` is a DDP model that can take the terngrad hook now."""
    if not isinstance(ddp_model, DDP):
        raise TypeError(
            "terngrad's hook goes on a torch.nn.parallel.DistributedDataParallel model, got "
            f"{type(ddp_model).__name__}: wrap it first, ddp = DistributedDataParallel(model)"
        )
    if getattr(ddp_model, "_use_python_reducer", False):
        raise RuntimeError(PYTHON_REDUCER)
    hooks = [getattr(h, "__qualname__", repr(h)) for h, _ in getattr(ddp_model, "_comm_hooks", [])]
    builtin = ddp_model._get_ddp_logging_data().get("comm_hook")  # C++ hooks are not listed
    if hooks or builtin:
        names = ", ".join(hooks or [str(builtin)])
        raise RuntimeError(
            f"this DDP model already has a communication hook ({names}); DDP takes one: make a "
            "new DistributedDataParallel to change it"
        )


def registered_model(state: Any) -> nn.Module:
    """The DDP model ``state`` was registered on (DDP keeps its ``(hook, state)`` pairs)."""
    gc.collect()  # a dropped DDP wrapper that still holds the state must not count
    owners = [  # type(), not isinstance: that would ask proxies for their __class__
        obj
        for obj in gc.get_objects()
        if issubclass(type(obj), DDP)
        and any(s is state for _, s in getattr(obj, "_comm_hooks", ()))
    ]
    if len(owners) != 1:
        raise RuntimeError(
            "terngrad: cannot tell which model this State serves "
            f"({len(owners)} DDP models have it): call state.bind(model) first"
        )
    return owners[0]


def tied_warning(tied: dict[str, str], params: dict[str, torch.Tensor]) -> str:
    """The warning for a last layer whose tensor is another module's (tied weights)."""
    pairs = ", ".join(
        f"{alias} is {name} ({params[name].numel():,} elements)" for alias, name in tied.items()
    )
    return (
        f"terngrad: the last layer's weights are tied to another module's ({pairs}): kept in "
        "full precision as the last layer, so that tensor is never quantized in either role; "
        "pass quantize_last=True to quantize it (and the rest of the last layer)"
    )


def warn_if_unused(used: list[bool]) -> None:
    """At exit (or when dropped): a State made in a distributed run that never exchanged a
    gradient was most likely dropped by a framework, which then trained without it."""
    if used[0] or not (dist.is_available() and dist.is_initialized()):
        return
    if dist.get_world_size() > 1:
        warnings.warn(
            "terngrad: a terngrad.ddp.State was made but no gradient ever went through it: "
            "the hook was never called, so training averaged gradients without terngrad "
            "(PyTorch Lightning ignores DDPStrategy's ddp_comm_hook on CPU: add "
            "terngrad.integrations.lightning.TernGradCallback)",
            RuntimeWarning,
            stacklevel=1,
        )
