"""The rule that names a method: :func:`render` writes a :class:`~.method_spec.Method`'s
tokens in the rule's order, :func:`words` says it for tables and plots, :func:`parse` reads a
name back, refusing one written otherwise (the syntax: :data:`SYNTAX`; docs/methods.md).

Each setting of the rule is declared once, as one :class:`_Slot` of :data:`_SLOTS`: how the
syntax writes it, its token's pattern and what the token sets, the token a method holds and
its words. The four functions above read that one table: a new setting is one more slot.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from terngrad import quantize
from terngrad.comm.exchanges.topologies import TOPOLOGIES
from terngrad.comm.spec.local import MAX_COMM_SHARE, OUTER_LR, OUTER_MOMENTUM, LocalSteps
from terngrad.comm.spec.method_spec import (
    BASELINES,
    POWERSGD_RANK,
    FrozenVariance,
    LocalVariance,
    Method,
    _number,
    _percent,
)
from terngrad.comm.spec.options import Options
from terngrad.comm.spec.tokens import Number, Switch, Token
from terngrad.util.settings import settings_of

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


@dataclass(frozen=True)
class _Slot:
    """One setting of the rule, declared once: how :data:`SYNTAX` writes it, its token's
    pattern and what a matched token sets (``"q"``: quantizer options, ``"x"``: exchange
    options, ``"l"``: local steps, else the method's own fields), the token a method's name
    holds (``None``: the default, left out) and its words (the separator before them, and
    them; ``None``: none)."""

    what: str
    syntax: str
    pattern: str
    sets: Callable[[re.Match[str]], dict[str, Any]]
    token: Callable[[Method], str | None]
    words: Callable[[Method], tuple[str, str] | None]


def _q(m: Method) -> dict[str, Any]:
    assert m.exchange is not None
    return dict(m.exchange.quantizer_options)


def _x(m: Method) -> Options:
    assert m.exchange is not None
    return m.exchange


def _named_fields() -> list[tuple[dataclasses.Field, Token]]:
    """The fields of :class:`Options` that a name holds, in their order, with their tokens."""
    return [(f, s.named) for f, s in settings_of(Options) if s.named is not None]


def _field_slot(field: str, named: Token) -> _Slot:
    """The slot of the exchange setting ``field``, as its declaration (``named``) writes it:
    ``-token`` for a :class:`Switch`, ``-<prefix><N>`` for a :class:`Number`, one token a value
    for a :class:`Choice`; left out at the field's default."""
    default = Options.__dataclass_fields__[field].default

    def value(m: Method) -> Any:
        v = getattr(_x(m), field)
        return None if v == default else v

    if isinstance(named, Switch):
        return _Slot(named.what, f"[-{named.token}]", re.escape(named.token),
                     lambda g: {"x": {field: True}},
                     lambda m: named.token if value(m) else None,
                     lambda m: (", ", named.words) if value(m) else None)  # fmt: skip

    def said(m: Method) -> tuple[str, str] | None:
        return None if value(m) is None else (", ", named.words(value(m)))

    if isinstance(named, Number):
        prefix = named.prefix
        return _Slot(named.what, f"[-{prefix}<N>]", re.escape(prefix) + r"(\d+)",
                     lambda g: {"x": {field: _integer(g[1])}},
                     lambda m: None if value(m) is None else f"{prefix}{value(m)}",
                     said)  # fmt: skip
    values = {token: v for v, token in named.tokens.items()}
    return _Slot(named.what, "[" + "|".join(f"-{t}" for t in values) + "]",
                 "|".join(map(re.escape, values)), lambda g: {"x": {field: values[g[0]]}},
                 lambda m: None if value(m) is None else named.tokens[value(m)], said)  # fmt: skip


def _local_words(m: Method) -> tuple[str, str] | None:
    if m.local is None:
        return None
    h = (
        m.local.every
        if m.local.every != "auto"
        else "H (chosen from the measured step and exchange)"
    )
    step = "a Nesterov outer step" if m.local.nesterov else "an outer step"
    return ("; ", f"local steps: each replica {h} steps on its own, then their pseudo-gradients "
                  f"averaged this way and {step} (DiLoCo)")  # fmt: skip


def _local_slot(what: str, token: str, field: str, default: float, said: str) -> _Slot:
    """A slot of one number of the local steps, left out at its ``default``: ``-token<X>``."""

    def value(m: Method) -> float | None:
        v = None if m.local is None else getattr(m.local, field)
        return None if v is None or v == default else v

    return _Slot(
        what,
        f"[-{token}<X>]",
        token + _NUMBER,
        lambda g: {"l": {field: float(g[1])}},
        lambda m: None if value(m) is None else f"{token}{_number(value(m))}",
        lambda m: None if value(m) is None else (", ", said.format(value(m))),
    )


def _heavy_ball(m: Method) -> bool:
    return m.local is not None and m.local.outer_momentum > 0 and not m.local.nesterov


#: a number in a name: 0.5, 2, .05, 1e-05
_NUMBER = r"(\d*\.?\d+(?:e-?\d+)?)"


def _integer(text: str) -> int:
    return int(text)


#: the rule's slots, in the order of a name's tokens and of its words
_SLOTS: tuple[_Slot, ...] = (
    _Slot("levels", "[-levels]", r"(\d+)", lambda g: {"q": {"levels": _integer(g[1])}},
          lambda m: str(_q(m)["levels"]) if "levels" in _q(m) else None,
          lambda m: (" ", f"{_q(m)['levels']} levels") if "levels" in _q(m) else None),
    _Slot("topology", "[-topology]", "|".join(map(re.escape, TOPOLOGIES)),
          lambda g: {"x": {"topology": g[0]}},
          lambda m: _x(m).topology
          if _x(m).topology != "sharded" or _x(m).quantizer in BASELINES else None,
          lambda m: (" through terngrad's exchange, " if _x(m).quantizer in BASELINES else ", ",
                     _TOPOLOGY_WORDS[_x(m).topology])),
    _Slot("bucket size", "[-b<N>]", r"b(\d+)", lambda g: {"q": {"bucket_size": _integer(g[1])}},
          lambda m: f"b{_q(m)['bucket_size']}" if "bucket_size" in _q(m) else None,
          lambda m: (", ", f"a scale per {_q(m)['bucket_size']} elements")
          if "bucket_size" in _q(m) else None),
    _Slot("clipping", "[-noclip|-clip<C>]", r"noclip|clip(\d+(?:\.\d+)?)",
          lambda g: {"q": {"clip": None if g[0] == "noclip" else float(g[1])}},
          lambda m: None if "clip" not in _q(m)
          else "noclip" if _q(m)["clip"] is None else f"clip{_number(_q(m)['clip'])}",
          lambda m: None if "clip" not in _q(m)
          else (", ", "no clipping" if _q(m)["clip"] is None
                else f"clipped at {_q(m)['clip']:g} sigma")),
    _Slot("packing", "[-2bit]", r"2bit", lambda g: {"q": {"packing": g[0]}},
          lambda m: str(_q(m)["packing"]) if "packing" in _q(m) else None,
          lambda m: (", ", f"{_q(m)['packing']} packing") if "packing" in _q(m) else None),
    *(_field_slot(f.name, named) for f, named in _named_fields()),
    _Slot("local steps", "[-local<H>|-localauto]", r"local(\d+|auto)",
          lambda g: {"l": {"every": "auto" if g[1] == "auto" else _integer(g[1])}},
          lambda m: f"local{m.local_steps}" if m.local is not None else None, _local_words),
    _local_slot("comm share", "share", "max_comm_share", MAX_COMM_SHARE,
                "H chosen for the exchange to take at most {:.0%} of the time"),
    _local_slot("outer lr", "olr", "outer_lr", OUTER_LR, "outer lr {:g}"),
    _local_slot("outer momentum", "om", "outer_momentum", OUTER_MOMENTUM,
                "outer momentum {:g}"),
    _Slot("heavy ball", "[-heavyball]", r"heavyball", lambda g: {"l": {"nesterov": False}},
          lambda m: "heavyball" if _heavy_ball(m) else None,
          lambda m: (", ", "Polyak's heavy-ball outer momentum") if _heavy_ball(m) else None),
    _Slot("overlap", "[-overlap]", r"overlap", lambda g: {"l": {"overlap": True}},
          lambda m: "overlap" if m.outer_overlap else None,
          lambda m: (", ", "the exchange behind the next inner steps (its update one outer "
                           "step late)") if m.outer_overlap else None),
    _Slot("across nodes", "[-nodes]", r"nodes", lambda g: {"l": {"across_nodes": True}},
          lambda m: "nodes" if m.local is not None and m.local.across_nodes else None,
          lambda m: (", ", "each node one replica (DDP inside it), the exchange across nodes")
          if m.local is not None and m.local.across_nodes else None),
    _Slot("recipe", "[-frozen<F>|-localvar<N>]", r"frozen(\d*\.?\d+)|localvar(\d+)",
          lambda g: {"recipe": FrozenVariance(float(g[1])) if g[1] else LocalVariance(int(g[2]))},
          lambda m: m.recipe.token if m.recipe is not None else None,
          lambda m: ("; ", m.recipe.words) if m.recipe is not None else None),
    _Slot("warm-up", "[-warmup<F>]", r"warmup(\d*\.?\d+)", lambda g: {"warmup": float(g[1])},
          lambda m: f"warmup{_number(m.warmup)}" if m.warmup else None,
          lambda m: ("; ", f"after full-precision steps ({_percent(m.warmup)} of the run)")
          if m.warmup else None),
)  # fmt: skip


def render(m: Method) -> list[str]:
    """The tokens of ``m``'s name, in the rule's order."""
    tokens = [_x(m).quantizer]
    return tokens + [t for slot in _SLOTS if (t := slot.token(m)) is not None]


def words(m: Method) -> str:
    """``m`` in words, for tables and plots: each slot's words after its separator."""
    said = _QUANTIZER_WORDS.get(_x(m).quantizer, _x(m).quantizer)
    for slot in _SLOTS:
        part = slot.words(m)
        if part is not None:
            said += part[0] + part[1]
    return said


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
    local: dict[str, Any] = {}
    rest: dict[str, Any] = {}
    slot = 0
    for token in tokens:
        found = next((k for k, sl in enumerate(_SLOTS) if re.fullmatch(sl.pattern, token)), None)
        if found is None:
            raise ValueError(f"method {name!r}: unknown part {token!r} ({SYNTAX})")
        if found < slot:
            raise ValueError(
                f"method {name!r}: {_SLOTS[found].what} ({token}) comes before "
                f"{_SLOTS[slot - 1].what} ({SYNTAX})"
            )
        slot = found + 1
        got = _SLOTS[found].sets(re.fullmatch(_SLOTS[found].pattern, token))
        q.update(got.pop("q", {}))
        x.update(got.pop("x", {}))
        local.update(got.pop("l", {}))
        rest.update(got)
    if head in BASELINES and "topology" not in x:
        raise ValueError(
            f"method {name!r}: {head} with settings goes through terngrad's exchange: name its "
            f"topology ({head}-sharded-...); {head} alone is PyTorch's own"
        )
    if local:
        rest["local"] = LocalSteps(**local)
    method = Method(exchange=Options(head, quantizer_options=q, **x), **rest)
    if method.name != name:
        raise ValueError(f"method {name!r} is written {method.name!r} ({SYNTAX})")
    return method


SYNTAX = (
    f"a method is head{''.join(slot.syntax for slot in _SLOTS)}, defaults left out: see "
    "docs/methods.md"
)
