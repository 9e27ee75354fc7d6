"""A method as a spec, and the rule that names it (:mod:`terngrad.comm.methods` is the table,
the older names and the lookups; read its docstring first).

:class:`Method` is PyTorch's ``baseline`` or terngrad's ``exchange`` options, with an optimizer
``recipe`` (:class:`FrozenVariance`, :class:`LocalVariance`) and a full-precision ``warmup``;
:attr:`Method.name` writes its one name, :func:`parse` reads a name back, :attr:`Method.label`
says it in words, :meth:`Method.require` is what a consumer honours.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from terngrad import quantize
from terngrad.comm.options import MIN_NUMEL, Options
from terngrad.comm.topologies import TOPOLOGIES

#: PyTorch's own averaging, by the name a method calls it (:mod:`terngrad.train.baselines`
#: runs them)
BASELINES: Mapping[str, str] = {
    "fp32": "DDP fp32 all-reduce",
    "fp16": "PyTorch fp16_compress_hook",
    "powersgd": "PyTorch powerSGD_hook (one bucket)",
}
#: the rank of PowerSGD's low-rank factors where a method names none (``powersgd``;
#: ``powersgd-r8``: rank 8)
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
    #: local steps (DiLoCo): ``H``, or ``"auto"`` (chosen at run time); 1: none
    local_steps: int | str = 1
    #: with local steps: the outer exchange behind the next inner steps, one outer step late
    outer_overlap: bool = False
    #: PowerSGD's rank (``matrix_approximation_rank``): the ``powersgd`` baseline's only setting
    powersgd_rank: int = POWERSGD_RANK

    def __post_init__(self) -> None:
        if (self.baseline is None) == (self.exchange is None):
            raise ValueError("a method is either a PyTorch baseline or terngrad's exchange")
        if self.baseline is not None:
            if self.baseline not in BASELINES:
                raise ValueError(
                    f"unknown baseline {self.baseline!r}; choose one of: {', '.join(BASELINES)}"
                )
            if (
                self.recipe is not None
                or self.warmup
                or self.local_steps != 1
                or (self.outer_overlap)
            ):
                raise ValueError(
                    f"{self.baseline} is PyTorch's own: it takes no recipe, warm-up or local steps"
                )
        if (
            isinstance(self.powersgd_rank, bool)
            or not isinstance(self.powersgd_rank, int)
            or self.powersgd_rank < 1
        ):
            raise ValueError(f"powersgd_rank must be an integer >= 1, got {self.powersgd_rank!r}")
        if self.powersgd_rank != POWERSGD_RANK and self.baseline != "powersgd":
            other = self.baseline or "terngrad's hook"
            raise ValueError(f"powersgd_rank is PowerSGD's rank; {other} has none")
        if self.baseline is not None:
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
        if self.local_steps != "auto" and (
            isinstance(self.local_steps, bool)
            or not isinstance(self.local_steps, int)
            or (self.local_steps < 1)
        ):
            raise ValueError(
                f"local_steps must be an integer >= 1 or 'auto', got {self.local_steps!r}"
            )
        if self.outer_overlap and self.local_steps == 1:
            raise ValueError("outer_overlap overlaps the outer exchange of local steps: give H")
        if self.local_steps != 1 and (
            self.recipe is not None or self.warmup or x.fuse_buckets or x.policy != "quantize"
        ):
            raise ValueError(
                "local steps (DiLoCo) average the pseudo-gradients once every H steps with the "
                "run's own optimizer: no optimizer recipe, warm-up, fused buckets or auto policy"
            )
        named = _named_options(x)
        if named != dict(x.quantizer_options):  # one spec, one form: defaults left out
            object.__setattr__(self, "exchange", x.replace(quantizer_options=named))

    # --------------------------------------------------------------------------- name, words

    @property
    def name(self) -> str:
        """The method's one name (the module's rule)."""
        if self.baseline == "powersgd" and self.powersgd_rank != POWERSGD_RANK:
            return f"powersgd-r{self.powersgd_rank}"
        if self.baseline is not None:
            return self.baseline
        return "-".join(_render(self))

    @property
    def label(self) -> str:
        """The method in words, for tables and plots."""
        if self.baseline == "powersgd":
            return f"PyTorch powerSGD_hook (rank {self.powersgd_rank}, one bucket)"
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
        local: bool = False,
        exchange: Callable[[Options], str | None] | None = None,
    ) -> Method:
        """This method, if ``consumer`` can honour all of it: the PyTorch ``baselines`` it runs,
        whether it runs an optimizer ``recipe``, a full-precision ``warmup`` and ``local``
        steps (DiLoCo), and
        ``exchange``: what it cannot do with given options, in words (``None``: it can).
        ``ValueError`` with one line naming the part it cannot honour otherwise."""
        why = None
        if self.baseline is not None and self.baseline not in baselines:
            why = f"it does not run PyTorch's {self.baseline}"
        elif self.recipe is not None and not recipe:
            why = f"it does not run the optimizer recipe ({self.recipe.words})"
        elif self.local_steps != 1 and not local:
            why = f"it does not run local steps (DiLoCo, an outer step every {self.local_steps})"
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
    if x.fit_scale:
        tokens.append("fit")
    if x.aggregate != "requantize":
        tokens.append(_AGGREGATE_TOKENS[x.aggregate])
    if x.policy != "quantize":
        tokens.append(x.policy)
    if x.fuse_buckets:
        tokens.append("fused")
    if m.local_steps != 1:
        tokens.append(f"local{m.local_steps}")
    if m.outer_overlap:
        tokens.append("overlap")
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
    if x.fit_scale:
        parts.append("digits valued by a least-squares fit")
    if x.aggregate != "requantize":
        parts.append(f"{x.aggregate} aggregates")
    if x.policy != "quantize":
        parts.append(f"{x.policy} policy")
    if x.fuse_buckets:
        parts.append("a step's DDP buckets in one exchange")
    words = ", ".join(parts)
    if m.local_steps != 1:
        h = (
            "H (chosen from the measured step and exchange)"
            if m.local_steps == "auto"
            else (m.local_steps)
        )
        words += (
            f"; local steps: each replica {h} steps on its own, then their "
            "pseudo-gradients averaged this way and a Nesterov outer step (DiLoCo)"
        )
    if m.outer_overlap:
        words += ", the exchange behind the next inner steps (its update one outer step late)"
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
    ("fitted scale", r"fit", lambda g: {"x": {"fit_scale": True}}),
    ("aggregate", r"fp16agg|coherent",
     lambda g: {"x": {"aggregate": {v: k for k, v in _AGGREGATE_TOKENS.items()}[g[0]]}}),
    ("policy", r"auto", lambda g: {"x": {"policy": "auto"}}),
    ("fused buckets", r"fused", lambda g: {"x": {"fuse_buckets": True}}),
    ("local steps", r"local(\d+|auto)",
     lambda g: {"local_steps": "auto" if g[1] == "auto" else _integer(g[1])}),
    ("overlap", r"overlap", lambda g: {"outer_overlap": True}),
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
    rank = re.fullmatch(r"powersgd-r(\d+)", name)
    if rank:
        method = Method(baseline="powersgd", powersgd_rank=_integer(rank[1]))
        if method.name != name:
            raise ValueError(
                f"method {name!r} is written {method.name!r} (rank {POWERSGD_RANK} is "
                "powersgd's own, not written)"
            )
        return method
    if name.startswith("powersgd-"):
        raise ValueError(
            f"method {name!r}: PyTorch's PowerSGD takes one setting, its rank: powersgd-r<K> "
            "(powersgd-r8), or powersgd for rank 2"
        )
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
    "[-fp16agg|-coherent][-auto][-fused][-local<H>|-localauto][-overlap][-frozen<F>|-localvar<N>]"
    "[-warmup<F>], defaults "
    "left out: see docs/methods.md"
)
