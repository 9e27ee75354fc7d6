"""The outer exchange between nodes of several ranks: local steps across nodes, DDP inside one.

A node is a group of ranks joined by a fast link (the GPUs of one machine); only the link
between nodes is slow. Inside a node the ranks train one replica with DDP over the node's
group, synchronised every step; across nodes :class:`~terngrad.diloco.DiLoCo` exchanges the
replicas' pseudo-gradients every ``H`` steps. :class:`NodeExchange` does that exchange so that
each parameter crosses the slow link once per node, not once per rank:

1. the parameters are shared out among a node's ranks (:func:`shares`: each rank owns about a
   ``K``-th of the elements, the same share at every node);
2. each rank exchanges the pseudo-gradients of its share with the ranks at its place in the
   other nodes (the group *across*, the replicate dimension of a ``DeviceMesh``), through
   terngrad's exchange (:class:`~terngrad.comm.Synchronizer`): every rank of that group gets
   the same average, bit for bit;
3. inside the node, each rank broadcasts its share's average to the node's other ranks (the
   group *within*: fast, full precision), so that every rank of every node holds the same
   averaged pseudo-gradients and the same anchor.

A rank whose pseudo-gradient is not finite makes every rank skip the outer step: the skip is
agreed across (by the exchange) and then within the node (a one-element all-reduce).

The layout comes from the process group that DDP trains a node's replica over (this rank's
node): :func:`node_group` makes one from torchrun's ``LOCAL_WORLD_SIZE``, and a ``DeviceMesh``
of ``("replicate", "node")`` gives it as ``mesh.get_group("node")``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from terngrad.comm.exchanges.link import Link
from terngrad.comm.front.synchronizer import Synchronizer
from terngrad.comm.rank.plans import last_layer_names
from terngrad.comm.spec.methods import hook_options
from terngrad.comm.spec.options import Options
from terngrad.quantize.random import stream_seed

__all__ = ["NodeExchange", "Nodes", "node_group", "share", "shares"]


@dataclass(frozen=True)
class Nodes:
    """Which ranks make each node, and this rank's two groups."""

    #: the global ranks of every node, in the order of their first rank
    ranks: tuple[tuple[int, ...], ...]
    #: this rank's node, and its place in it (its local rank)
    node: int
    place: int
    #: this node's ranks (a group of the exchange's own: not DDP's, which the inner steps use)
    within: Any
    #: the ranks at this rank's place in every node
    across: Any

    @property
    def size(self) -> int:
        """Ranks per node (``K``)."""
        return len(self.ranks[0])

    @classmethod
    def of(cls, group: Any) -> Nodes:
        """The layout whose node holds this rank is ``group`` (every rank calls it at once:
        it makes the groups); ``ValueError`` in one line, on every rank, for nodes of unequal
        size, or a rank in two nodes."""
        mine = tuple(sorted(dist.get_process_group_ranks(group)))
        everyone: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, mine)
        nodes = tuple(sorted(set(everyone)))
        problem = _problem(nodes, dist.get_world_size())
        if problem:
            raise ValueError(f"terngrad: the nodes of DiLoCo across nodes: {problem}")
        within, _ = dist.new_subgroups_by_enumeration([list(n) for n in nodes])
        size = len(nodes[0])
        across, _ = dist.new_subgroups_by_enumeration([[n[j] for n in nodes] for j in range(size)])
        node = nodes.index(mine)
        return cls(nodes, node, mine.index(dist.get_rank()), within, across)


def _problem(nodes: Sequence[tuple[int, ...]], world: int) -> str | None:
    sizes = sorted({len(n) for n in nodes})
    if len(sizes) > 1:
        shown = ", ".join(map(str, sizes))
        return f"nodes of unequal size ({shown} ranks): give every node as many ranks"
    counted = sorted(r for n in nodes for r in n)
    if counted != list(range(world)):
        return "a rank is in two nodes' groups: give each rank one node (its DDP group)"
    return None


