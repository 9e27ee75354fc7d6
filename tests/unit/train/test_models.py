"""The model registry: names and defaults, output shapes on default and small inputs, parameter
counts, the classifier as the last parameterised submodule, dropout, and bad arguments (of the
image models; the GPT's own tests are in test_language_model.py)."""

import functools
import itertools

import pytest
import torch
from torch import nn

from terngrad.train import models
from terngrad.train.models.base import spatial_size

CLASSES = 7  # not 10, so a classifier left at a default width would show


IMAGE_MODELS = [name for name in models.names() if not models.is_language_model(name)]


# A small input each model must run on; the ImageNet models are built for it with dropout 0 once.
SMALL = {
    "lenet": (1, 16, 16),  # the smallest LeNet input
    "cifarnet": (1, 28, 28),  # Fashion-MNIST
    "alexnet": (3, 64, 64),
    "vgg-a": (3, 32, 32),
    "googlenet": (3, 64, 64),
    "mlp": (3, 32, 32),
}


@functools.cache
def _model(name, input_shape=None, num_classes=CLASSES, dropout=None):
    """Built once per configuration: the ImageNet models take a second to initialise."""
    return models.build(name, input_shape, num_classes, dropout).eval()


def _dropouts(model):
    return [m for m in model.modules() if isinstance(m, nn.Dropout)]


def _count(model):
    return sum(p.numel() for p in model.parameters())


def _check_forward(model, shape, batch):
    with torch.no_grad():
        out = model(torch.randn(batch, *shape))
    assert out.shape == (batch, CLASSES)
    assert out.dtype == torch.float32
    assert torch.isfinite(out).all()


def test_names_and_default_shapes():
    assert models.names() == ["lenet", "cifarnet", "alexnet", "vgg-a", "googlenet", "mlp", "gpt",
                              "gpt-small"]  # fmt: skip
    assert models.names()[:-2] == IMAGE_MODELS
    assert {name: models.default_input_shape(name) for name in models.names()} == {
        "lenet": (1, 28, 28),
        "cifarnet": (3, 24, 24),
        "alexnet": (3, 224, 224),
        "vgg-a": (3, 224, 224),
        "googlenet": (3, 224, 224),
        "mlp": (1, 28, 28),
        "gpt": (128,),
        "gpt-small": (128,),
    }


@pytest.mark.parametrize("name", IMAGE_MODELS)
def test_forward_shape_on_the_default_input(name):
    batch = 1 if models.default_input_shape(name)[1] >= 224 else 2
    _check_forward(_model(name), models.default_input_shape(name), batch)


@pytest.mark.parametrize("name", IMAGE_MODELS)
def test_forward_shape_on_a_small_input(name):
    _check_forward(_model(name, SMALL[name], dropout=0.0), SMALL[name], 2)


def test_lenet_and_cifarnet_take_rgb_32x32():
    for name in ("lenet", "cifarnet"):
        _check_forward(_model(name, (3, 32, 32)), (3, 32, 32), 2)


@pytest.mark.parametrize("name, side", [("alexnet", 63), ("vgg-a", 32), ("googlenet", 31)])
def test_smallest_input_runs_and_one_less_is_refused(name, side):
    # The adaptive pool lets the model built for 224x224 run on any input that fits its layers.
    with torch.no_grad():
        assert _model(name)(torch.randn(1, 3, side, side)).shape == (1, CLASSES)
        with pytest.raises(RuntimeError):
            _model(name)(torch.randn(1, 3, side - 1, side - 1))
    with pytest.raises(ValueError, match=rf"{name}: input_shape .* height and width .* {side}"):
        models.build(name, (3, side - 1, side - 1))


def test_lenet_has_the_papers_parameter_count():
    assert _count(models.build("lenet")) == 431_080


@pytest.mark.parametrize("name, count", [("alexnet", 61_100_840), ("vgg-a", 132_863_336)])
def test_imagenet_parameter_counts(name, count):
    # torchvision's alexnet and vgg11 counts (1000 classes), with a 7-way classifier instead.
    assert _count(_model(name)) == count - (4096 * 1000 + 1000) + (4096 * CLASSES + CLASSES)


def test_googlenet_follows_table_1():
    model = _model("googlenet")
    blocks = [m for m in model.modules() if isinstance(m, models.Inception)]
    # Table 1's output depths of 3a, 3b, 4a-4e, 5a, 5b.
    assert [b.out_channels for b in blocks] == [256, 480, 512, 512, 512, 528, 832, 832, 1024]
    pools = [m for m in model.features if isinstance(m, nn.MaxPool2d)]
    assert len(pools) == 4 and all(p.ceil_mode and p.kernel_size == 3 for p in pools)
    assert spatial_size(model.features, 224, 224) == (7, 7)
    assert model.fc.in_features == 1024


@pytest.mark.parametrize(
    "input_shape, flat", [((3, 24, 24), 6 * 6 * 64), ((1, 28, 28), 7 * 7 * 64)]
)
def test_cifarnet_fc_input_follows_the_input_shape(input_shape, flat):
    first_fc = next(
        m for m in _model("cifarnet", input_shape).modules() if isinstance(m, nn.Linear)
    )
    assert first_fc.in_features == flat


