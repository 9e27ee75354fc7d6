"""Every way to average gradients that terngrad compares: a spec built from its parts, with a
name written by one rule.

A :class:`Method` is PyTorch's own averaging (``baseline``: DDP's fp32 all-reduce,
``fp16_compress_hook``, ``powerSGD_hook``) or terngrad's hook with its :class:`Options`
(quantizer and its options, topology, exchange settings), and then what the run does around
it: an optimizer ``recipe`` (:class:`FrozenVariance`, :class:`LocalVariance`) and a
full-precision ``warmup`` (a share of the run's steps averaged in fp32 first, 1-bit Adam's
warm-up, Tang et al. 2021, Sec. 4).

**The name is the spec** (:func:`parse` reads it, :attr:`Method.name` writes it)::

    head [-levels] [-topology] [-b<N>] [-noclip | -clip<C>] [-2bit] [-last] [-min<N>] [-ef]
         [-fp16agg | -coherent] [-auto] [-fused] [-frozen<F> | -localvar<N>] [-warmup<F>]

* ``head``: ``fp32``, ``fp16`` or ``powersgd`` alone are PyTorch's own; any quantizer name
  (``terngrad``, ``qsgd``, ``bingrad-b``, ... and ``fp32``/``fp16`` with a topology) is
  terngrad's hook;
* ``levels``: the level quantizers' ``levels`` (``qsgd-5``);
* ``topology``: ``ps``, ``allgather``, ``own-scales``; ``sharded``, the default, is written
  only after ``fp32``/``fp16`` (``fp32-sharded``: fp32 through terngrad's exchange);
* the quantizer's ``bucket_size`` (``b512``), clipping (``noclip``, ``clip2``), 2-bit packing;
* the exchange's settings: ``last`` (quantize_last), ``min<N>`` (min_numel), ``ef`` (error
  feedback), the aggregate, the ``auto`` policy, ``fused`` (fuse_buckets);
* the recipe: ``frozen<F>`` (AdamW's variance frozen after the share F of the steps, its
  preconditioned momentum exchanged) or ``localvar<N>`` (AdamW's momentum exchanged, its
  variance each rank's own, averaged every N steps);
* ``warmup<F>``: the share F of the steps averaged in full precision first.

A setting at its default is not written, and the parts come in this order, so a method has
exactly one name: ``terngrad-own-scales-b256`` is TernGrad on each rank's own scales with a
scale per 256 elements — any such name works wherever a method is taken, and the table
(:data:`METHODS`) lists the ones the benchmarks compare. Older names (:data:`ALIASES`) still
work, with a deprecation warning. A run's seed, timeout and kernels are not part of a method.

Every consumer says what it can honour (:meth:`Method.require`) and refuses the rest in one
line: no part of a method is dropped silently.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from terngrad import quantize
from terngrad.comm.options import MIN_NUMEL, Options
from terngrad.comm.topologies import TOPOLOGIES
from terngrad.util.deprecation import warn_deprecated

#: PyTorch's own averaging, by the name a method calls it (:mod:`terngrad.train.baselines`
#: runs them)
BASELINES: Mapping[str, str] = {
    "fp32": "DDP fp32 all-reduce",
    "fp16": "PyTorch fp16_compress_hook",
    "powersgd": "PyTorch powerSGD_hook (rank 2, one bucket)",
}
#: the rank of PowerSGD's low-rank factors
POWERSGD_RANK = 2


@dataclass(frozen=True)
class FrozenVariance:
    """AdamW's variance frozen after the ``share`` of the run's steps, its preconditioned
    momentum exchanged from then on (:class:`terngrad.optim.FrozenVarianceAdamW`, 1-bit Adam's
    scheme)."""

    share: float
    optimizer: ClassVar[str] = "frozen-adamw"

    @property
    def token(self) -> str:
        return f"frozen{_number(self.share)}"

    @property
    def words(self) -> str:
        return (
            f"AdamW's variance frozen after {_percent(self.share)} of the steps, its "
            "preconditioned momentum exchanged"
        )


@dataclass(frozen=True)
class LocalVariance:
    """AdamW's momentum exchanged, its variance each rank's own, averaged over the ranks every
    ``every`` steps (:class:`terngrad.optim.LocalVarianceAdamW`)."""

    every: int
    optimizer: ClassVar[str] = "local-adamw"

    @property
    def token(self) -> str:
        return f"localvar{self.every}"

    @property
    def words(self) -> str:
        return (
            "AdamW's momentum exchanged, its variance each rank's own, averaged every "
            f"{self.every} steps"
        )


Recipe = FrozenVariance | LocalVariance


@dataclass(frozen=True)
class Method:
    """One way to average gradients: a PyTorch ``baseline`` (a key of :data:`BASELINES`) or
    terngrad's hook with ``exchange`` options; with the hook, an optimizer ``recipe`` and a
    full-precision ``warmup`` (a share of the steps, in [0, 1)). Its :attr:`name` is written by
    the module's rule; :attr:`label` says it in words."""

    baseline: str | None = None
    exchange: Options | None = field(default=None, hash=False)
    recipe: Recipe | None = None
    warmup: float = 0.0

    def __post_init__(self) -> None:
        if (self.baseline is None) == (self.exchange is None):
            raise ValueError("a method is either a PyTorch baseline or terngrad's exchange")
        if self.baseline is not None:
            if self.baseline not in BASELINES:
                raise ValueError(
                    f"unknown baseline {self.baseline!r}; choose one of: {', '.join(BASELINES)}"
                )
            if self.recipe is not None or self.warmup:
                raise ValueError(f"{self.baseline} is PyTorch's own: it takes no recipe or warm-up")
            return
        x = self.exchange
        run_level = x.replace(seed=0, timeout=None, kernels="auto", full_precision_steps=0)
        if run_level != x:
            raise ValueError(
                "a method's exchange leaves the run's settings at their defaults (seed, timeout, "
                "kernels; full_precision_steps is its warm-up share): "
                + "; ".join(x.diff(run_level))
            )
        if not (isinstance(self.warmup, int | float) and 0 <= self.warmup < 1):
            raise ValueError(f"warmup is a share of the steps in [0, 1), got {self.warmup!r}")
        named = _named_options(x)
        if named != dict(x.quantizer_options):  # one spec, one form: defaults left out
            object.__setattr__(self, "exchange", x.replace(quantizer_options=named))

    # --------------------------------------------------------------------------- name, words

    @property
    def name(self) -> str:
        """The method's one name (the module's rule)."""
        if self.baseline is not None:
            return self.baseline
        return "-".join(_render(self))

    @property
    def label(self) -> str:
        """The method in words, for tables and plots."""
        if self.baseline is not None:
            return BASELINES[self.baseline]
        return _words(self)

    def __str__(self) -> str:
        return self.name

    # --------------------------------------------------------------------------- use

    @property
    def one_bucket(self) -> bool:
        """True where DDP must run in a single bucket (PowerSGD: it hangs on gloo with more)."""
        return self.baseline == "powersgd"

    def quantizer(self) -> quantize.Quantizer | None:
        """What the method does to one tensor as a quantizer: the hook's quantizer, fp32/fp16
        for PyTorch's plain and fp16 all-reduce, ``None`` for PowerSGD (a low-rank method)."""
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

    def require(
        self,
        consumer: str,
        *,
        baselines: Iterable[str] = tuple(BASELINES),
        recipe: bool = False,
        warmup: bool = False,
        exchange: Callable[[Options], str | None] | None = None,
    ) -> Method:
        """This method, if ``consumer`` can honour all of it: the PyTorch ``baselines`` it runs,
        whether it runs an optimizer ``recipe`` and a full-precision ``warmup``, and
        ``exchange``: what it cannot do with given options, in words (``None``: it can).
        ``ValueError`` with one line naming the part it cannot honour otherwise."""
        why = None
        if self.baseline is not None and self.baseline not in baselines:
            why = f"it does not run PyTorch's {self.baseline}"
        elif self.recipe is not None and not recipe:
            why = f"it does not run the optimizer recipe ({self.recipe.words})"
        elif self.warmup and not warmup:
            why = f"it does not run a full-precision warm-up ({_percent(self.warmup)} of the steps)"
        elif self.exchange is not None and exchange is not None:
            why = exchange(self.exchange)
        if why:
            raise ValueError(f"{consumer} cannot run method {self.name}: {why}")
        return self


