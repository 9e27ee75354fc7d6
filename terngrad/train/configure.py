"""A method (:mod:`terngrad.comm.spec.methods`) made into a training run's config: PyTorch's
baseline, or the hook's options with the method's warm-up in steps, its optimizer recipe
(``frozen-adamw``, ``local-adamw``) and its local steps (DiLoCo) — the one place a method
rewrites a :class:`TrainConfig`.

An experiment may put its own protocol over every method it runs: which tensors are quantized
(``quantize_last``, ``min_numel``), the topology, clipping for all. Its report says so; the
method's own settings stay those of its name.

A setting given for a run of a method that the method decides otherwise (``--local-steps 8``
with ``--method terngrad-ef``, whose H is 1) would be replaced by the method's without a word:
:func:`refuse_disagreements` refuses it in one line, naming both and the method that runs it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from terngrad.comm.spec.methods import POWERSGD_RANK, FrozenVariance, LocalVariance, Method
from terngrad.comm.spec.options import Options
from terngrad.train.config import TrainConfig


def configure(
    method: Method,
    base: TrainConfig,
    out: str,
    protocol: Mapping[str, Any] | None = None,
    full_precision_steps: int | None = None,
) -> TrainConfig:
    """``base`` trained the way of ``method`` into ``out``: PyTorch's baseline (the exchange
    options are then unused and left at their defaults), or the hook with the method's options
    under ``protocol``; a method with a warm-up share gets ``full_precision_steps`` (by default
    its share of ``base.steps``, at least 1); a recipe sets the optimizer, which must be
    AdamW."""
    if method.baseline is not None:
        return base.replace(
            out=out,
            baseline=method.baseline,
            powersgd_rank=method.powersgd_rank,
            exchange=Options(),
            local_steps=1,
            outer_overlap=False,
        )
    exchange = method.options(**dict(protocol or {}))
    if method.warmup:
        k = full_precision_steps or max(1, int(base.steps * method.warmup))
        exchange = exchange.replace(full_precision_steps=k)
    recipe = method.recipe
    if recipe is not None and base.optimizer != "adamw":
        raise ValueError(
            f"method {method.name} exchanges AdamW's momentum; this run's optimizer is "
            f"{base.optimizer!r}"
        )
    if isinstance(recipe, FrozenVariance):
        freeze = max(1, int(base.steps * recipe.share))
        base = base.replace(optimizer=recipe.optimizer, freeze_after=freeze)
    elif isinstance(recipe, LocalVariance):
        base = base.replace(optimizer=recipe.optimizer, variance_sync=recipe.every)
    return base.replace(
        out=out,
        baseline=None,
        powersgd_rank=POWERSGD_RANK,
        exchange=exchange,
        local_steps=method.local_steps,
        outer_overlap=method.outer_overlap,
    )


#: the run's settings that a method decides, beside its exchange options
METHOD_SETTINGS = ("baseline", "powersgd_rank", "local_steps", "outer_overlap")


def _disagreements(
    cfg: TrainConfig, given: Mapping[str, Any], exchange: Mapping[str, Any]
) -> list[tuple[str, Any, Any]]:
    """What was given for a run that ``cfg``, the run :func:`configure` made of it, does not
    have: ``(name, given, the run's)`` for each of :data:`METHOD_SETTINGS` in ``given`` (the
    run's settings by field) and each exchange option in ``exchange`` (by field; the
    quantizer's options by name under ``quantizer_options``)."""
    wrong = [(n, given[n], getattr(cfg, n)) for n in METHOD_SETTINGS
             if n in given and given[n] != getattr(cfg, n)]  # fmt: skip
    for name, value in exchange.items():
        if name == "quantizer_options":
            have = cfg.exchange.quantizer_options
            wrong += [(k, v, have.get(k)) for k, v in value.items() if have.get(k) != v]
        elif getattr(cfg.exchange, name) != value:
            wrong.append((name, value, getattr(cfg.exchange, name)))
    return wrong


def _named_with(method: Method, changes: Mapping[str, Any]) -> str | None:
    """The name of ``method`` with ``changes`` (its :data:`METHOD_SETTINGS`, or exchange options
    by field), where that is a method; else ``None`` (a warm-up is a share, not a count)."""
    own = {k: v for k, v in changes.items() if k in METHOD_SETTINGS}
    exchange = {k: v for k, v in changes.items() if k not in METHOD_SETTINGS}
    if "full_precision_steps" in exchange or (exchange and method.exchange is None):
        return None
    fields = {f.name for f in dataclasses.fields(Options)}
    q_options = {k: exchange.pop(k) for k in list(exchange) if k not in fields}
    try:
        if exchange or q_options:
            own["exchange"] = method.options(**exchange, quantizer_options=q_options)
        return dataclasses.replace(method, **own).name
    except (TypeError, ValueError):
        return None


def refuse_disagreements(
    cfg: TrainConfig,
    method: Method,
    given: Mapping[str, Any],
    exchange: Mapping[str, Any],
    spell: Callable[[str], str] = lambda name: name,
) -> None:
    """``ValueError`` in one line if a setting given (:func:`_disagreements`) is not what the run
    of ``method`` runs: the method's own would replace it unsaid. ``spell``: a setting's name
    as the caller's user writes it (``--local-steps``)."""
    wrong = _disagreements(cfg, given, exchange)
    if not wrong:
        return

    def show(name: str, value: Any) -> str:
        if isinstance(value, bool):
            return spell(name) if value else f"without {spell(name)}"
        return f"{spell(name)} {value}"

    asked = ", ".join(show(n, v) for n, v, _ in wrong)
    runs = ", ".join(show(n, r) for n, _, r in wrong)
    flags = ", ".join(spell(n) for n, _, _ in wrong)
    better = _named_with(method, {n: v for n, v, _ in wrong})
    if better is not None:
        fix = f"the method that does is {better}: name it, or leave out {flags}"
    elif any(n == "full_precision_steps" for n, _, _ in wrong):
        fix = (
            f"a warm-up is a share of the steps in the method's name ({method.name}-warmup0.1, "
            f"say): name one, or leave out {flags}"
        )
    else:
        fix = f"no method does (docs/methods.md): leave out {flags}"
    raise ValueError(f"{asked} is not what {method.name} runs ({runs}); {fix}")
