"""The model ``DiLoCo`` steps: a plain module, a DDP model whose every-step all-reduce becomes
a no-op hook (:func:`local_gradients`: each replica keeps its own gradient), or a DDP model
over the ranks of one node, which keeps its all-reduce inside the node while the outer exchange
runs across nodes (:class:`~terngrad.comm.front.nodes.NodeExchange`); what it cannot serve
(FSDP, a DDP model with a hook already), and the inner optimizer that must own exactly its
trainable parameters — each refused in one line."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from terngrad.comm.front.nodes import NodeExchange
from terngrad.comm.front.synchronizer import Synchronizer


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


def outer_exchange(
    model: nn.Module, module: nn.Module, across_nodes: bool, *args: Any, **settings: Any
) -> Synchronizer:
    """The exchange of the pseudo-gradients of ``module`` (settings as for
    :class:`~terngrad.comm.Synchronizer`): ``across_nodes``, across the nodes, ``model`` being
    DDP over the ranks of one node (it goes on averaging the gradients inside the node at
    every step); else over every rank (a DDP model's all-reduce then becomes a no-op). One
    line for a model that is not what ``across_nodes`` says."""
    ddp = isinstance(model, nn.parallel.DistributedDataParallel)
    part = ddp and dist.get_world_size(model.process_group) < dist.get_world_size()
    if across_nodes and not part:
        raise ValueError(
            "DiLoCo across nodes trains each node as one replica: give it a DDP model over "
            "the ranks of one node, DDP(model, process_group=terngrad.diloco.node_group())"
        )
    if part and not across_nodes:
        raise ValueError(
            f"this DDP model trains over {dist.get_world_size(model.process_group)} of the "
            f"{dist.get_world_size()} ranks: give DiLoCo across_nodes=True (a method with "
            "-nodes) to train each node as one replica, or a DDP model over every rank"
        )
    if part:
        return NodeExchange(module, model.process_group, *args, **settings)
    if ddp:
        model.register_comm_hook(None, local_gradients)
    return Synchronizer(module, *args, **settings)
