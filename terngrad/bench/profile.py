"""A model as the performance model sees it: its parameters in the order their gradients become
ready in the backward pass, and DDP's buckets of them.

Parameter ``p`` is ready at ``F + r_p (C - F)`` of a step (``F`` the forward pass, ``C`` the
compute), with ``r_p`` the share of backward work (2 x forward FLOPs of each convolution and
linear layer) done by then. DDP groups parameters into buckets in that order, the first capped
at 1 MiB, the others at 25 MiB; a bucket is ready when its last parameter is.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from terngrad.comm.rank.plans import last_layer_names

FIRST_BUCKET_BYTES = 2**20  # DDP's first bucket
BUCKET_BYTES = 25 * 2**20  # DDP's bucket_cap_mb default


@dataclass(frozen=True)
class Param:
    """One parameter tensor: its shape, when its gradient is ready (share of the backward pass
    done), whether it is in the model's last layer, and its place among the model's
    parameters (``index``: the order they are defined in)."""

    name: str
    shape: tuple[int, ...]
    ready: float
    last_layer: bool
    index: int = 0

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class Profile:
    """A model as the step model needs it: parameters in the order their gradients become
    ready, the forward FLOPs of one sample, and the elements of its floating-point buffers
    (batch-norm statistics: what local steps average at an outer step)."""

    model: str
    params: tuple[Param, ...]
    forward_flops: float
    buffers: int = 0

    @property
    def numel(self) -> int:
        return sum(p.numel for p in self.params)

    def buckets(
        self,
        cap_bytes: int = BUCKET_BYTES,
        first_cap_bytes: int = FIRST_BUCKET_BYTES,
        first_step: bool = False,
    ) -> list[tuple[Param, ...]]:
        """DDP's buckets of fp32 gradients: parameters in ready order, a bucket closed once it
        holds at least its cap (the first bucket's cap is ``first_cap_bytes``) — the buckets
        DDP rebuilds after its first step. In that ``first_step``, DDP (without
        ``find_unused_parameters``) holds every parameter in one bucket, in the order the
        model defines them."""
        if first_step:
            return [tuple(sorted(self.params, key=lambda p: p.index))]
        buckets, current, size, cap = [], [], 0, first_cap_bytes
        for p in self.params:
            current.append(p)
            size += 4 * p.numel
            if size >= cap:
                buckets.append(tuple(current))
                current, size, cap = [], 0, cap_bytes
        if current:
            buckets.append(tuple(current))
        return buckets


def profile(module: nn.Module, input_shape: Sequence[int], name: str = "model") -> Profile:
    """The :class:`Profile` of ``module`` for inputs of ``input_shape`` (one sample is run
    forward to count the FLOPs of its convolutions and linear layers, 2 per multiply-add)."""
    flops: list[tuple[nn.Module, float]] = []

    def count(m: nn.Module, inputs: tuple, output: torch.Tensor) -> None:
        if isinstance(m, nn.Conv2d):
            per_output = m.in_channels // m.groups * math.prod(m.kernel_size)
            flops.append((m, 2.0 * output.numel() * per_output))
        elif isinstance(m, nn.Linear):
            flops.append((m, 2.0 * output.numel() * m.in_features))
        elif next(m.parameters(recurse=False), None) is not None:
            flops.append((m, 0.0))  # normalisation layers: parameters, negligible work

    handles = [m.register_forward_hook(count) for m in module.modules()]
    try:
        with torch.no_grad():
            was_training = module.training
            module.eval()
            module(torch.zeros(1, *input_shape))
            module.train(was_training)
    finally:
        for h in handles:
            h.remove()
    total = sum(f for _, f in flops) or 1.0
    ready: dict[int, float] = {}
    done = 0.0
    for m, f in reversed(flops):  # backward: last module first
        done += f
        for p in m.parameters(recurse=False):
            ready.setdefault(id(p), done / total)
    last = last_layer_names(module)
    params = [
        Param(n, tuple(p.shape), ready.get(id(p), 1.0), n in last, i)
        for i, (n, p) in enumerate((n, p) for n, p in module.named_parameters() if p.requires_grad)
    ]
    order = sorted(range(len(params)), key=lambda i: (params[i].ready, -i))
    buffers = sum(b.numel() for b in module.buffers() if b.is_floating_point())
    return Profile(name, tuple(params[i] for i in order), sum(f for _, f in flops), buffers)


def profile_model(
    name: str, input_shape: Sequence[int] | None = None, num_classes: int = 10
) -> Profile:
    """The :class:`Profile` of one of :mod:`terngrad.train.models`, as the testbed builds it."""
    from terngrad.train import models

    shape = tuple(input_shape) if input_shape else models.default_input_shape(name)
    torch.manual_seed(0)
    return profile(models.build(name, shape, num_classes), shape, name)
