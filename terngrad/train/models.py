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
import itertools
import math
from collections import OrderedDict
from collections.abc import Sequence
from typing import ClassVar

import torch
from torch import nn

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


def _spatial(features: nn.Sequential, height: int, width: int) -> tuple[int, int]:
    """``(H, W)`` after ``features``, walking its direct children: ``Conv2d`` and ``MaxPool2d``
    change the size, every other child (ReLU, LRN, an :class:`Inception` block) keeps it.
    ``(0, 0)`` if the input is too small for some layer."""
    for layer in features:
        if isinstance(layer, (nn.Conv2d, nn.MaxPool2d)):
            height, width = _side_out(layer, height, 0), _side_out(layer, width, 1)
            if height < 1 or width < 1:
                return 0, 0
    return height, width


def _fit(model: _Model, input_shape: tuple[int, int, int]) -> tuple[int, int]:
    """``(H, W)`` after ``model.features``; ``ValueError`` with the smallest side that fits if the
    input is too small."""
    _, height, width = input_shape
    out = _spatial(model.features, height, width)
    if out == (0, 0):
        side = 1
        while _spatial(model.features, side, side) == (0, 0):
            side += 1
        raise ValueError(
            f"{model.name}: input_shape {input_shape} is too small; height and width must be at "
            f"least {side} (the default input_shape is {model.default_input_shape})"
        )
    return out


def _dropout(p: float) -> list[nn.Module]:
    """``[nn.Dropout(p)]``, or nothing for ``p = 0``: splice into a layer list."""
    return [nn.Dropout(p)] if p > 0 else []


def _conv_relu(
    in_channels: int, out_channels: int, kernel_size: int, stride: int = 1, padding: int = 0
) -> list[nn.Module]:
    return [
        nn.Conv2d(in_channels, out_channels, kernel_size, stride, padding),
        nn.ReLU(inplace=True),
    ]


def _he_init(model: nn.Module) -> None:
    """torchvision's VGG initialisation, for deep nets without normalisation: He-normal
    convolutions (fan-out, He et al. 2015), ``N(0, 0.01)`` linear weights, zero biases."""
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0.0, 0.01)
            nn.init.zeros_(m.bias)


# --------------------------------------------------------------------------- the models


class _Model(nn.Module):
    """What :func:`build` needs of a model class: its registry name and defaults."""

    name: ClassVar[str]
    #: ``image``: float images (C, H, W) to class logits; ``text``: token ids (T,) to logits
    task: ClassVar[str] = "image"
    default_input_shape: ClassVar[tuple[int, ...]]
    default_dropout: ClassVar[float] = 0.0


class LeNet(_Model):
    """Caffe's LeNet (``examples/mnist/lenet_train_test.prototxt``), the MNIST model of the
    TernGrad paper (Sec. 5.1, Fig. 4 and Table 1): conv 5x5x20 -> max pool 2/2 -> conv 5x5x50 ->
    max pool 2/2 -> fc 500 -> ReLU -> fc. No padding and no ReLU after the convolutions, as in
    Caffe; 431,080 parameters on 1x28x28 inputs with 10 classes. ``dropout`` > 0 adds dropout
    before the last fc."""

    name = "lenet"
    default_input_shape = (1, 28, 28)

    def __init__(
        self,
        input_shape: tuple[int, int, int] = default_input_shape,
        num_classes: int = 10,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(input_shape[0], 20, 5),
            nn.MaxPool2d(2, 2),
            nn.Conv2d(20, 50, 5),
            nn.MaxPool2d(2, 2),
        )
        height, width = _fit(self, input_shape)
        self.classifier = nn.Sequential(
            nn.Linear(50 * height * width, 500),
            nn.ReLU(inplace=True),
            *_dropout(dropout),
            nn.Linear(500, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))


