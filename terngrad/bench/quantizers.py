"""``terngrad bench quantizers``: every quantizer on one gradient-shaped tensor.

Bytes on the wire, bits per element, the reduction against fp32, the exact normalised error
``E||Q(g) - g||^2 / ||g||^2`` and encode/decode time (best of ``repeats``), in one run.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from terngrad import quantize


def demo_gradient(numel: int, seed: int) -> torch.Tensor:
    """A bell-shaped gradient with a heavy tail, like the layer histograms of TernGrad Fig. 2:
    Gaussian values with 1 % of them drawn 10x wider."""
    gen = torch.Generator().manual_seed(seed)
    g = torch.randn(numel, generator=gen) * 1e-3
    wide = torch.rand(numel, generator=gen) < 0.01
    return torch.where(wide, g * 10, g)


def _best_seconds(fn: Callable[[], Any], repeats: int) -> float:
    fn()  # warm-up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def report(numel: int, seed: int, repeats: int) -> str:
    g = demo_gradient(numel, seed)
    norm2 = float(g.double().square().sum())
    header = (
        f"{'method':<12}{'bytes':>12}{'bits/elem':>11}{'vs fp32':>9}"
        f"{'E|Q-g|^2/|g|^2':>16}{'encode ms':>11}{'decode ms':>11}"
    )
    lines = [
        f"every quantizer on one synthetic gradient of {numel:,} float32 elements",
        f"(bell-shaped with a 1 % heavy tail; seed {seed}; times are the best of {repeats} runs "
        "on this machine)",
        "",
        header,
        "-" * len(header),
    ]
    fp32_bytes = quantize.get("fp32").encode(g).nbytes
    for name in quantize.names():
        q = quantize.get(name)
        gen = torch.Generator().manual_seed(seed)
        enc = q.encode(g, generator=gen)
        t_enc = _best_seconds(lambda q=q, gen=gen: q.encode(g, generator=gen), repeats)
        t_dec = _best_seconds(lambda q=q, enc=enc: q.decode(enc), repeats)
        lines.append(
            f"{name:<12}{enc.nbytes:>12,}{enc.bits_per_element:>11.3f}"
            f"{fp32_bytes / enc.nbytes:>8.1f}x{q.variance(g) / norm2:>16.4f}"
            f"{1e3 * t_enc:>11.1f}{1e3 * t_dec:>11.1f}"
        )
    lines += [
        "",
        "Defaults: terngrad clips at 2.5 sigma, one scale per tensor, base-3 packing; "
        "qsgd/linear/orq use 5 levels in buckets of 512.",
    ]
    return "\n".join(lines)