def test_cifarnet_lrn_is_tensorflows():
    # tf.nn.lrn(x, depth_radius=4, bias=1, alpha=0.001/9, beta=0.75), written out over channels.
    lrns = [m for m in _model("cifarnet").modules() if isinstance(m, nn.LocalResponseNorm)]
    assert len(lrns) == 2
    x = torch.randn(2, 64, 5, 5, dtype=torch.float64) * 10
    squares = nn.functional.pad(x.pow(2), (0, 0, 0, 0, 4, 4))
    sqr_sum = sum(squares[:, i : i + 64] for i in range(9))
    expected = x / (1.0 + 0.001 / 9.0 * sqr_sum) ** 0.75
    torch.testing.assert_close(lrns[0](x), expected)


@pytest.mark.parametrize("name", IMAGE_MODELS)
def test_classifier_is_the_last_module_with_parameters(name):
    model = _model(name)
    owners = [m for m in model.modules() if any(True for _ in m.parameters(recurse=False))]
    last = owners[-1]
    assert isinstance(last, nn.Linear)
    assert last.out_features == CLASSES
    # ... and it produces the logits.
    seen = []
    handle = last.register_forward_hook(lambda _m, _i, out: seen.append(out))
    with torch.no_grad():
        out = model(torch.randn(1, *models.default_input_shape(name)))
    handle.remove()
    torch.testing.assert_close(seen[0], out)


@pytest.mark.parametrize(
    "name, default", [("lenet", None), ("cifarnet", None), ("alexnet", 0.5), ("vgg-a", 0.5),
                      ("googlenet", 0.4), ("mlp", None)],
)  # fmt: skip
def test_default_dropout(name, default):
    ps = {m.p for m in _dropouts(_model(name))}
    assert ps == (set() if default is None else {default})


@pytest.mark.parametrize("name", IMAGE_MODELS)
def test_dropout_given_is_used(name):
    model = _model(name, SMALL[name], dropout=0.3)
    assert _dropouts(model) and all(m.p == 0.3 for m in _dropouts(model))
    x = torch.randn(2, *SMALL[name])
    with torch.no_grad():
        model.train()
        assert not torch.equal(model(x), model(x))  # dropout on the forward path
        model.eval()
        torch.testing.assert_close(model(x), model(x))


@pytest.mark.parametrize("name", IMAGE_MODELS)
def test_dropout_zero_means_none(name):
    assert _dropouts(_model(name, SMALL[name], dropout=0.0)) == []


def test_lenet_dropout_sits_before_the_last_fc():
    layers = list(models.build("lenet", dropout=0.2).classifier)
    assert isinstance(layers[-2], nn.Dropout) and isinstance(layers[-1], nn.Linear)


def test_unknown_name():
    with pytest.raises(ValueError, match=r"unknown model 'lenett' \(did you mean 'lenet'\?\)"):
        models.build("lenett")
    with pytest.raises(
        ValueError,
        match="unknown model 'transformer'; choose one of: lenet, cifarnet, alexnet, vgg-a",
    ):
        models.build("transformer")
    with pytest.raises(ValueError, match=r"did you mean 'vgg-a'"):
        models.default_input_shape("vgga")


@pytest.mark.parametrize(
    "name, input_shape, message",
    [
        ("lenet", (28, 28), r"three positive integers \(channels, height, width\), e\.g\. \(1, 28"),
        ("lenet", (1, 28, 28, 1), "three positive integers"),
        ("cifarnet", (0, 24, 24), "three positive integers"),
        ("cifarnet", (3, 24.0, 24), "three positive integers"),
        ("mlp", 784, "three positive integers"),
        ("lenet", (1, 15, 15), r"lenet: input_shape \(1, 15, 15\) is too small; .* at least 16"),
        ("lenet", (1, 28, 15), "at least 16"),
        ("alexnet", (3, 32, 32), r"at least 63 \(the default input_shape is \(3, 224, 224\)\)"),
        ("vgg-a", (3, 224, 16), "at least 32"),
    ],
)
def test_bad_input_shape(name, input_shape, message):
    with pytest.raises(ValueError, match=message):
        models.build(name, input_shape)


@pytest.mark.parametrize("num_classes", [1, 0, -3, 2.5, True])
def test_bad_num_classes(num_classes):
    with pytest.raises(ValueError, match=r"lenet: num_classes must be an integer >= 2, got"):
        models.build("lenet", num_classes=num_classes)


def test_two_classes_is_enough():
    assert models.build("mlp", num_classes=2)(torch.randn(3, 1, 28, 28)).shape == (3, 2)


@pytest.mark.parametrize("dropout", [-0.1, 1.0, 1.5, True, "0.5"])
def test_bad_dropout(dropout):
    with pytest.raises(ValueError, match=r"mlp: dropout must be None .* probability in \[0, 1\)"):
        models.build("mlp", dropout=dropout)


def test_size_rule_matches_torch():
    # The rule that sizes LeNet's and CIFARNet's fc and finds the smallest input, against PyTorch,
    # including ceil-mode pools whose last window would start in the padding.
    for kernel, stride, ceil, size in itertools.product(
        range(1, 5), range(1, 4), (0, 1), range(1, 10)
    ):
        for padding in range(kernel // 2 + 1):
            pool = nn.MaxPool2d(kernel, stride, padding, ceil_mode=bool(ceil))
            conv = nn.Conv2d(1, 1, kernel, stride, padding)
            for layer in (pool, conv):
                try:
                    expected = layer(torch.zeros(1, 1, size, size + 1)).shape[-2:]
                except RuntimeError:
                    expected = (0, 0)
                got = spatial_size(nn.Sequential(layer), size, size + 1)
                assert got == tuple(expected), (layer, size)
