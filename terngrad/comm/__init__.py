"""The distributed layer (public entry point: :mod:`terngrad.ddp`), in four rooms, each
importing only the ones before it:

* :mod:`~terngrad.comm.exchanges`: the exchange algorithms: counted collectives (``link``), the
  interface and the topologies, steps on the shared grid or agreed levels, the exact traffic
  of each;
* :mod:`~terngrad.comm.spec`: what a run is before any rank talks: the exchange's ``Options``,
  the ``Method`` and its naming rule, the table of methods;
* :mod:`~terngrad.comm.rank`: one rank's running state: error feedback, the exchanged momentum,
  bucket plans, the full-precision all-reduce, the auto policy, counters, agreement across
  ranks, saved states and their checks, and the ``Reducer`` that runs a step's exchanges;
* :mod:`~terngrad.comm.front`: the front doors: the DDP hook and the ``Synchronizer``.

What goes wrong between ranks, for all of them: :mod:`terngrad.comm.errors`.
"""

from terngrad.comm.errors import CollectiveFailed, ExchangeMismatch
from terngrad.comm.exchanges.exchange import (
    AGGREGATES,
    Exchange,
    ExchangeSettings,
    Result,
    shard_bounds,
)
from terngrad.comm.exchanges.link import ByteCounter, Link
from terngrad.comm.exchanges.topologies import (
    TOPOLOGIES,
    AllGatherExchange,
    OwnScalesExchange,
    ParameterServerExchange,
    ShardedExchange,
    make_exchange,
)
from terngrad.comm.exchanges.traffic import Traffic, grid_traffic, ring_bytes
from terngrad.comm.front.hook import State, hook, register
from terngrad.comm.front.synchronizer import Synchronizer
from terngrad.comm.rank.memory import ErrorFeedback
from terngrad.comm.rank.plans import last_layer_names
from terngrad.comm.rank.reducer import Reducer, rank_seed
from terngrad.comm.rank.stats import Stats, Timing
from terngrad.comm.spec.options import MIN_NUMEL, POLICIES, Options
from terngrad.kernels import stream_seed

__all__ = [
    "AGGREGATES",
    "MIN_NUMEL",
    "POLICIES",
    "TOPOLOGIES",
    "AllGatherExchange",
    "ByteCounter",
    "CollectiveFailed",
    "ErrorFeedback",
    "Exchange",
    "ExchangeMismatch",
    "ExchangeSettings",
    "Link",
    "Options",
    "OwnScalesExchange",
    "ParameterServerExchange",
    "Reducer",
    "Result",
    "ShardedExchange",
    "State",
    "Stats",
    "Synchronizer",
    "Timing",
    "Traffic",
    "grid_traffic",
    "hook",
    "last_layer_names",
    "make_exchange",
    "rank_seed",
    "register",
    "ring_bytes",
    "shard_bounds",
    "stream_seed",
]
