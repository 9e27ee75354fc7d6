"""The rule that names a method: :func:`render` writes a :class:`~.method_spec.Method`'s
tokens in the rule's order, :func:`words` says it for tables and plots, :func:`parse` reads a
name back, refusing one written otherwise (the syntax: :data:`SYNTAX`; docs/methods.md).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from terngrad import quantize
from terngrad.comm.exchanges.topologies import TOPOLOGIES
from terngrad.comm.spec.method_spec import (
    BASELINES,
    POWERSGD_RANK,
    FrozenVariance,
    LocalVariance,
    Method,
    _number,
    _percent,
)
from terngrad.comm.spec.options import MIN_NUMEL, Options

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


def render(m: Method) -> list[str]:
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


def words(m: Method) -> str:
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
            raise ValueError(f"method {name!r}: unknown part {token!r} ({SYNTAX})")
        if found < slot:
            raise ValueError(
                f"method {name!r}: {_SLOTS[found][0]} ({token}) comes before "
                f"{_SLOTS[slot - 1][0]} ({SYNTAX})"
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
        raise ValueError(f"method {name!r} is written {method.name!r} ({SYNTAX})")
    return method


SYNTAX = (
    "a method is head[-levels][-topology][-b<N>][-noclip|-clip<C>][-2bit][-last][-min<N>][-ef]"
    "[-fp16agg|-coherent][-auto][-fused][-local<H>|-localauto][-overlap][-frozen<F>|-localvar<N>]"
    "[-warmup<F>], defaults "
    "left out: see docs/methods.md"
)
