"""DiLoCo across nodes of several ranks on real gloo ranks: DDP over each node's ranks inside,
the outer exchange across nodes (:class:`terngrad.comm.front.nodes.NodeExchange`)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from diloco_workers import _params, batch, model
from torch import nn

from terngrad.comm.front.nodes import node_group
from terngrad.diloco import DiLoCo


def train(rank: int, world: int, steps: int, local_steps: int, settings: dict,
          per_node: int) -> dict:  # fmt: skip
    """``steps`` inner steps of DDP over this rank's node (``per_node`` consecutive ranks) and
    DiLoCo across nodes: per step whether it was an outer step and this rank's parameters and
    buffers after it; the parameters before each outer step; the stats after ``finish``."""
    net = model()
    inner = torch.optim.AdamW(net.parameters(), lr=1e-2)
    ddp = nn.parallel.DistributedDataParallel(net, process_group=node_group(per_node))
    outer = DiLoCo(ddp, inner, local_steps, across_nodes=True, **settings)
    out: dict = {"outer": [], "params": [], "before_outer": []}
    for step in range(steps):
        x, y = batch(step, rank)
        inner.zero_grad()
        nn.functional.cross_entropy(ddp(x), y).backward()
        inner.step()
        if (step + 1) % local_steps == 0:
            out["before_outer"].append(_params(net))
        out["outer"].append(outer.step())
        out["params"].append(_params(net))
    outer.finish()
    out["final"] = _params(net)
    out["stats"] = outer.stats
    return out


def unequal_nodes(rank: int, world: int) -> str:
    """Nodes of 3 and 1 ranks: what DiLoCo says."""
    ranks = [[0, 1, 2], [3]]
    group, _ = dist.new_subgroups_by_enumeration(ranks)
    net = model()
    ddp = nn.parallel.DistributedDataParallel(net, process_group=group)
    try:
        DiLoCo(ddp, torch.optim.AdamW(net.parameters()), 4, across_nodes=True)
    except ValueError as exc:
        return str(exc)
    return "accepted"


def mismatched(rank: int, world: int) -> list[str]:
    """A DDP model over a node's ranks without ``across_nodes``, and ``across_nodes`` with a
    plain module: what DiLoCo says to each."""
    said = []
    for across, over_node in ((False, True), (True, False)):
        net = model()
        wrapped = (nn.parallel.DistributedDataParallel(net, process_group=node_group(2))
                   if over_node else net)  # fmt: skip
        try:
            DiLoCo(wrapped, torch.optim.AdamW(net.parameters()), 4, across_nodes=across)
            said.append("accepted")
        except ValueError as exc:
            said.append(str(exc))
    return said
