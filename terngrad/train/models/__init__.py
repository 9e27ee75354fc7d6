"""The models of the TernGrad paper's experiments (Wen et al., NIPS 2017, Sec. 5), plus an MLP for
throughput tests and a small GPT for language modelling, by name.

>>> from terngrad.train import models
>>> models.names()
['lenet', 'cifarnet', 'alexnet', 'vgg-a', 'googlenet', 'mlp', 'gpt']
>>> net = models.build("cifarnet", input_shape=(1, 28, 28), num_classes=10)
>>> net(torch.zeros(2, 1, 28, 28)).shape
torch.Size([2, 10])

Every image model maps a float batch ``(B, C, H, W)`` to ``(B, num_classes)`` logits; ``gpt``
maps token ids ``(B, T)`` to next-token logits ``(B, T, vocabulary)`` (:func:`loss` scores both).
In every model the output ``nn.Linear`` is the last submodule that owns parameters (the DDP hook
keeps that one in fp32).
The convolutional models accept any input at least as large as their layers need: LeNet and
CIFARNet size their first fully connected layer from the input shape, the ImageNet models pool
adaptively to the size their classifier expects. ``dropout`` is a probability; 0 means no dropout
layer at all, ``None`` in :func:`build` means the model's default (0.5 for AlexNet and VGG-A, 0.4
for GoogLeNet, none for the others).
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence

import torch
from torch import nn

from terngrad.train.models.base import Model
from terngrad.train.models.cnn import MLP, VGGA, AlexNet, CifarNet, GoogLeNet, Inception, LeNet
from terngrad.train.models.gpt import GPT, GPTSmall

# --------------------------------------------------------------------------- the registry

_MODELS: dict[str, type[Model]] = {
    cls.name: cls for cls in (LeNet, CifarNet, AlexNet, VGGA, GoogLeNet, MLP, GPT, GPTSmall)
}


def _lookup(name: str) -> type[Model]:
    if name not in _MODELS:
        close = difflib.get_close_matches(str(name), list(_MODELS), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"unknown model {name!r}{hint}; choose one of: {', '.join(_MODELS)}")
    return _MODELS[name]


def names() -> list[str]:
    """The model names: the paper's five, then ``mlp``."""
    return list(_MODELS)


def default_input_shape(name: str) -> tuple[int, ...]:
    """The input model ``name`` is built for when :func:`build` gets none: ``(C, H, W)`` for an
    image model, ``(context,)`` for a language model."""
    return _lookup(name).default_input_shape


def is_language_model(name: str) -> bool:
    """Whether model ``name`` reads token ids and predicts the next token (a text data set)."""
    return _lookup(name).task == "text"


def loss(logits: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy of logits ``(..., classes)`` against int64 targets ``(...)``: over the batch
    for a classifier ``(B, C)``, over every position for a language model ``(B, T, V)``."""
    return nn.functional.cross_entropy(
        logits.flatten(0, -2), targets.flatten(), reduction=reduction
    )


def build(
    name: str,
    input_shape: tuple[int, ...] | None = None,
    num_classes: int = 10,
    dropout: float | None = None,
) -> nn.Module:
    """Model ``name`` for inputs ``(B, *input_shape)`` (``None``: :func:`default_input_shape`),
    returning ``(B, num_classes)`` logits (a language model: ``(B, T, num_classes)``, the
    vocabulary's size); ``dropout`` ``None`` is the model's default, 0 none. ``ValueError`` for
    an unknown name, a shape that is not three positive integers (an image model) or one (a
    language model's context) or is too small for the model, ``num_classes < 2`` or ``dropout``
    outside ``[0, 1)``."""
    cls = _lookup(name)
    if input_shape is None:
        input_shape = cls.default_input_shape
    rank = len(cls.default_input_shape)
    if not (
        isinstance(input_shape, Sequence)
        and len(input_shape) == rank
        and all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in input_shape)
    ):
        what = (
            "three positive integers (channels, height, width)"
            if rank == 3
            else ("one positive integer (the context length)")
        )
        raise ValueError(
            f"{name}: input_shape must be {what}, e.g. {cls.default_input_shape}; got "
            f"{input_shape!r}"
        )
    if not (
        isinstance(num_classes, int) and not isinstance(num_classes, bool) and num_classes >= 2
    ):
        raise ValueError(f"{name}: num_classes must be an integer >= 2, got {num_classes!r}")
    if dropout is None:
        dropout = cls.default_dropout
    if not (
        isinstance(dropout, (int, float)) and not isinstance(dropout, bool) and 0 <= dropout < 1
    ):
        raise ValueError(
            f"{name}: dropout must be None (the model's default) or a probability in [0, 1), "
            f"got {dropout!r}"
        )
    return cls(tuple(input_shape), num_classes, float(dropout))


__all__ = [
    "GPT",
    "MLP",
    "VGGA",
    "AlexNet",
    "CifarNet",
    "GoogLeNet",
    "Inception",
    "LeNet",
    "build",
    "default_input_shape",
    "is_language_model",
    "loss",
    "names",
]