def shares(sizes: Sequence[int], ranks: int) -> list[int]:
    """The rank of a node (its place, ``0 … ranks−1``) that owns each parameter of ``sizes``
    elements: the largest first, each to the place with the fewest elements so far (the lowest
    place on a tie), so that each place exchanges about a ``ranks``-th of the elements.

    >>> shares([10, 100, 30, 80], 2)
    [0, 0, 1, 1]
    """
    load = [0] * ranks
    owner = [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        place = min(range(ranks), key=lambda r: (load[r], r))
        owner[i] = place
        load[place] += sizes[i]
    return owner


def share(
    named: Sequence[tuple[str, Any]], options: Options, size: int, place: int
) -> tuple[list[int], Options]:
    """What the rank at ``place`` of a node of ``size`` ranks exchanges across nodes: each
    parameter's owner (:func:`shares` of ``named``, the trainable parameters in order; its
    share is those ``place`` owns) and the exchange's options for it (the seed mixed with the
    place, but at place 0: each place draws from its own streams)."""
    if place:
        options = options.replace(seed=stream_seed(options.seed, place))
    return shares([p.numel() for _, p in named], size), options


def node_group(ranks_per_node: int | None = None) -> Any:
    """This rank's node as a process group, for ``DDP(model, process_group=node_group())``:
    nodes of ``ranks_per_node`` consecutive ranks (torchrun numbers a node's ranks so; by
    default torchrun's ``LOCAL_WORLD_SIZE``). Every rank calls it at once."""
    if ranks_per_node is None:
        if "LOCAL_WORLD_SIZE" not in os.environ:
            raise ValueError(
                "node_group() reads torchrun's LOCAL_WORLD_SIZE, which is not set: give "
                "ranks_per_node"
            )
        ranks_per_node = int(os.environ["LOCAL_WORLD_SIZE"])
    world = dist.get_world_size()
    if ranks_per_node < 1 or world % ranks_per_node:
        raise ValueError(
            f"ranks_per_node {ranks_per_node} does not divide the world of {world} ranks"
        )
    layout = [list(range(s, s + ranks_per_node)) for s in range(0, world, ranks_per_node)]
    group, _ = dist.new_subgroups_by_enumeration(layout)
    return group


class NodeExchange(Synchronizer):
    """Averages one tensor per parameter of ``module`` over the nodes (the module above), in
    place; ``group``: this rank's node (the group DDP trains over). Settings as for
    :class:`~terngrad.comm.Synchronizer`, applied to the exchange across nodes (each place's
    stochastic draws from its own streams: the seed mixed with the place). :attr:`stats`
    counts what crossed the slow link, :attr:`node_bytes_sent` what stayed inside the node."""

    def __init__(
        self, module: nn.Module, group: Any, *args: Any, options: Options | None = None,
        **settings: Any,
    ) -> None:  # fmt: skip
        self.nodes = nodes = Nodes.of(group)
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        if len(named) < nodes.size:
            raise ValueError(
                f"terngrad: a node of {nodes.size} ranks shares out the parameters, and the "
                f"model has {len(named)}: use nodes of at most {len(named)} ranks"
            )
        self.inside = Link(nodes.within)
        self._made = False
        extra = {k: settings.pop(k) for k in ("estimate",) if k in settings}
        #: each parameter's owner (its place in the node), and those this rank owns
        self._owners, options = share(named, options or hook_options(*args, **settings),
                                      nodes.size, nodes.place)  # fmt: skip
        self._own = [i for i, o in enumerate(self._owners) if o == nodes.place]
        super().__init__([named[i] for i in self._own], options=options, group=nodes.across,
                         last_layer=last_layer_names(module), **extra)  # fmt: skip
        #: every trainable parameter of the module (the replica); the share this rank
        #: exchanges across nodes is :attr:`shared`
        self.shared, self.params = self.params, [p for _, p in named]
        self._made = True
        with torch.no_grad():
            self._from_owners([p.data for p in self.params])

    @property
    def node_bytes_sent(self) -> int:  # type: ignore[override]
        return self.inside.counter.sent

    def step(self) -> bool:
        raise TypeError(
            "NodeExchange averages pseudo-gradients (DiLoCo's outer step): DDP averages the "
            "gradients inside a node"
        )

    def average(self, tensors: list[torch.Tensor], warn: bool = True) -> bool:
        """Average ``tensors`` (one per parameter) over the nodes, in place: this rank's share
        across, then every share from its owner within the node. Returns True (every tensor
        zero) if some rank's values were not finite."""
        skipped = super().average([tensors[i] for i in self._own], warn)
        flag = torch.tensor([float(skipped)])
        self.inside.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item():
            for t in tensors:
                t.zero_()
            return True
        self._from_owners(tensors)
        return False

    def _from_owners(self, tensors: list[torch.Tensor]) -> None:
        """Each tensor replaced by its owner's in this node: one broadcast per place."""
        for place in range(self.nodes.size):
            self._within([t for t, o in zip(tensors, self._owners, strict=True) if o == place],
                         place)  # fmt: skip

    def _within(self, tensors: list[torch.Tensor], root: int) -> None:
        """``tensors`` replaced by those of the node's rank at place ``root`` (counted)."""
        if not tensors:
            return
        flat = torch.cat([t.reshape(-1) for t in tensors])
        raw = flat.view(torch.uint8)
        got = self.inside.broadcast(raw if self.nodes.place == root else None, raw.numel(),
                                    root, flat.device).view(flat.dtype)  # fmt: skip
        for t, part in zip(tensors, got.split([t.numel() for t in tensors]), strict=True):
            t.copy_(part.view_as(t))

    def from_first(self, tensors: Iterable[torch.Tensor]) -> None:
        """Rank 0's values: node 0's first rank's across the nodes' first ranks, then from each
        node's first rank to the others (while the exchange is made: each place's share across,
        then from its owner inside the node)."""
        tensors = list(tensors)
        if not self._made or self.nodes.place == 0:
            super().from_first(tensors)
        if self._made:
            self._within(tensors, 0)

    def average_floats(self, tensors: list[torch.Tensor]) -> None:
        """The mean over the nodes of each node's first rank's values (averaged across the
        nodes' first ranks: once per node), on every rank."""
        if self.nodes.place == 0:
            super().average_floats(tensors)
        self._within(tensors, 0)

    def agree_max(self, values: torch.Tensor) -> torch.Tensor:
        """``values`` replaced by their maximum over every rank of every node, in place."""
        dist.all_reduce(values, op=dist.ReduceOp.MAX)
        return values
