"""Rank functions for test_timeouts.py: a hook, Synchronizer or FSDP state whose ``timeout`` is
left unset waits as long as the default group (here 3 s), not torch's 30 minutes."""

from __future__ import annotations

import datetime
import time

import torch
import torch.distributed as dist
from torch import nn

import terngrad.ddp
import terngrad.fsdp
from terngrad.comm import Synchronizer
from terngrad.diloco import DiLoCo


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))


def late_rank(rank: int, world: int, how: str, late: float) -> dict:
    """Rank 1 arrives ``late`` seconds late at the first exchange (``how``: ``register``, the
    DDP hook; ``synchronizer``, the Synchronizer DiLoCo runs on; ``diloco``, DiLoCo itself);
    rank 0's wait, and what it raised. The ranks meet again on a group of their own, which
    waits long enough."""
    after = dist.new_group(timeout=datetime.timedelta(seconds=60))
    model = _model()
    if how == "register":
        ddp = nn.parallel.DistributedDataParallel(model)
        state = terngrad.ddp.register(ddp)
        step = lambda: ddp(torch.randn(8, 32)).square().mean().backward()  # noqa: E731
    elif how == "synchronizer":
        state = Synchronizer(model)

        def step():
            model(torch.randn(8, 32)).square().mean().backward()
            state.step()
    else:  # DiLoCo, an outer step every inner step
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        state = DiLoCo(model, optimizer, 1)

        def step():
            model(torch.randn(8, 32)).square().mean().backward()
            optimizer.step()
            state.step()

    if rank == 1:
        time.sleep(late)
    start = time.perf_counter()
    try:
        step()
        message = "no error"
    except Exception as exc:
        message = str(exc)
    waited = time.perf_counter() - start
    dist.barrier(group=after)
    return {"seconds": waited, "message": message, "timeout": _options(state).timeout}


def _options(state):
    if isinstance(state, DiLoCo):
        return state.exchange.reducer.options
    return state.reducer.options if isinstance(state, Synchronizer) else state.options


def resolved(rank: int, world: int) -> dict:
    """The timeout each path settles on, and the one its groups wait, with none given, one
    given, and a process group given."""
    from terngrad.comm.rank.rank_state import group_timeout

    out = {}
    ddp = nn.parallel.DistributedDataParallel(_model())
    state = terngrad.ddp.State()  # made before first use: resolved at its first use
    out["state before use"] = state.options.timeout
    ddp.register_comm_hook(state, terngrad.ddp.hook)
    ddp(torch.randn(8, 32)).sum().backward()
    r = state.reducer
    out["state"] = (state.options.timeout, group_timeout(r.link.group),
                    group_timeout(r.side.group))  # fmt: skip
    r = terngrad.ddp.register(nn.parallel.DistributedDataParallel(_model()), timeout=5).reducer
    out["given"] = (r.options.timeout, group_timeout(r.link.group), group_timeout(r.side.group))
    group = dist.new_group(timeout=datetime.timedelta(seconds=7))
    r = Synchronizer(_model(), group=group).reducer
    out["group"] = (r.options.timeout, group_timeout(r.link.group), group_timeout(r.side.group))
    r = Synchronizer(_model()).reducer
    out["synchronizer"] = (r.options.timeout, group_timeout(r.link.group),
                           group_timeout(r.side.group))  # fmt: skip
    from torch.distributed.fsdp import fully_shard

    net = _model()
    for layer in net:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(net)
    fsdp = terngrad.fsdp.register(net)
    out["fsdp"] = (fsdp.options.timeout, group_timeout(fsdp.link.group))
    return out
