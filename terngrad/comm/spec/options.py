"""The exchange's options: one frozen object, checked once where it is made.

Every way in — :func:`terngrad.ddp.register`, :class:`terngrad.ddp.State`, the custom-loop
:class:`~terngrad.comm.Synchronizer`, ``terngrad train`` (whose ``TrainConfig`` embeds one) —
builds an :class:`Options`, and each option has the same name from the command line down to the
hook (``--quantize-last`` is ``quantize_last``, ``--min-numel`` is ``min_numel``, ...).

>>> opts = Options.of("terngrad", "sharded", clip=2.0, error_feedback=True)
>>> opts.quantizer_options
{'clip': 2.0}
>>> Options().diff(opts)
['error_feedback=True instead of False', 'quantizer_options.clip=2.0 instead of None']
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from terngrad import quantize
from terngrad.comm.exchanges.exchange import Exchange, ExchangeSettings, check_fit_scale
from terngrad.comm.exchanges.topologies import TOPOLOGIES
from terngrad.comm.spec.tensor_classes import QUANTIZABLE
from terngrad.comm.spec.tokens import Choice, Number, Switch
from terngrad.kernels import KERNELS
from terngrad.quantize import Quantizer, SymmetricGrid
from terngrad.util.deprecation import warn_deprecated
from terngrad.util.differences import differences
from terngrad.util.settings import INT64, NON_NEGATIVE_INT, Range, check_settings, setting

#: tensors with fewer elements stay in full precision by default
MIN_NUMEL = 1024
#: which buckets are quantized, and the quantizers each policy serves: ``auto`` predicts the
#: exchange of the shared-grid quantizers (:mod:`terngrad.comm.rank.policy`)
POLICIES: Mapping[str, type[Quantizer]] = MappingProxyType(
    {"quantize": Quantizer, "auto": SymmetricGrid}
)
#: the longest wait a collective may be given (a year): past it, timeouts overflow
MAX_TIMEOUT = 365 * 24 * 3600.0
_X = "exchange"  # the settings' group: the command line's option group


def _fail(message: str) -> None:
    raise ValueError(message)


def _one_of(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        _fail(f"unknown {name} {value!r}; choose one of: {', '.join(choices)}")


@dataclass(frozen=True)
class Options:
    """How gradients are exchanged.

    * ``quantizer``, ``quantizer_options``: a name from ``quantize.names()`` and its options
      (``clip``, ``bucket_size``, ``levels``, ``packing``, ...);
    * ``topology``: ``sharded`` (all-to-all + all-gather), ``ps`` (rank 0 aggregates),
      ``allgather``, or ``own-scales``: each rank rounds on its own scales and sends them with
      its codes, instead of the scales' MAX over the ranks (scalar sharing, the paper's Sec.
      3.2): no round to agree the scales, so one collective a bucket; the shared-grid
      quantizers only (:class:`~terngrad.comm.OwnScalesExchange`). Which quantizers,
      aggregates and policies a topology serves is said by its class
      (:meth:`~terngrad.comm.Exchange.check`);
    * ``kernels``: ``auto`` (fused numba kernels for CPU tensors, Triton for CUDA, else the
      torch reference), ``numba``, ``triton`` or ``torch``; backends give the same bytes;
    * ``policy``: ``quantize`` every parameter not kept in full precision, or ``auto``: per DDP
      bucket, only where the measured link and codec predict a faster exchange
      (:mod:`terngrad.comm.rank.policy`; shared-grid quantizers only);
    * ``error_feedback``: worker-side residuals (:mod:`terngrad.comm.rank.memory`);
    * ``fit_scale``: with error feedback and a ternary grid (terngrad, qsgd with 3 levels), the
      digits decode to their least-squares value ``min_r <y_r, g_r> / ||y_r||_1`` instead of
      the shared scale (:func:`~terngrad.comm.exchanges.grid_step.least_squares_values`): the
      compression becomes a contraction and the residuals stay bounded, where plain TernGrad's
      can grow without bound (evenly spread values such as AdamW's updates);
    * ``quantize_last``: quantize the last layer too (by default it stays in full precision);
    * ``min_numel``: tensors with fewer elements stay in full precision;
    * ``quantize_only``: a class of tensors quantized alone, every other in full precision
      (:mod:`terngrad.comm.spec.tensor_classes`: an ablation; ``None``, the default: as the two
      settings above say);
    * ``aggregate``: how aggregates off the shared grid travel on, ``requantize`` (with
      server-side error feedback) or ``fp16``; or, for the per-bucket level quantizers,
      ``coherent``: one set of levels agreed by all ranks, the average rounded onto it
      (:mod:`terngrad.comm.exchanges.coherent`);
    * ``full_precision_steps``: the first this many steps average every gradient in full
      precision (all-reduce), then the quantizer takes over: a warm-up as 1-bit Adam's
      (Tang et al. 2021, Sec. 4) before compression starts;
    * ``fuse_buckets``: the DDP hook holds a step's buckets and exchanges them together at
      the last one (one bucket per dtype): one exchange a step — three collective rounds on
      the sharded grid — instead of one a bucket, but none of it overlaps the backward pass.
      For TernGrad and QSGD the averaged gradients are the same bits either way (the scales
      are per parameter, the sums exact); the other quantizers' shards are cut elsewhere;
    * ``seed``: every random draw of the exchange derives from it
      (:func:`~terngrad.kernels.stream_seed`);
    * ``timeout``: seconds a collective of the exchange waits before failing with
      :class:`~terngrad.comm.CollectiveFailed` (``None``: the default group's, read when the
      exchange is built and then written into the state's ``options``; not torch's default
      for a new group, 30 minutes on gloo).
    """

    quantizer: str = setting("terngrad", "a name from quantize.names()", _X, metavar="NAME")
    quantizer_options: Mapping[str, Any] = field(default_factory=dict, hash=False)
    topology: str = setting(
        "sharded", "sharded, ps, allgather or own-scales (each rank's own scales, shared-grid "
        "quantizers: one collective a bucket)", _X, metavar="NAME",
    )  # fmt: skip
    kernels: str = setting(
        "auto", "encode/decode kernels: auto, numba, triton or torch (the reference)", _X,
        metavar="NAME",
    )  # fmt: skip
    # the settings a method's name holds, in the order of its tokens (tokens.py)
    quantize_last: bool = setting(
        False, "quantize the last layer too (default: full precision)", _X,
        named=Switch("last layer", "last", "the last layer quantized"),
    )  # fmt: skip
    min_numel: int = setting(
        MIN_NUMEL, "tensors with fewer elements stay full precision", _X, NON_NEGATIVE_INT,
        named=Number("min numel", "min", lambda n: "small tensors quantized" if n == 0
                     else f"tensors under {n} elements in fp32"),
    )  # fmt: skip
    quantize_only: str | None = setting(
        None, "quantize the tensors of this class alone (embeddings, attention, mlp, norms or "
        "head: an ablation), every other in full precision", _X, metavar="CLASS",
        choices=lambda: QUANTIZABLE,
        named=Choice("quantized class", {"embeddings": "onlyemb", "attention": "onlyattn",
                     "mlp": "onlymlp", "norms": "onlynorm", "head": "onlyhead"},
                     lambda c: f"only the {c} quantized"),
    )  # fmt: skip
    error_feedback: bool = setting(
        False, "worker-side error feedback", _X,
        named=Switch("error feedback", "ef", "error feedback"),
    )  # fmt: skip
    fit_scale: bool = setting(
        False, "with --error-feedback: ternary digits decode to their least-squares value, "
        "not the scale, so that the residual stays bounded", _X,
        named=Switch("fitted scale", "fit", "digits valued by a least-squares fit"),
    )  # fmt: skip
    aggregate: str = setting(
        "requantize", "how aggregates off the shared grid travel: requantize, fp16 or coherent "
        "(levels agreed by all ranks, the ORQ paper's Algorithm 2 option a)", _X, metavar="NAME",
        named=Choice("aggregate", {"fp16": "fp16agg", "coherent": "coherent"},
                     lambda v: f"{v} aggregates"),
    )  # fmt: skip
    policy: str = setting(
        "quantize", "quantize, or auto: quantize only the DDP buckets where it is predicted "
        "to be faster", _X, metavar="NAME",
        named=Choice("policy", {"auto": "auto"}, lambda v: f"{v} policy"),
    )  # fmt: skip
    fuse_buckets: bool = setting(
        False, "exchange a step's DDP buckets together at the last one (fewer collective "
        "rounds, no overlap with the backward pass)", _X,
        named=Switch("fused buckets", "fused", "a step's DDP buckets in one exchange"),
    )  # fmt: skip
    full_precision_steps: int = setting(
        0, "average in full precision for the first K steps, then quantize", _X,
        NON_NEGATIVE_INT, metavar="K",
    )  # fmt: skip
    seed: int = setting(0, "seed of every random draw of the exchange", _X, INT64)
    timeout: float | None = setting(
        None, "seconds a collective may wait for a dead or stuck rank", _X,
        Range(float, lambda v: 0 < v <= MAX_TIMEOUT, "a positive number of seconds, at most "
              f"{MAX_TIMEOUT:.0f} (a year)"),
    )  # fmt: skip

    def __post_init__(self) -> None:
        if not isinstance(self.quantizer, str):
            _fail(f"quantizer must be a name from quantize.names(), got {self.quantizer!r}")
        _one_of("quantizer", self.quantizer, tuple(quantize.names()))
        if not isinstance(self.quantizer_options, Mapping):
            _fail(f"quantizer_options must be a dict, got {self.quantizer_options!r}")
        # read-only: the options were checked once, here
        object.__setattr__(
            self, "quantizer_options", MappingProxyType(dict(self.quantizer_options))
        )
        q = self.make_quantizer()  # raises for an unknown or bad option
        _one_of("topology", self.topology, TOPOLOGIES)
        _one_of("kernels", self.kernels, KERNELS)
        _one_of("policy", self.policy, tuple(POLICIES))
        if not isinstance(q, POLICIES[self.policy]):
            _fail(
                f"policy {self.policy!r} predicts the exchange of the shared-grid quantizers "
                f"(terngrad, qsgd); {self.quantizer} has no such model: use policy 'quantize'"
            )
        Exchange.registry[self.topology].check(q, self.aggregate, self.policy)
        for name in ("error_feedback", "fit_scale", "quantize_last", "fuse_buckets"):
            if not isinstance(getattr(self, name), bool):
                _fail(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.quantize_only is not None and (self.quantize_last or self.min_numel != MIN_NUMEL):
            _fail(
                f"quantize_only {self.quantize_only!r} decides which tensors are quantized (every "
                "one of its class, the small ones and the head's included): give no quantize_last "
                "or min_numel with it"
            )
        if self.fit_scale:
            if not self.error_feedback:
                _fail(
                    "fit_scale shrinks what is sent (a biased compression): it needs "
                    "error_feedback=True to send the rest later"
                )
            check_fit_scale(q)
        check_settings(self)  # min_numel, full_precision_steps, seed, timeout

    @classmethod
    def of(
        cls, quantizer: str | Quantizer = "terngrad", topology: str = "sharded", **settings: Any
    ) -> Options:
        """Options from the flat keywords that :func:`terngrad.ddp.register` takes: the fields
        by name, every other keyword a quantizer option (``clip=2.0``). ``quantizer`` may be a
        :class:`~terngrad.quantize.Quantizer`: its name and options are taken. (A named method
        or preset: :func:`terngrad.comm.spec.methods.hook_options`.)"""
        for old, new in _RENAMED.items():
            if old in settings:
                warn_deprecated(f"{old} is deprecated: use {new}")
        settings = _migrated({"topology": topology, **settings})
        names = {f.name for f in dataclasses.fields(cls)}
        chosen = {k: v for k, v in settings.items() if k in names}
        extra = {k: v for k, v in settings.items() if k not in names}
        q_options = {**chosen.pop("quantizer_options", {}), **extra}
        if isinstance(quantizer, Quantizer):
            if q_options:
                _fail("pass quantizer options to quantize.get, not with a quantizer instance")
            quantizer, q_options = quantizer.name, quantizer.options
        return cls(quantizer=quantizer, quantizer_options=q_options, **chosen)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> Options:
        """The options :meth:`to_dict` wrote, by this version or an earlier one (whose
        ``own_scales`` is now the topology ``own-scales``)."""
        return cls(**_migrated(dict(values)))

    @property
    def exchange_settings(self) -> ExchangeSettings:
        """What the exchange itself does with these options: the fields of
        :class:`~terngrad.comm.exchanges.exchange.ExchangeSettings`, read here by name (an
        exchange setting is a field of both)."""
        names = (f.name for f in dataclasses.fields(ExchangeSettings))
        return ExchangeSettings(**{name: getattr(self, name) for name in names})

    def make_quantizer(self) -> Quantizer:
        """The quantizer these options name: ``quantize.get(quantizer, **quantizer_options)``."""
        return quantize.get(self.quantizer, **self.quantizer_options)

    def replace(self, **changes: Any) -> Options:
        """A copy with ``changes``, checked like a new one."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable fields; ``Options(**d)`` makes the same options again."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {**values, "quantizer_options": dict(self.quantizer_options)}

    def __reduce__(self):  # pickled (spawned workers, all_gather_object) as its fields
        return (_from_dict, (self.to_dict(),))

    def diff(self, other: Options, ignore: tuple[str, ...] = ()) -> list[str]:
        """How ``other`` differs from these options: ``name=<other> instead of <self>``."""
        return differences(self.to_dict(), other.to_dict(), ignore)


def _from_dict(values: dict[str, Any]) -> Options:
    return Options(**values)


#: settings of earlier versions, and what they are now
_RENAMED = {
    "exclude_last": "quantize_last (= not exclude_last)",
    "own_scales": "topology='own-scales' (own_scales=True with topology 'allgather')",
}


def _migrated(settings: dict[str, Any]) -> dict[str, Any]:
    """``settings`` with those of earlier versions (:data:`_RENAMED`) turned into today's."""
    if "exclude_last" in settings:  # the name before 0.2
        settings["quantize_last"] = not settings.pop("exclude_last")
    if settings.pop("own_scales", False) is True:  # a topology of its own since 0.3
        if settings.get("topology", "sharded") != "allgather":
            _fail(
                "own_scales=True went with topology 'allgather' only; it is now the topology "
                "'own-scales': give topology='own-scales'"
            )
        settings["topology"] = "own-scales"
    return settings
