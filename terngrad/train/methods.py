"""The ways to average gradients that this project compares, in one table (:data:`METHODS`).

A :class:`Method` is a name, a label, and either one of PyTorch's own ways (``baseline``:
DDP's fp32 all-reduce, ``fp16_compress_hook``, ``powerSGD_hook``: :mod:`terngrad.train.baselines`)
or terngrad's hook with its :class:`~terngrad.comm.Options`. Every benchmark (``bench network``,
``bench accuracy``), every reproduction, the study and the performance model read this table,
so a name means one thing everywhere: ``terngrad`` is the hook's defaults (sharded exchange,
clipping at 2.5 sigma, one scale per tensor, the last layer and tensors under 1,024 elements in
fp32), ``terngrad-b512`` the same with one scale per 512 elements, and so on.

An experiment may put its own protocol over every method it runs (:meth:`Method.configure`):
which tensors are quantized (``quantize_last``, ``min_numel``), the topology, clipping for all.
Its report says so; the method's own settings stay those of its name.

Older names that still work (:data:`ALIASES`): ``qsgd`` is ``qsgd-5`` and ``orq`` is ``orq-5``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from terngrad import quantize
from terngrad.comm import Options
from terngrad.train.baselines import BASELINES, POWERSGD_RANK
from terngrad.train.config import TrainConfig


@dataclass(frozen=True)
class Method:
    """One way to average gradients: ``name``, the ``label`` of tables and plots, and either a
    PyTorch ``baseline`` or terngrad's hook with ``exchange`` options. ``full_precision_share``:
    this share of a run's steps averages in full precision before the quantizer takes over
    (1-bit Adam's warm-up, Tang et al. 2021). ``freeze_share``: for a run with AdamW, the
    optimizer becomes ``frozen-adamw`` with its variance frozen after this share of the steps,
    the hook then exchanging its preconditioned momentum (:mod:`terngrad.optim`).
    ``variance_sync``: for a run with AdamW, the optimizer becomes ``local-adamw``, its variance
    measured on each rank and averaged every this many steps, its momentum exchanged."""

    name: str
    label: str
    baseline: str | None = None
    exchange: Options | None = field(default=None, hash=False)
    full_precision_share: float = 0.0
    freeze_share: float = 0.0
    variance_sync: int = 0

    def __post_init__(self) -> None:
        if (self.baseline is None) == (self.exchange is None):
            raise ValueError(f"method {self.name!r} needs either a baseline or exchange options")
        if self.baseline is not None and self.baseline not in BASELINES:
            raise ValueError(f"method {self.name!r}: unknown baseline {self.baseline!r}")

    @property
    def one_bucket(self) -> bool:
        """True where DDP must run in a single bucket (PowerSGD: it hangs on gloo with more)."""
        return self.baseline == "powersgd"

    def quantizer(self) -> quantize.Quantizer | None:
        """What the method does to one tensor as a quantizer: the hook's quantizer, fp32/fp16
        for PyTorch's plain and fp16 all-reduce, ``None`` for PowerSGD (a low-rank method, not
        a quantizer)."""
        if self.exchange is not None:
            return self.exchange.make_quantizer()
        return quantize.get(self.baseline) if self.baseline in ("fp32", "fp16") else None

    def options(self, **protocol: Any) -> Options:
        """The hook's options with an experiment's ``protocol`` put over them (exchange fields
        by name; ``quantizer_options`` merged into the method's own)."""
        if self.exchange is None:
            raise ValueError(f"{self.name} is PyTorch's own averaging, not terngrad's hook")
        q_options = {**self.exchange.quantizer_options, **protocol.pop("quantizer_options", {})}
        return self.exchange.replace(**protocol, quantizer_options=q_options)

    def configure(
        self,
        base: TrainConfig,
        out: str,
        protocol: Mapping[str, Any] | None = None,
        full_precision_steps: int | None = None,
    ) -> TrainConfig:
        """``base`` trained this way into ``out``: PyTorch's baseline (the exchange options are
        then unused and left at their defaults), or the hook with :meth:`options` under
        ``protocol``; a method with a full-precision share gets ``full_precision_steps`` (by
        default its share of ``base.steps``, at least 1)."""
        if self.baseline is not None:
            return base.replace(out=out, baseline=self.baseline, exchange=Options())
        exchange = self.options(**dict(protocol or {}))
        if self.full_precision_share:
            k = full_precision_steps or max(1, int(base.steps * self.full_precision_share))
            exchange = exchange.replace(full_precision_steps=k)
        if (self.freeze_share or self.variance_sync) and base.optimizer != "adamw":
            raise ValueError(
                f"method {self.name} exchanges AdamW's momentum; this run's optimizer is "
                f"{base.optimizer!r}"
            )
        if self.freeze_share:
            freeze = max(1, int(base.steps * self.freeze_share))
            base = base.replace(optimizer="frozen-adamw", freeze_after=freeze)
        if self.variance_sync:
            base = base.replace(optimizer="local-adamw", variance_sync=self.variance_sync)
        return base.replace(out=out, baseline=None, exchange=exchange)


def _hook(name: str, label: str, quantizer: str = "terngrad", share: float = 0.0,
          freeze: float = 0.0, sync: int = 0, **kw) -> Method:  # fmt: skip
    options = {k: kw.pop(k) for k in list(kw) if k in Options.__dataclass_fields__}
    return Method(name, label, exchange=Options(quantizer, quantizer_options=kw, **options),
                  full_precision_share=share, freeze_share=freeze,
                  variance_sync=sync)  # fmt: skip


def _levels(family: str, title: str) -> list[Method]:
    return [
        _hook(f"{family}-{s}", f"{title} {s} levels, sharded", family, levels=s) for s in (3, 5, 9)
    ]


#: every method, by name
METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method("fp32", "DDP fp32 all-reduce", baseline="fp32"),
        Method("fp16", "PyTorch fp16_compress_hook", baseline="fp16"),
        Method(
            "powersgd",
            f"PyTorch powerSGD_hook (rank {POWERSGD_RANK}, one bucket)",
            baseline="powersgd",
        ),
        _hook("fp32-sharded", "fp32 through terngrad's sharded exchange", "fp32"),
        _hook("terngrad", "terngrad sharded"),
        _hook(
            "terngrad-fused",
            "terngrad sharded, a step's DDP buckets in one exchange",
            fuse_buckets=True,
        ),
        _hook("terngrad-ps", "terngrad parameter server", topology="ps"),
        _hook("terngrad-allgather", "terngrad all-gather", topology="allgather"),
        _hook(
            "terngrad-own",
            "terngrad all-gather, each rank's own scales (no scalar sharing): one collective "
            "a bucket",
            topology="allgather",
            own_scales=True,
        ),
        _hook(
            "terngrad-own-fused",
            "terngrad all-gather, each rank's own scales, a step's DDP buckets in one "
            "exchange: one collective a step",
            topology="allgather",
            own_scales=True,
            fuse_buckets=True,
        ),
        _hook("terngrad-noclip", "terngrad sharded, no clipping", clip=None),
        _hook("terngrad-b512", "terngrad sharded, a scale per 512 elements", bucket_size=512),
        _hook("terngrad-b2048", "terngrad sharded, a scale per 2048 elements", bucket_size=2048),
        _hook("terngrad-ef", "terngrad sharded, error feedback", error_feedback=True),
        _hook("terngrad-fp", "terngrad sharded after full-precision steps (a fifth)", share=0.2),
        _hook(
            "terngrad-b512-fp",
            "terngrad sharded, a scale per 512 elements, after full-precision steps (a fifth)",
            share=0.2,
            bucket_size=512,
        ),
        _hook(
            "terngrad-momentum",
            "terngrad sharded, a scale per 512 elements, error feedback; AdamW's variance "
            "frozen after a fifth of the steps, its preconditioned momentum exchanged",
            freeze=0.2,
            bucket_size=512,
            error_feedback=True,
        ),
        _hook(
            "fp32-localvar",
            "fp32 through terngrad's sharded exchange, AdamW's momentum exchanged, its "
            "variance each rank's own, averaged every 100 steps (terngrad-localvar uncompressed)",
            "fp32",
            sync=100,
        ),
        _hook(
            "terngrad-localvar",
            "terngrad sharded, a scale per 512 elements, error feedback; AdamW's momentum "
            "exchanged, its variance each rank's own, averaged every 100 steps",
            sync=100,
            bucket_size=512,
            error_feedback=True,
        ),
        _hook(
            "terngrad-localvar-all",
            "terngrad-localvar with every tensor ternary: the last layer and the small tensors "
            "too (quantize_last, min_numel 0)",
            sync=100,
            bucket_size=512,
            error_feedback=True,
            quantize_last=True,
            min_numel=0,
        ),
        _hook(
            "terngrad-localvar-all-noclip",
            "terngrad-localvar-all without clipping",
            sync=100,
            bucket_size=512,
            error_feedback=True,
            quantize_last=True,
            min_numel=0,
            clip=None,
        ),
        *_levels("qsgd", "QSGD"),
        *_levels("linear", "Linear"),
        *_levels("orq", "ORQ"),
        _hook("bingrad-b", "BinGrad-b, sharded", "bingrad-b"),
        _hook("bingrad-pb", "BinGrad-pb, sharded", "bingrad-pb"),
        _hook("signsgd", "scaled sign, one scale per tensor", "signsgd"),
        _hook("signsgd-b512", "scaled sign, a scale per 512 elements", "signsgd", bucket_size=512),
    )
}
#: older names, and the methods they are
ALIASES = {"qsgd": "qsgd-5", "orq": "orq-5"}


def get(name: str) -> Method:
    """The method called ``name`` (or an older name of it); ``ValueError`` naming the choices."""
    method = METHODS.get(ALIASES.get(name, name))
    if method is None:
        raise ValueError(f"unknown method {name!r}; choose from: {', '.join(METHODS)}")
    return method


def select(names: Iterable[str], allowed: Iterable[str] | None = None) -> list[Method]:
    """The methods ``names``, in order: each known (and among ``allowed`` where given), none
    twice; ``ValueError`` with one line otherwise."""
    names = list(names)
    allowed = list(allowed) if allowed is not None else list(METHODS)
    if not names:
        raise ValueError(f"give at least one method; choose from: {', '.join(allowed)}")
    chosen = [get(name) for name in names]
    outside = [n for n, m in zip(names, chosen, strict=True) if m.name not in allowed]
    if outside:
        raise ValueError(
            f"{', '.join(outside)}: not a method of this comparison; choose from: "
            f"{', '.join(allowed)}"
        )
    repeated = sorted({m.name for m in chosen if sum(c.name == m.name for c in chosen) > 1})
    if repeated:
        raise ValueError(f"methods given twice: {', '.join(repeated)}")
    return chosen