# --------------------------------------------------------------------------- the rule

_QUANTIZER_WORDS = {
    "terngrad": "TernGrad", "qsgd": "QSGD", "linear": "Linear", "orq": "ORQ",
    "bingrad-b": "BinGrad-b", "bingrad-pb": "BinGrad-pb", "signsgd": "scaled sign",
    "fp32": "fp32", "fp16": "fp16",
}  # fmt: skip
_TOPOLOGY_WORDS = {
    "sharded": "sharded",
    "ps": "parameter server",
    "allgather": "all-gather",
    "own-scales": "each rank's own scales (one collective a bucket)",
}
_AGGREGATE_TOKENS = {"fp16": "fp16agg", "coherent": "coherent"}
#: the quantizer options a name can hold
_NAMED_OPTIONS = ("levels", "bucket_size", "clip", "packing")


def _number(value: float) -> str:
    return f"{value:g}"


def _percent(share: float) -> str:
    return f"{100 * share:g}%"


def _named_options(x: Options) -> dict[str, Any]:
    """The quantizer options of ``x`` that differ from the quantizer's defaults, and its
    ``levels`` where it has levels: the options a name writes. ``ValueError`` for one that no
    name can hold."""
    defaults = quantize.get(x.quantizer).options
    named = {k: v for k, v in x.quantizer_options.items() if k not in defaults or v != defaults[k]}
    if "levels" in defaults:
        named.setdefault("levels", defaults["levels"])
    unnamed = sorted(set(named) - set(_NAMED_OPTIONS))
    if named.get("bucket_size", 1) is None:
        unnamed.append("bucket_size=None")
    if unnamed:
        raise ValueError(f"no method name holds the quantizer option {', '.join(unnamed)}")
    return named


