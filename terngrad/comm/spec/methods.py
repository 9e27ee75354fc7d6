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
         [-fp16agg | -coherent] [-auto] [-fused] [-local<H> | -localauto] [-overlap]
         [-frozen<F> | -localvar<N>]
         [-warmup<F>]

* ``head``: ``fp32``, ``fp16`` or ``powersgd`` alone are PyTorch's own (``powersgd-r<K>``:
  PowerSGD of rank K, 2 where not written); any quantizer name
  (``terngrad``, ``qsgd``, ``bingrad-b``, ... and ``fp32``/``fp16`` with a topology) is
  terngrad's hook;
* ``levels``: the level quantizers' ``levels`` (``qsgd-5``);
* ``topology``: ``ps``, ``allgather``, ``own-scales``; ``sharded``, the default, is written
  only after ``fp32``/``fp16`` (``fp32-sharded``: fp32 through terngrad's exchange);
* the quantizer's ``bucket_size`` (``b512``), clipping (``noclip``, ``clip2``), 2-bit packing;
* the exchange's settings: ``last`` (quantize_last), ``min<N>`` (min_numel), ``ef`` (error
  feedback), the aggregate, the ``auto`` policy, ``fused`` (fuse_buckets);
* ``local<H>``: local steps (DiLoCo, :class:`terngrad.diloco.DiLoCo`): each replica ``H``
  steps on its own, then their pseudo-gradients averaged through this exchange; ``localauto``:
  ``H`` chosen at run time from the measured step and exchange (``--max-comm-share``);
  ``overlap``: the outer exchange behind the next inner steps, its update one outer step late;
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

from collections.abc import Iterable, Mapping
from typing import Any

from terngrad import quantize
from terngrad.comm.spec.method_spec import (
    BASELINES,
    POWERSGD_RANK,
    RUN_SETTINGS,
    FrozenVariance,
    LocalVariance,
    Method,
    Recipe,
)
from terngrad.comm.spec.naming import parse
from terngrad.comm.spec.options import Options
from terngrad.comm.spec.over import over
from terngrad.util.deprecation import warn_deprecated

__all__ = [
    "ALIASES", "BASELINES", "METHODS", "POWERSGD_RANK", "FrozenVariance", "LocalVariance",
    "Method", "Recipe", "canonical", "get", "hook_options", "parse", "select",
]  # fmt: skip

# --------------------------------------------------------------------------- the table

#: the methods the benchmarks, reproductions and the study compare (any other name the rule
#: reads works too): adding one is adding its name here
METHODS: dict[str, Method] = {
    m.name: m
    for m in map(parse, (
        "fp32", "fp16", "powersgd", "powersgd-r8", "fp32-sharded",
        "terngrad", "terngrad-fused", "terngrad-ps", "terngrad-allgather",
        "terngrad-own-scales", "terngrad-own-scales-fused",
        "terngrad-noclip", "terngrad-b512", "terngrad-b2048", "terngrad-ef", "terngrad-ef-fit",
        "terngrad-warmup0.2", "terngrad-b512-warmup0.2",
        "terngrad-b512-ef-frozen0.2",
        "fp32-sharded-localvar100", "terngrad-b512-ef-localvar100",
        "terngrad-b512-last-min0-ef-localvar100",
        "terngrad-b512-noclip-last-min0-ef-localvar100",
        "terngrad-local16", "terngrad-ef-local16", "fp32-sharded-local16",
        "terngrad-ef-local16-overlap",
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


def select(
    names: Iterable[str | Method], allowed: Iterable[str | Method] | None = None
) -> list[Method]:
    """The methods ``names`` (names or :class:`Method` objects), in order: each a method (and
    among ``allowed`` where given), none twice; ``ValueError`` with one line otherwise."""
    names = list(names)
    if not names:
        choices = [get(a).name for a in allowed] if allowed is not None else list(METHODS)
        raise ValueError(f"give at least one method; choose from: {', '.join(choices)}")
    chosen = [get(name) for name in names]
    if allowed is not None:
        allowed = [get(a).name for a in allowed]
        outside = [m.name for m in chosen if m.name not in allowed]
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
    (:meth:`Options.of`), or from a ``method`` of the hook's with those keywords over it by
    the rule of every consumer (:func:`~terngrad.comm.spec.over.over`): a setting the method
    leaves at its default is added (``method="terngrad-b512", seed=3``; a quantizer or
    topology other than the defaults too), one it sets otherwise (``bucket_size=64``) is
    refused in one line naming the method that runs it. ``preset`` is ``method``'s older name.
    A method the hook alone cannot run (a PyTorch baseline, an optimizer recipe, a warm-up
    share) is refused in one line."""
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
    m = get(method).require("the terngrad hook", baselines=())
    given = dict(settings)
    if quantizer != "terngrad":
        given["quantizer"] = quantizer
    if topology != "sharded":
        given["topology"] = topology
    given, q_options = _exchange_and_quantizer(given)
    run = {k: given.pop(k) for k in RUN_SETTINGS if k in given}  # (the run's: not the method's)
    changed = over(m, exchange={**given, "quantizer_options": q_options})
    assert changed.exchange is not None
    return changed.exchange.replace(**run)


def default_options(default: str, topology: str = "sharded", **settings: Any) -> Options:
    """The options of ``default``, a method run because the user named none (a callback's
    default), with the settings given in place of its own: ``quantize_last=False`` over
    ``qsgd-5-b64-last`` keeps the last layer in fp32. (A method the user names takes settings
    by :func:`hook_options`' rule instead.)"""
    given, q_options = _exchange_and_quantizer(settings)
    return get(default).options(**given, topology=topology, quantizer_options=q_options)


def _exchange_and_quantizer(settings: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Flat keywords split into :class:`Options` fields and the quantizer's options."""
    given = dict(settings)
    fields = set(Options.__dataclass_fields__)
    q_options = {**given.pop("quantizer_options", {}),
                 **{k: given.pop(k) for k in list(given) if k not in fields}}  # fmt: skip
    return given, q_options
