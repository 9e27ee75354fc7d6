"""The public API on every backend: ``kernels="torch"`` (the reference) and the default give the
same frames and values for every quantizer, empty and non-finite gradients, and a 2-bit
TernGrad message with a digit 3 refused."""

from __future__ import annotations

import pytest
import torch

from terngrad import quantize
from terngrad.kernels import numba_available


def _quantizers() -> list[tuple[str, dict]]:
    """Every registered method with its defaults, and with buckets of 512 where it takes them."""
    cases = []
    for name in quantize.names():
        cases.append((name, {}))
        if "bucket_size" in quantize.get(name).option_names():
            cases.append((name, {"bucket_size": 512}))
    return cases


def _gradient(n: int, seed: int, dtype=torch.float32) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    g = torch.randn(n, generator=gen) * torch.rand(n, generator=gen) ** 3
    g[: min(n, 7)] = 0.0  # a run of zeros
    return g.to(dtype)


INPUTS = {
    "one": dict(n=1),
    "plain": dict(n=5_003),
    "segments": dict(n=3_300, segments=(1_000, 0, 2_000, 7, 293)),
    "float16": dict(n=4_099, dtype=torch.float16),
    "uniform": dict(n=2_048, uniform=True),
}


@pytest.mark.skipif(not numba_available(), reason="numba is not installed")
@pytest.mark.parametrize("case", list(INPUTS))
@pytest.mark.parametrize(("name", "options"), _quantizers(), ids=str)
def test_default_and_reference_give_the_same_frames_and_values(name, options, case):
    spec = INPUTS[case]
    q = quantize.get(name, **options)
    g = _gradient(spec["n"], seed=spec["n"], dtype=spec.get("dtype", torch.float32))
    uniform = torch.rand(g.numel(), generator=torch.Generator().manual_seed(9))

    def encode(kernels):
        return q.encode(
            g,
            torch.Generator().manual_seed(3),
            segments=spec.get("segments"),
            uniform=uniform if spec.get("uniform") else None,
            kernels=kernels,
        )

    fused, ref = encode(None), encode("torch")
    assert torch.equal(fused.to_frame(), ref.to_frame())
    assert fused.shape == tuple(g.shape) and fused.dtype == g.dtype
    expected = q.decode(ref, kernels="torch")
    for kernels in (None, "auto", "numba", "torch"):  # any backend decodes any frame
        assert torch.equal(q.decode(fused, kernels=kernels), expected)
        assert torch.equal(quantize.decode(ref.to_frame(), kernels=kernels), expected)
        out = torch.full(g.shape, 7.0)
        assert q.decode(fused, out=out, kernels=kernels) is out
        assert torch.equal(out, expected)


@pytest.mark.parametrize("kernels", ["auto", "torch"])
@pytest.mark.parametrize("name", quantize.names())
def test_empty_gradients_need_no_kernel(name, kernels):
    q = quantize.get(name)
    enc = q.encode(torch.empty(0, 3), kernels=kernels)
    assert q.decode(enc, kernels=kernels).shape == (0, 3)
    with pytest.raises(ValueError, match="kernels must be one of"):
        q.encode(torch.empty(0), kernels="fast")  # checked even where nothing runs


@pytest.mark.parametrize("kernels", ["auto", "torch"])
@pytest.mark.parametrize("name", quantize.names())
def test_non_finite_gradients_keep_the_reference_message(name, kernels):
    q = quantize.get(name)
    g = torch.randn(3_000)
    g[[0, 1_500]] = torch.tensor([float("nan"), float("-inf")])
    with pytest.raises(ValueError, match=r"gradient has 2 non-finite value\(s\) \(NaN or Inf\)"):
        q.encode(g, kernels=kernels)
    with pytest.raises(ValueError, match=r"gradient has 2 non-finite value\(s\)"):
        q.variance(g, kernels=kernels)


@pytest.mark.parametrize("kernels", ["auto", "torch"])
def test_a_two_bit_ternary_message_with_a_digit_3_is_refused(kernels):
    q = quantize.get("terngrad", packing="2bit")
    enc = q.encode(torch.randn(1_000), kernels=kernels)
    assert q.decode(enc, kernels=kernels).shape == (1_000,)
    enc.payload[10] = 0b11_00_00_00  # one field of 3: a digit the message's 3 levels lack
    with pytest.raises(ValueError, match="has a digit 3 beyond its 3 levels"):
        q.decode(enc, kernels=kernels)
