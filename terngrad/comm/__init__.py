"""The distributed layer: the exchange's options, the exchange algorithms and their traffic,
counted collectives, error feedback, the reducer that runs a step's exchanges, and the DDP
communication hook (public entry point: :mod:`terngrad.ddp`).

Files: ``options`` (the one options object), ``methods`` (every way to average gradients, named
by one rule), ``exchange`` (the exchanges' interface), ``topologies`` (sharded, ps, allgather,
own-scales), ``grid_step`` (one rank's digits on the shared grid), ``traffic`` (exact byte
formulas), ``link`` (counted collectives),
``memory`` (error feedback), ``plans`` (which parameters of a bucket are quantized),
``rank_state`` (what one rank's exchange keeps, DDP's and FSDP's), ``reducer`` (a rank's
exchange of a model, step by step), ``stats``, ``policy`` (the auto policy), ``hook`` (the DDP
glue), ``synchronizer`` (loops without DDP), ``consistency`` (replica checks), ``errors``.
"""

from terngrad.comm.errors import CollectiveFailed, ExchangeMismatch
from terngrad.comm.exchange import AGGREGATES, Exchange, Result, shard_bounds
from terngrad.comm.hook import State, hook, register
from terngrad.comm.link import ByteCounter, Link
from terngrad.comm.memory import ErrorFeedback
from terngrad.comm.options import MIN_NUMEL, POLICIES, Options
from terngrad.comm.plans import last_layer_names
from terngrad.comm.reducer import Reducer, rank_seed
from terngrad.comm.stats import Stats, Timing
from terngrad.comm.synchronizer import Synchronizer
from terngrad.comm.topologies import (
    TOPOLOGIES,
    AllGatherExchange,
    OwnScalesExchange,
    ParameterServerExchange,
    ShardedExchange,
    make_exchange,
)
from terngrad.comm.traffic import Traffic, grid_traffic, ring_bytes
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
