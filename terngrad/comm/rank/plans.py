"""Bucket plans: which parameters of a DDP bucket are quantized and which keep full precision.

A DDP bucket is one flat buffer holding the gradients of a few parameters, in order. Its
:class:`BucketPlan` cuts it into the quantized spans (one scale group per parameter: layer-wise
scales, from the parameter boundaries) and the spans kept in full precision: the last layer
(unless ``quantize_last``) and tensors under ``min_numel`` elements, or every tensor but those
of one class (``quantize_only``). With ``policy="auto"``
a bucket whose exchange is predicted to be slower quantized (:mod:`terngrad.comm.rank.policy`)
keeps full precision whole. Plans are made once per bucket layout and reused.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from terngrad.comm.spec.options import Options
from terngrad.comm.spec.tensor_classes import tensor_class
from terngrad.quantize import Layout

Span = tuple[int, int]  # (offset, numel) in a bucket's buffer


def last_layer_names(module: nn.Module) -> set[str]:
    """The parameters of the last layer, the one :class:`BucketPlan` keeps in full precision
    unless ``quantize_last``: those that train of the last submodule (in definition order)
    owning a parameter that trains — the classifier of the usual model; a frozen classifier is
    passed over for the last layer that trains. Found by tensor, named as
    ``module.named_parameters()`` names it: a tied output projection (GPT-2's head *is* the
    embedding's matrix, listed once, under the embedding's name) is kept too
    (:func:`tied_last_layer` says so)."""
    return set(_last_layer(module).values())


def tied_last_layer(module: nn.Module) -> dict[str, str]:
    """The last layer's parameters that are another module's tensor (tied weights): each one's
    name in the last layer, with the name ``module.named_parameters()`` lists it under."""
    return {alias: name for alias, name in _last_layer(module).items() if alias != name}


def _last_layer(module: nn.Module) -> dict[str, str]:
    """The last layer's trainable parameters: their names in it, and the names
    ``module.named_parameters()`` lists them under (the same but for tied tensors)."""
    listed = {id(p): name for name, p in module.named_parameters()}
    for prefix, owner in reversed(list(module.named_modules())):
        own = [(n, p) for n, p in owner.named_parameters(recurse=False) if p.requires_grad]
        if own:
            return {f"{prefix}.{n}" if prefix else n: listed[id(p)] for n, p in own}
    return {}


def full_precision_names(
    params: Sequence[tuple[str, torch.Tensor]], last_layer: set[str], options: Options
) -> set[str]:
    """The parameters kept in full precision (:func:`kept_in_full_precision`)."""
    return {
        name for name, p in params if kept_in_full_precision(name, p.numel(), last_layer, options)
    }


def kept_in_full_precision(
    name: str, numel: int, last_layer: Collection[str], options: Options
) -> bool:
    """Whether the parameter ``name`` of ``numel`` elements keeps full precision: with
    ``quantize_only``, every one not of that class (:func:`tensor_class`); else the last layer
    (unless ``quantize_last``) and tensors under ``min_numel`` elements."""
    if options.quantize_only is not None:
        return tensor_class(name, last_layer) != options.quantize_only
    return (not options.quantize_last and name in last_layer) or numel < options.min_numel


@dataclass(frozen=True)
class BucketPlan:
    """How one bucket's flat buffer splits into quantized and full-precision parameters."""

    names: tuple[str, ...]  # quantized parameters, in buffer order
    indices: tuple[int, ...]  # their positions in the model's parameter list
    sizes: tuple[int, ...]
    quantized: tuple[Span, ...]
    excluded: tuple[Span, ...]
    excluded_indices: tuple[int, ...]  # the excluded parameters' positions in the model
    layout: Layout
    #: a bucket the auto policy keeps in full precision: all-reduced at once, never deferred
    full_precision: bool = False

    @property
    def whole(self) -> bool:
        """The quantized parameters are the whole buffer."""
        return not self.excluded


class Planner:
    """Plans for the buckets of one model's parameters ``params`` (name, parameter), in the
    model's order; ``excluded``: the names kept in full precision; ``bucket_size``: the
    quantizer's; ``keep``: given a bucket's layout of quantizable elements, whether the auto
    policy keeps the whole bucket in full precision (``None``: never)."""

    def __init__(
        self,
        params: Sequence[tuple[str, torch.Tensor]],
        excluded: set[str],
        bucket_size: int | None,
        keep: Callable[[tuple[str, ...], Layout], bool] | None = None,
    ) -> None:
        self.names = {id(p): name for name, p in params}
        self.index = {id(p): i for i, (_, p) in enumerate(params)}
        self.excluded = excluded
        self.bucket_size = bucket_size
        self.keep = keep
        self.plans: dict[tuple[int, ...], BucketPlan] = {}

    def plan(self, params: Sequence[torch.Tensor]) -> BucketPlan:
        """The plan of a bucket holding ``params`` in this order (made at first sight)."""
        key = tuple(id(p) for p in params)
        plan = self.plans.get(key)
        if plan is None:
            plan = self.plans[key] = self._make(params)
        return plan

    def _make(self, params: Sequence[torch.Tensor]) -> BucketPlan:
        quantized: list[tuple[Span, int, str]] = []
        excluded: list[tuple[Span, int]] = []
        offset = 0
        for p in params:
            name = self.names.get(id(p))
            if name is None:
                raise RuntimeError(
                    "a DDP bucket holds a parameter the terngrad hook was not registered for; "
                    "register the hook on the same model DDP wraps"
                )
            span = (offset, p.numel())
            if name in self.excluded:
                excluded.append((span, self.index[id(p)]))
            else:
                quantized.append((span, self.index[id(p)], name))
            offset += p.numel()
        sizes = tuple(n for (_, n), _, _ in quantized)
        layout = Layout.of(sum(sizes), sizes, self.bucket_size)
        names = tuple(name for _, _, name in quantized)
        keep = self.keep is not None and self.keep(names, layout)  # every bucket decided
        full = keep and layout.numel > 0
        if full:  # the whole bucket in full precision, in one all-reduce
            excluded = sorted(excluded + [(span, i) for span, i, _ in quantized])
            quantized, sizes, names = [], (), ()
            layout = Layout.of(0, (), self.bucket_size)
        return BucketPlan(
            names=names,
            indices=tuple(i for _, i, _ in quantized),
            sizes=sizes,
            quantized=tuple(span for span, _, _ in quantized),
            excluded=tuple(span for span, _ in excluded),
            excluded_indices=tuple(i for _, i in excluded),
            layout=layout,
            full_precision=full,
        )


def gather(
    buffer: torch.Tensor, spans: tuple[Span, ...], out: torch.Tensor | None = None
) -> torch.Tensor:
    """The elements of ``spans`` of ``buffer``, concatenated: a new tensor of the same dtype,
    or written into ``out`` (as many elements; its dtype, converting)."""
    if out is None:
        return torch.cat([buffer[o : o + n] for o, n in spans])
    start = 0
    for o, n in spans:
        out[start : start + n].copy_(buffer[o : o + n])
        start += n
    return out


def scatter(buffer: torch.Tensor, spans: tuple[Span, ...], values: torch.Tensor) -> None:
    """Write ``values`` (concatenated spans, as :func:`gather` made them) back into ``buffer``."""
    start = 0
    for o, n in spans:
        buffer[o : o + n].copy_(values[start : start + n])
        start += n
