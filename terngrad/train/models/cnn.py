"""The convolutional models of the TernGrad paper's experiments (Wen et al., NIPS 2017, Sec. 5):
LeNet, the CIFAR ConvNet, AlexNet, VGG-A and GoogLeNet, and an MLP for throughput tests."""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Sequence
from typing import ClassVar

import torch
from torch import nn

from terngrad.train.models.base import Model, conv_relu, dropout_layers, fit_input, he_init


class LeNet(Model):
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
        height, width = fit_input(self, input_shape)
        self.classifier = nn.Sequential(
            nn.Linear(50 * height * width, 500),
            nn.ReLU(inplace=True),
            *dropout_layers(dropout),
            nn.Linear(500, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))


class CifarNet(Model):
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
            *conv_relu(input_shape[0], 64, 5, padding=2),
            nn.MaxPool2d(3, 2, padding=1),
            nn.LocalResponseNorm(size=9, alpha=0.001, beta=0.75, k=1.0),
            *conv_relu(64, 64, 5, padding=2),
            nn.LocalResponseNorm(size=9, alpha=0.001, beta=0.75, k=1.0),
            nn.MaxPool2d(3, 2, padding=1),
        )
        height, width = fit_input(self, input_shape)
        self.classifier = nn.Sequential(
            *dropout_layers(dropout),
            nn.Linear(64 * height * width, 384),
            nn.ReLU(inplace=True),
            *dropout_layers(dropout),
            nn.Linear(384, 192),
            nn.ReLU(inplace=True),
            *dropout_layers(dropout),
            nn.Linear(192, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))


class AlexNet(Model):
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
            *conv_relu(input_shape[0], 64, 11, stride=4, padding=2),
            nn.MaxPool2d(3, 2),
            *conv_relu(64, 192, 5, padding=2),
            nn.MaxPool2d(3, 2),
            *conv_relu(192, 384, 3, padding=1),
            *conv_relu(384, 256, 3, padding=1),
            *conv_relu(256, 256, 3, padding=1),
            nn.MaxPool2d(3, 2),
        )
        fit_input(self, input_shape)
        self.avgpool = nn.AdaptiveAvgPool2d((6, 6))
        self.classifier = nn.Sequential(
            *dropout_layers(dropout),
            nn.Linear(256 * 6 * 6, 4096),
            nn.ReLU(inplace=True),
            *dropout_layers(dropout),
            nn.Linear(4096, 4096),
            nn.ReLU(inplace=True),
            nn.Linear(4096, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


class VGGA(Model):
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
                layers += conv_relu(channels, int(step), 3, padding=1)
                channels = int(step)
        self.features = nn.Sequential(*layers)
        fit_input(self, input_shape)
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        self.classifier = nn.Sequential(
            nn.Linear(512 * 7 * 7, 4096),
            nn.ReLU(inplace=True),
            *dropout_layers(dropout),
            nn.Linear(4096, 4096),
            nn.ReLU(inplace=True),
            *dropout_layers(dropout),
            nn.Linear(4096, num_classes),
        )
        he_init(self)

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
        self.branch1 = nn.Sequential(*conv_relu(in_channels, ch1x1, 1))
        self.branch3 = nn.Sequential(
            *conv_relu(in_channels, ch3x3_reduce, 1),
            *conv_relu(ch3x3_reduce, ch3x3, 3, padding=1),
        )
        self.branch5 = nn.Sequential(
            *conv_relu(in_channels, ch5x5_reduce, 1),
            *conv_relu(ch5x5_reduce, ch5x5, 5, padding=2),
        )
        self.branch_pool = nn.Sequential(
            nn.MaxPool2d(3, 1, padding=1), *conv_relu(in_channels, pool_proj, 1)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        branches = (self.branch1, self.branch3, self.branch5, self.branch_pool)
        return torch.cat([branch(x) for branch in branches], 1)


class GoogLeNet(Model):
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
        conv1, relu1 = conv_relu(input_shape[0], 64, 7, stride=2, padding=3)
        conv2_reduce, relu2_reduce = conv_relu(64, 64, 1)
        conv2, relu2 = conv_relu(64, 192, 3, padding=1)
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
        fit_input(self, input_shape)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.fc = nn.Linear(channels, num_classes)
        he_init(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.dropout(torch.flatten(self.avgpool(self.features(x)), 1)))


class MLP(Model):
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
            layers += [
                nn.Linear(width_in, width_out),
                nn.ReLU(inplace=True),
                *dropout_layers(dropout),
            ]
        layers.append(nn.Linear(widths[-1], num_classes))
        self.layers = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)
