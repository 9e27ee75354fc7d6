"""The model ``DiLoCo`` steps: a plain module, or a DDP model whose every-step all-reduce becomes
a no-op hook (:func:`local_gradients`: each replica keeps its own gradient); what it cannot
serve (FSDP, a DDP model with a hook already), and the inner optimizer that must own exactly its
trainable parameters — each refused in one line."""

from __future__ import annotations

import torch
from torch import nn


def local_gradients(_, bucket):  # DDP checks real annotations; these would be strings
    """A DDP communication hook that averages nothing: each replica keeps its own gradient
    (its inner steps are local)."""
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future


def plain_module(model: nn.Module) -> nn.Module:
    """The module whose parameters DiLoCo steps; one line for what it cannot serve."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"DiLoCo trains an nn.Module, got {type(model).__name__}")
    if isinstance(model, nn.parallel.DistributedDataParallel):
        hooks = getattr(model, "_comm_hooks", [])
        if hooks:
            raise ValueError(
                "this DDP model already has a communication hook (a terngrad hook?): DiLoCo "
                "replaces DDP's all-reduce with its own, so give it a DDP model without one, "
                "or the plain module"
            )
        return model.module
    if any(type(m).__name__.startswith("FSDP") for m in model.modules()):
        raise ValueError(
            "DiLoCo does not serve FSDP models: its outer step needs each rank's whole replica"
        )
    return model


def check_owner(module: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """The inner optimizer must step exactly the model's trainable parameters."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(
            f"inner_optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}"
        )
    owned = {id(p) for g in optimizer.param_groups for p in g["params"]}
    trainable = {id(p) for p in module.parameters() if p.requires_grad}
    if owned != trainable:
        raise ValueError(
            f"the inner optimizer must own the model's trainable parameters, and only those: "
            f"{len(trainable - owned)} of the model's are not in it, {len(owned - trainable)} of "
            "its are not the model's"
        )
