"""The distributed layer: exchange algorithms, counted collectives, error feedback, and the
DDP communication hook (public entry point: :mod:`terngrad.ddp`)."""

from terngrad.comm.exchange import (
    AGGREGATES,
    TOPOLOGIES,
    AllGatherExchange,
    Exchange,
    ExchangeMismatch,
    ParameterServerExchange,
    Result,
    ShardedExchange,
    Traffic,
    grid_traffic,
    make_exchange,
    ring_bytes,
    shard_bounds,
)
from terngrad.comm.hook import (
    HookState,
    Stats,
    Timing,
    last_layer_names,
    rank_seed,
    register,
    stream_seed,
)
from terngrad.comm.link import ByteCounter, Link
from terngrad.comm.memory import ErrorFeedback
from terngrad.comm.synchronizer import Synchronizer

__all__ = [
    "AGGREGATES",
    "TOPOLOGIES",
    "AllGatherExchange",
    "ByteCounter",
    "ErrorFeedback",
    "Exchange",
    "ExchangeMismatch",
    "HookState",
    "Link",
    "ParameterServerExchange",
    "Result",
    "ShardedExchange",
    "Stats",
    "Synchronizer",
    "Timing",
    "Traffic",
    "grid_traffic",
    "last_layer_names",
    "make_exchange",
    "rank_seed",
    "register",
    "ring_bytes",
    "shard_bounds",
    "stream_seed",
]