def _render(m: Method) -> list[str]:
    """The tokens of ``m``'s name, in the rule's order."""
    x = m.exchange
    q = dict(x.quantizer_options)
    tokens = [x.quantizer]
    if "levels" in q:
        tokens.append(str(q["levels"]))
    if x.topology != "sharded" or x.quantizer in BASELINES:
        tokens.append(x.topology)
    if "bucket_size" in q:
        tokens.append(f"b{q['bucket_size']}")
    if "clip" in q:
        tokens.append("noclip" if q["clip"] is None else f"clip{_number(q['clip'])}")
    if "packing" in q:
        tokens.append(str(q["packing"]))
    if x.quantize_last:
        tokens.append("last")
    if x.min_numel != MIN_NUMEL:
        tokens.append(f"min{x.min_numel}")
    if x.error_feedback:
        tokens.append("ef")
    if x.aggregate != "requantize":
        tokens.append(_AGGREGATE_TOKENS[x.aggregate])
    if x.policy != "quantize":
        tokens.append(x.policy)
    if x.fuse_buckets:
        tokens.append("fused")
    if m.recipe is not None:
        tokens.append(m.recipe.token)
    if m.warmup:
        tokens.append(f"warmup{_number(m.warmup)}")
    return tokens


def _words(m: Method) -> str:
    x = m.exchange
    q = dict(x.quantizer_options)
    head = _QUANTIZER_WORDS.get(x.quantizer, x.quantizer)
    if "levels" in q:
        head += f" {q['levels']} levels"
    parts = [head + ("" if x.quantizer not in BASELINES else " through terngrad's exchange"),
             _TOPOLOGY_WORDS[x.topology]]  # fmt: skip
    if "bucket_size" in q:
        parts.append(f"a scale per {q['bucket_size']} elements")
    if "clip" in q:
        parts.append("no clipping" if q["clip"] is None else f"clipped at {q['clip']:g} sigma")
    if "packing" in q:
        parts.append(f"{q['packing']} packing")
    if x.quantize_last:
        parts.append("the last layer quantized")
    if x.min_numel != MIN_NUMEL:
        parts.append(
            "small tensors quantized" if x.min_numel == 0
            else f"tensors under {x.min_numel} elements in fp32"
        )  # fmt: skip
    if x.error_feedback:
        parts.append("error feedback")
    if x.aggregate != "requantize":
        parts.append(f"{x.aggregate} aggregates")
    if x.policy != "quantize":
        parts.append(f"{x.policy} policy")
    if x.fuse_buckets:
        parts.append("a step's DDP buckets in one exchange")
    words = ", ".join(parts)
    if m.recipe is not None:
        words += "; " + m.recipe.words
    if m.warmup:
        words += f"; after full-precision steps ({_percent(m.warmup)} of the run)"
    return words


def _integer(text: str) -> int:
    return int(text)


