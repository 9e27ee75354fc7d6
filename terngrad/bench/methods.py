"""The methods the benchmarks compare, in one table: ``terngrad bench network`` measures them
(:mod:`terngrad.bench.network` builds each one's DDP model) and ``terngrad model`` predicts
those it can (:mod:`terngrad.bench.model` derives each one's traffic).

A method is either one of PyTorch's own ways (``builtin``: ``fp32`` plain DDP, ``fp16``
``default_hooks.fp16_compress_hook``, ``powersgd`` ``powerSGD_hook`` of rank
:data:`POWERSGD_RANK` with DDP in a single bucket, as it hangs on gloo with several) or this
library's hook (``quantizer`` with its ``options``, exchanged over ``topology``). The names are
those of the results under ``docs/results``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from terngrad.train.baselines import POWERSGD_RANK

Builtin = Literal["fp32", "fp16", "powersgd"]


@dataclass(frozen=True)
class BenchMethod:
    """One way to average gradients: its ``name``, the ``label`` of tables and plots, and
    either a PyTorch ``builtin`` or terngrad's hook (``quantizer``, ``topology``, ``options``)."""

    name: str
    label: str
    builtin: Builtin | None = None
    quantizer: str | None = None
    topology: str = "sharded"
    options: Mapping[str, Any] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        if (self.builtin is None) == (self.quantizer is None):
            raise ValueError(f"method {self.name!r} needs either a builtin or a quantizer")

    @property
    def one_bucket(self) -> bool:
        """True where DDP must run in a single bucket (PowerSGD: it hangs on gloo with more)."""
        return self.builtin == "powersgd"


METHODS: dict[str, BenchMethod] = {
    m.name: m
    for m in (
        BenchMethod("fp32", "DDP fp32 all-reduce", builtin="fp32"),
        BenchMethod("fp16", "PyTorch fp16_compress_hook", builtin="fp16"),
        BenchMethod(
            "powersgd",
            f"PyTorch powerSGD_hook (rank {POWERSGD_RANK}, one bucket)",
            builtin="powersgd",
        ),
        BenchMethod("terngrad", "terngrad sharded", quantizer="terngrad"),
        BenchMethod(
            "terngrad-ps", "terngrad parameter server", quantizer="terngrad", topology="ps"
        ),
        BenchMethod(
            "terngrad-allgather", "terngrad all-gather", quantizer="terngrad", topology="allgather"
        ),
        BenchMethod("qsgd", "QSGD 5 levels, sharded", quantizer="qsgd", options={"levels": 5}),
        BenchMethod("orq", "ORQ 5 levels, sharded", quantizer="orq", options={"levels": 5}),
    )
}
DEFAULT_METHODS = ("fp32", "fp16", "powersgd", "terngrad", "terngrad-ps", "qsgd")


def method(name: str) -> BenchMethod:
    """The method called ``name``; ``ValueError`` naming the choices for any other."""
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; choose from: {', '.join(METHODS)}")
    return METHODS[name]
