"""What every model of :mod:`terngrad.train.models` shares: the :class:`Model` base (its name and
defaults for :func:`~terngrad.train.models.build`), the arithmetic of convolution output sizes,
dropout and ReLU blocks, and He initialisation."""

from __future__ import annotations

from typing import ClassVar

from torch import nn


class Model(nn.Module):
    """What :func:`build` needs of a model class: its registry name and defaults."""

    name: ClassVar[str]
    #: ``image``: float images (C, H, W) to class logits; ``text``: token ids (T,) to logits
    task: ClassVar[str] = "image"
    default_input_shape: ClassVar[tuple[int, ...]]
    default_dropout: ClassVar[float] = 0.0


# --------------------------------------------------------------------------- spatial sizes


def _pair(value: int | tuple[int, ...]) -> tuple[int, ...]:
    return value if isinstance(value, tuple) else (value, value)


def _side_out(layer: nn.Conv2d | nn.MaxPool2d, size: int, dim: int) -> int:
    """Output length along ``dim`` of a convolution or max pool on an input of length ``size``
    (PyTorch's rule: ``floor`` or, with ``ceil_mode``, ``ceil`` of ``(L + 2p - d(k-1) - 1)/s``,
    plus one, where a ceil-mode window may not start in the right padding); 0 if it does not fit."""
    k, s, p, d = (
        _pair(getattr(layer, a))[dim] for a in ("kernel_size", "stride", "padding", "dilation")
    )
    ceil = isinstance(layer, nn.MaxPool2d) and layer.ceil_mode
    out = (size + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil else 0)) // s + 1
    if ceil and (out - 1) * s >= size + p:
        out -= 1
    return max(out, 0)


def spatial_size(features: nn.Sequential, height: int, width: int) -> tuple[int, int]:
    """``(H, W)`` after ``features``, walking its direct children: ``Conv2d`` and ``MaxPool2d``
    change the size, every other child (ReLU, LRN, an :class:`Inception` block) keeps it.
    ``(0, 0)`` if the input is too small for some layer."""
    for layer in features:
        if isinstance(layer, (nn.Conv2d, nn.MaxPool2d)):
            height, width = _side_out(layer, height, 0), _side_out(layer, width, 1)
            if height < 1 or width < 1:
                return 0, 0
    return height, width


def fit_input(model: Model, input_shape: tuple[int, int, int]) -> tuple[int, int]:
    """``(H, W)`` after ``model.features``; ``ValueError`` with the smallest side that fits if the
    input is too small."""
    _, height, width = input_shape
    out = spatial_size(model.features, height, width)
    if out == (0, 0):
        side = 1
        while spatial_size(model.features, side, side) == (0, 0):
            side += 1
        raise ValueError(
            f"{model.name}: input_shape {input_shape} is too small; height and width must be at "
            f"least {side} (the default input_shape is {model.default_input_shape})"
        )
    return out


def dropout_layers(p: float) -> list[nn.Module]:
    """``[nn.Dropout(p)]``, or nothing for ``p = 0``: splice into a layer list."""
    return [nn.Dropout(p)] if p > 0 else []


def conv_relu(
    in_channels: int, out_channels: int, kernel_size: int, stride: int = 1, padding: int = 0
) -> list[nn.Module]:
    return [
        nn.Conv2d(in_channels, out_channels, kernel_size, stride, padding),
        nn.ReLU(inplace=True),
    ]


def he_init(model: nn.Module) -> None:
    """torchvision's VGG initialisation, for deep nets without normalisation: He-normal
    convolutions (fan-out, He et al. 2015), ``N(0, 0.01)`` linear weights, zero biases."""
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0.0, 0.01)
            nn.init.zeros_(m.bias)
