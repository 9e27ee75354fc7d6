"""A method (:mod:`terngrad.comm.methods`) made into a training run's config: PyTorch's
baseline, or the hook's options with the method's warm-up in steps, its optimizer recipe
(``frozen-adamw``, ``local-adamw``) and its local steps (DiLoCo) — the one place a method
rewrites a :class:`TrainConfig`.

An experiment may put its own protocol over every method it runs: which tensors are quantized
(``quantize_last``, ``min_numel``), the topology, clipping for all. Its report says so; the
method's own settings stay those of its name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from terngrad.comm.methods import POWERSGD_RANK, FrozenVariance, LocalVariance, Method
from terngrad.comm.options import Options
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