#: the rule's slots in order: (what, pattern, what the match sets)
_SLOTS: tuple[tuple[str, str, Callable[[re.Match], dict[str, Any]]], ...] = (
    ("levels", r"(\d+)", lambda g: {"q": {"levels": _integer(g[1])}}),
    ("topology", "|".join(map(re.escape, TOPOLOGIES)), lambda g: {"x": {"topology": g[0]}}),
    ("bucket size", r"b(\d+)", lambda g: {"q": {"bucket_size": _integer(g[1])}}),
    ("clipping", r"noclip|clip(\d+(?:\.\d+)?)",
     lambda g: {"q": {"clip": None if g[0] == "noclip" else float(g[1])}}),
    ("packing", r"2bit", lambda g: {"q": {"packing": g[0]}}),
    ("last layer", r"last", lambda g: {"x": {"quantize_last": True}}),
    ("min numel", r"min(\d+)", lambda g: {"x": {"min_numel": _integer(g[1])}}),
    ("error feedback", r"ef", lambda g: {"x": {"error_feedback": True}}),
    ("aggregate", r"fp16agg|coherent",
     lambda g: {"x": {"aggregate": {v: k for k, v in _AGGREGATE_TOKENS.items()}[g[0]]}}),
    ("policy", r"auto", lambda g: {"x": {"policy": "auto"}}),
    ("fused buckets", r"fused", lambda g: {"x": {"fuse_buckets": True}}),
    ("recipe", r"frozen(\d*\.?\d+)|localvar(\d+)",
     lambda g: {"recipe": FrozenVariance(float(g[1])) if g[1] else LocalVariance(int(g[2]))}),
    ("warm-up", r"warmup(\d*\.?\d+)", lambda g: {"warmup": float(g[1])}),
)  # fmt: skip