class CifarNet(_Model):
    """The CIFAR-10 ConvNet of the TernGrad paper (Sec. 5.1, Table 1), TensorFlow's ``cifar10``
    tutorial model (``tensorflow/models``, ``tutorials/image/cifar10/cifar10.py``): conv 5x5x64
    'same' -> ReLU -> max pool 3/2 -> LRN -> conv 5x5x64 'same' -> ReLU -> LRN -> max pool 3/2 ->
    fc 384 -> ReLU -> fc 192 -> ReLU -> fc. Pools pad by 1, which gives TF's 'SAME' output size
    ``ceil(L / 2)``: 24 -> 12 -> 6 (fc input 6*6*64), 28 -> 14 -> 7 (7*7*64, Fashion-MNIST).
    ``dropout`` > 0 adds dropout before each fc."""

    name = "cifarnet"
    default_input_shape = (3, 24, 24)

    def __init__(
        self,
        input_shape: tuple[int, int, int] = default_input_shape,
        num_classes: int = 10,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        # tf.nn.lrn(x, depth_radius=4, bias=1.0, alpha=0.001 / 9.0, beta=0.75) sums squares over
        # 2*4+1 = 9 channels and multiplies by alpha; PyTorch divides its alpha by the window
        # size, so the same layer is alpha = 0.001 / 9 * 9 = 0.001.
        self.features = nn.Sequential(
            *_conv_relu(input_shape[0], 64, 5, padding=2),
            nn.MaxPool2d(3, 2, padding=1),
            nn.LocalResponseNorm(size=9, alpha=0.001, beta=0.75, k=1.0),
            *_conv_relu(64, 64, 5, padding=2),
            nn.LocalResponseNorm(size=9, alpha=0.001, beta=0.75, k=1.0),
            nn.MaxPool2d(3, 2, padding=1),
        )
        height, width = _fit(self, input_shape)
        self.classifier = nn.Sequential(
            *_dropout(dropout),
            nn.Linear(64 * height * width, 384),
            nn.ReLU(inplace=True),
            *_dropout(dropout),
            nn.Linear(384, 192),
            nn.ReLU(inplace=True),
            *_dropout(dropout),
            nn.Linear(192, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))


class AlexNet(_Model):
    """AlexNet (Krizhevsky et al., NIPS 2012) in its one-tower form ("One weird trick",
    Krizhevsky 2014, as in torchvision), the TernGrad paper's ImageNet AlexNet (Sec. 5.2, Table 2,
    Fig. 6): convs 11x11/4 64, 5x5 192, 3x3 384, 3x3 256, 3x3 256 with ReLU and three max pools
    3/2, adaptive average pool to 6x6, then dropout -> fc 4096 -> ReLU -> dropout -> fc 4096 ->
    ReLU -> fc. Inputs of at least 63x63."""

    name = "alexnet"
    default_input_shape = (3, 224, 224)
    default_dropout = 0.5

    def __init__(
        self,
        input_shape: tuple[int, int, int] = default_input_shape,
        num_classes: int = 1000,
        dropout: float = default_dropout,
    ) -> None:
        super().__init__()
        self.features = nn.Sequential(
            *_conv_relu(input_shape[0], 64, 11, stride=4, padding=2),
            nn.MaxPool2d(3, 2),
            *_conv_relu(64, 192, 5, padding=2),
            nn.MaxPool2d(3, 2),
            *_conv_relu(192, 384, 3, padding=1),
            *_conv_relu(384, 256, 3, padding=1),
            *_conv_relu(256, 256, 3, padding=1),
            nn.MaxPool2d(3, 2),
        )
        _fit(self, input_shape)
        self.avgpool = nn.AdaptiveAvgPool2d((6, 6))
        self.classifier = nn.Sequential(
            *_dropout(dropout),
            nn.Linear(256 * 6 * 6, 4096),
            nn.ReLU(inplace=True),
            *_dropout(dropout),
            nn.Linear(4096, 4096),
            nn.ReLU(inplace=True),
            nn.Linear(4096, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


class VGGA(_Model):
    """VGG-A, i.e. VGG-11 (Simonyan & Zisserman, ICLR 2015, Table 1 column A), the TernGrad
    paper's ImageNet VGG-A (Sec. 5.2, Table 2): 3x3 convs (padding 1) with ReLU in the channel
    plan ``_PLAN`` ("M" = max pool 2/2), adaptive average pool to 7x7, then fc 4096 -> ReLU ->
    dropout -> fc 4096 -> ReLU -> dropout -> fc. No batch norm, as in the paper; initialised as in
    :func:`_he_init`. Inputs of at least 32x32."""

    name = "vgg-a"
    default_input_shape = (3, 224, 224)
    default_dropout = 0.5
    _PLAN: ClassVar[tuple[int | str, ...]] = (
        64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M",
    )  # fmt: skip

    def __init__(
        self,
        input_shape: tuple[int, int, int] = default_input_shape,
        num_classes: int = 1000,
        dropout: float = default_dropout,
    ) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        channels = input_shape[0]
        for step in self._PLAN:
            if step == "M":
                layers.append(nn.MaxPool2d(2, 2))
            else:
                layers += _conv_relu(channels, int(step), 3, padding=1)
                channels = int(step)
        self.features = nn.Sequential(*layers)
        _fit(self, input_shape)
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        self.classifier = nn.Sequential(
            nn.Linear(512 * 7 * 7, 4096),
            nn.ReLU(inplace=True),
            *_dropout(dropout),
            nn.Linear(4096, 4096),
            nn.ReLU(inplace=True),
            *_dropout(dropout),
            nn.Linear(4096, num_classes),
        )
        _he_init(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


class Inception(nn.Module):
    """One Inception module (Szegedy et al., CVPR 2015, Fig. 2b): 1x1; 1x1 -> 3x3; 1x1 -> 5x5;
    max pool 3/1 -> 1x1, every conv followed by ReLU, the four outputs concatenated on channels.
    The spatial size is kept."""

    def __init__(
        self,
        in_channels: int,
        ch1x1: int,
        ch3x3_reduce: int,
        ch3x3: int,
        ch5x5_reduce: int,
        ch5x5: int,
        pool_proj: int,
    ) -> None:
        super().__init__()
        self.out_channels = ch1x1 + ch3x3 + ch5x5 + pool_proj
        self.branch1 = nn.Sequential(*_conv_relu(in_channels, ch1x1, 1))
        self.branch3 = nn.Sequential(
            *_conv_relu(in_channels, ch3x3_reduce, 1),
            *_conv_relu(ch3x3_reduce, ch3x3, 3, padding=1),
        )
        self.branch5 = nn.Sequential(
            *_conv_relu(in_channels, ch5x5_reduce, 1),
            *_conv_relu(ch5x5_reduce, ch5x5, 5, padding=2),
        )
        self.branch_pool = nn.Sequential(
            nn.MaxPool2d(3, 1, padding=1), *_conv_relu(in_channels, pool_proj, 1)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        branches = (self.branch1, self.branch3, self.branch5, self.branch_pool)
        return torch.cat([branch(x) for branch in branches], 1)


class GoogLeNet(_Model):
    """GoogLeNet / Inception v1 (Szegedy et al., "Going deeper with convolutions", CVPR 2015,
    Table 1), the TernGrad paper's ImageNet GoogLeNet (Sec. 5.2, Table 2, Fig. 7), without the
    auxiliary classifiers: conv 7x7/2 64 -> max pool 3/2 -> conv 1x1 64 -> conv 3x3 192 -> max
    pool 3/2 -> inception 3a, 3b -> max pool 3/2 -> 4a-4e -> max pool 3/2 -> 5a, 5b -> global
    average pool -> dropout (0.4) -> fc, with the channels of ``_TABLE``. Max pools round up
    (``ceil_mode``, as Caffe). No LRN and no batch norm; initialised as in :func:`_he_init`.
    Inputs of at least 31x31; 224x224 gives 7x7 before the average pool."""

    name = "googlenet"
    default_input_shape = (3, 224, 224)
    default_dropout = 0.4
    # Table 1: #1x1, #3x3 reduce, #3x3, #5x5 reduce, #5x5, pool proj; None = max pool 3/2.
    _TABLE: ClassVar[tuple[tuple[str, tuple[int, ...] | None], ...]] = (
        ("3a", (64, 96, 128, 16, 32, 32)),
        ("3b", (128, 128, 192, 32, 96, 64)),
        ("pool3", None),
        ("4a", (192, 96, 208, 16, 48, 64)),
        ("4b", (160, 112, 224, 24, 64, 64)),
        ("4c", (128, 128, 256, 24, 64, 64)),
        ("4d", (112, 144, 288, 32, 64, 64)),
        ("4e", (256, 160, 320, 32, 128, 128)),
        ("pool4", None),
        ("5a", (256, 160, 320, 32, 128, 128)),
        ("5b", (384, 192, 384, 48, 128, 128)),
    )

    def __init__(
        self,
        input_shape: tuple[int, int, int] = default_input_shape,
        num_classes: int = 1000,
        dropout: float = default_dropout,
    ) -> None:
        super().__init__()
        conv1, relu1 = _conv_relu(input_shape[0], 64, 7, stride=2, padding=3)
        conv2_reduce, relu2_reduce = _conv_relu(64, 64, 1)
        conv2, relu2 = _conv_relu(64, 192, 3, padding=1)
        layers: list[tuple[str, nn.Module]] = [
            ("conv1", conv1),
            ("relu1", relu1),
            ("pool1", nn.MaxPool2d(3, 2, ceil_mode=True)),
            ("conv2_reduce", conv2_reduce),
            ("relu2_reduce", relu2_reduce),
            ("conv2", conv2),
            ("relu2", relu2),
            ("pool2", nn.MaxPool2d(3, 2, ceil_mode=True)),
        ]
        channels = 192
        for label, widths in self._TABLE:
            if widths is None:
                layers.append((label, nn.MaxPool2d(3, 2, ceil_mode=True)))
            else:
                block = Inception(channels, *widths)
                layers.append((f"inception{label}", block))
                channels = block.out_channels
        self.features = nn.Sequential(OrderedDict(layers))
        _fit(self, input_shape)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.fc = nn.Linear(channels, num_classes)
        _he_init(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.dropout(torch.flatten(self.avgpool(self.features(x)), 1)))


class MLP(_Model):
    """A multilayer perceptron for throughput tests (not from the paper): flatten -> Linear(C*H*W,
    hidden[0]) -> ReLU -> ... -> Linear(hidden[-1], num_classes); ``hidden`` = (512, 512) by
    default. ``dropout`` > 0 adds dropout after each hidden ReLU."""

    name = "mlp"
    default_input_shape = (1, 28, 28)

    def __init__(
        self,
        input_shape: tuple[int, int, int] = default_input_shape,
        num_classes: int = 10,
        dropout: float = 0.0,
        hidden: Sequence[int] = (512, 512),
    ) -> None:
        super().__init__()
        if not hidden or any(not isinstance(w, int) or w < 1 for w in hidden):
            raise ValueError(
                f"mlp: hidden must be a non-empty list of positive integers, got {hidden!r}"
            )
        widths = [input_shape[0] * input_shape[1] * input_shape[2], *hidden]
        layers: list[nn.Module] = [nn.Flatten()]
        for width_in, width_out in itertools.pairwise(widths):
            layers += [nn.Linear(width_in, width_out), nn.ReLU(inplace=True), *_dropout(dropout)]
        layers.append(nn.Linear(widths[-1], num_classes))
        self.layers = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class _CausalSelfAttention(nn.Module):
    """Multi-head self-attention over the positions up to each one: ``qkv`` (d -> 3d) splits into
    ``heads`` heads of ``d / heads``, ``softmax(q k^T / sqrt(d/heads) + causal mask) v``, then
    ``proj`` (d -> d) (Vaswani et al. 2017, Sec. 3.2)."""

    def __init__(self, width: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (
            part.view(b, t, self.heads, d // self.heads).transpose(1, 2)
            for part in self.qkv(x).split(d, dim=2)
        )
        y = nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0
        )
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class _Block(nn.Module):
    """A pre-norm transformer block (GPT-2): ``x + attn(ln1(x))``, then ``x + mlp(ln2(x))`` with
    ``mlp`` = Linear(d, 4d) -> GELU -> Linear(4d, d)."""

    def __init__(self, width: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = _CausalSelfAttention(width, heads, dropout)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width), *_dropout(dropout)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(_Model):
    """A small GPT-style character-level language model (not from the paper; Radford et al.
    2019's layout at a small size): token and learned position embeddings (d each), ``layers``
    pre-norm blocks of causal self-attention with ``heads`` heads and a 4d MLP, a final layer
    norm and a linear head to the vocabulary (not tied to the embedding, so the head is the
    last layer the DDP hook keeps in fp32). Defaults: 4 layers, d = 256, 4 heads, context 128,
    about 3.2 million parameters. Inputs are token ids ``(B, T)`` with ``T <= context``; outputs
    are next-token logits ``(B, T, num_classes)``. Initialisation as GPT-2: weights
    ``N(0, 0.02)``, the residual projections ``N(0, 0.02 / sqrt(2 * layers))``, zero biases."""

    name = "gpt"
    task = "text"
    default_input_shape = (128,)

    def __init__(
        self,
        input_shape: tuple[int] = default_input_shape,
        num_classes: int = 256,
        dropout: float = 0.0,
        width: int = 256,
        layers: int = 4,
        heads: int = 4,
    ) -> None:
        super().__init__()
        if width % heads:
            raise ValueError(f"gpt: width {width} does not split into {heads} heads")
        self.context = input_shape[0]
        self.token = nn.Embedding(num_classes, width)
        self.position = nn.Embedding(self.context, width)
        self.drop = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.blocks = nn.Sequential(*(_Block(width, heads, dropout) for _ in range(layers)))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, num_classes)
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() >= 2:
                residual = name.endswith(("attn.proj.weight", "mlp.2.weight"))
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * layers) if residual else 0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        if t > self.context:
            raise ValueError(
                f"gpt: a sequence of {t} tokens is longer than the context {self.context}"
            )
        h = self.drop(self.token(x) + self.position(torch.arange(t, device=x.device)))
        return self.head(self.norm(self.blocks(h)))


# --------------------------------------------------------------------------- the registry

_MODELS: dict[str, type[_Model]] = {
    cls.name: cls for cls in (LeNet, CifarNet, AlexNet, VGGA, GoogLeNet, MLP, GPT)
}


def _lookup(name: str) -> type[_Model]:
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