def parse(name: str) -> Method:
    """The method ``name`` says (the module's rule); ``ValueError`` with one line naming what
    is wrong (an unknown part, parts out of order, a name written otherwise than the rule)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"a method is named by a string, got {name!r}")
    if name in BASELINES:
        return Method(baseline=name)
    heads = sorted(quantize.names(), key=len, reverse=True)
    head = next((h for h in heads if name == h or name.startswith(h + "-")), None)
    if head is None:
        raise ValueError(
            f"unknown method {name!r}: a method starts with fp32, fp16, powersgd or a quantizer "
            f"({', '.join(quantize.names())}): see docs/methods.md"
        )
    words = name[len(head) + 1 :].split("-") if name != head else []
    tokens: list[str] = []
    for word in words:  # a topology of two words: own-scales
        if tokens and f"{tokens[-1]}-{word}" in TOPOLOGIES:
            tokens[-1] += f"-{word}"
        else:
            tokens.append(word)
    q: dict[str, Any] = {}
    x: dict[str, Any] = {}
    rest: dict[str, Any] = {}
    slot = 0
    for token in tokens:
        found = next((k for k, (_, p, _) in enumerate(_SLOTS) if re.fullmatch(p, token)), None)
        if found is None:
            raise ValueError(f"method {name!r}: unknown part {token!r} ({_SYNTAX})")
        if found < slot:
            raise ValueError(
                f"method {name!r}: {_SLOTS[found][0]} ({token}) comes before "
                f"{_SLOTS[slot - 1][0]} ({_SYNTAX})"
            )
        slot = found + 1
        got = _SLOTS[found][2](re.fullmatch(_SLOTS[found][1], token))
        q.update(got.pop("q", {}))
        x.update(got.pop("x", {}))
        rest.update(got)
    if head in BASELINES and "topology" not in x:
        raise ValueError(
            f"method {name!r}: {head} with settings goes through terngrad's exchange: name its "
            f"topology ({head}-sharded-...); {head} alone is PyTorch's own"
        )
    method = Method(exchange=Options(head, quantizer_options=q, **x), **rest)
    if method.name != name:
        raise ValueError(f"method {name!r} is written {method.name!r} ({_SYNTAX})")
    return method


_SYNTAX = (
    "a method is head[-levels][-topology][-b<N>][-noclip|-clip<C>][-2bit][-last][-min<N>][-ef]"
    "[-fp16agg|-coherent][-auto][-fused][-frozen<F>|-localvar<N>][-warmup<F>], defaults "
    "left out: see docs/methods.md"
)

# --------------------------------------------------------------------------- the table

#: the methods the benchmarks, reproductions and the study compare (any other name the rule
#: reads works too): adding one is adding its name here
METHODS: dict[str, Method] = {
    m.name: m
    for m in map(parse, (
        "fp32", "fp16", "powersgd", "fp32-sharded",
        "terngrad", "terngrad-fused", "terngrad-ps", "terngrad-allgather",
        "terngrad-own-scales", "terngrad-own-scales-fused",
        "terngrad-noclip", "terngrad-b512", "terngrad-b2048", "terngrad-ef",
        "terngrad-warmup0.2", "terngrad-b512-warmup0.2",
        "terngrad-b512-ef-frozen0.2",
        "fp32-sharded-localvar100", "terngrad-b512-ef-localvar100",
        "terngrad-b512-last-min0-ef-localvar100",
        "terngrad-b512-noclip-last-min0-ef-localvar100",
        *(f"{family}-{levels}" for family in ("qsgd", "linear", "orq") for levels in (3, 5, 9)),
        "bingrad-b", "bingrad-pb", "signsgd", "signsgd-b512",
    ))
}  # fmt: skip

#: older names, and the names of the methods they are (each still works, with a warning);
#: ``transformer`` was a preset, now the method it always was
ALIASES: Mapping[str, str] = {
    "qsgd": "qsgd-5",
    "orq": "orq-5",
    "terngrad-own": "terngrad-own-scales",
    "terngrad-own-fused": "terngrad-own-scales-fused",
    "terngrad-fp": "terngrad-warmup0.2",
    "terngrad-b512-fp": "terngrad-b512-warmup0.2",
    "terngrad-momentum": "terngrad-b512-ef-frozen0.2",
    "fp32-localvar": "fp32-sharded-localvar100",
    "terngrad-localvar": "terngrad-b512-ef-localvar100",
    "terngrad-localvar-all": "terngrad-b512-last-min0-ef-localvar100",
    "terngrad-localvar-all-noclip": "terngrad-b512-noclip-last-min0-ef-localvar100",
    "transformer": "terngrad-b512",
}


def canonical(name: str) -> str:
    """The name of today's method for ``name``, an older one (:data:`ALIASES`) included,
    without a warning: for reading results written before."""
    return ALIASES.get(name, name)


def get(name: str | Method) -> Method:
    """The method ``name`` says (a name of the rule, or an older one, with a
    ``FutureWarning``); ``ValueError`` with one line otherwise."""
    if isinstance(name, Method):
        return name
    if name in ALIASES:
        warn_deprecated(f"method {name} is now called {ALIASES[name]}")
        name = ALIASES[name]
    known = METHODS.get(name)
    return known if known is not None else parse(name)


def select(names: Iterable[str], allowed: Iterable[str] | None = None) -> list[Method]:
    """The methods ``names``, in order: each a method (and among ``allowed`` where given),
    none twice; ``ValueError`` with one line otherwise."""
    names = list(names)
    if not names:
        choices = list(allowed) if allowed is not None else list(METHODS)
        raise ValueError(f"give at least one method; choose from: {', '.join(choices)}")
    chosen = [get(name) for name in names]
    if allowed is not None:
        allowed = [get(a).name for a in allowed]
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


def hook_options(
    quantizer: str | quantize.Quantizer = "terngrad",
    topology: str = "sharded",
    *,
    method: str | Method | None = None,
    preset: str | None = None,
    **settings: Any,
) -> Options:
    """The hook's options from the flat keywords that :func:`terngrad.ddp.register` takes
    (:meth:`Options.of`), or from a ``method`` of the hook's with those keywords put over it
    (a quantizer or topology other than the defaults too): ``method="terngrad-b512",
    seed=3``. ``preset`` is ``method``'s older name. A method the hook alone cannot run (a
    PyTorch baseline, an optimizer recipe, a warm-up share) is refused in one line."""
    if preset is not None:
        if method is not None:
            raise ValueError("give method=, not preset= too (preset is its older name)")
        warn_deprecated("preset= is deprecated: use method=")
        method = preset
    if method is None:
        return Options.of(quantizer, topology, **settings)
    if not isinstance(quantizer, str):
        raise ValueError(
            "a method names its quantizer: give the quantizer by name, not an instance"
        )
    m = get(method).require(
        "the terngrad hook", baselines=(),
        recipe=False, warmup=False,
    )  # fmt: skip
    given = dict(settings)
    if quantizer != "terngrad":
        given["quantizer"] = quantizer
    if topology != "sharded":
        given["topology"] = topology
    fields = {f for f in Options.__dataclass_fields__}
    q_options = {**given.pop("quantizer_options", {}),
                 **{k: given.pop(k) for k in list(given) if k not in fields}}  # fmt: skip
    return m.options(**given, quantizer_options=q_options)
