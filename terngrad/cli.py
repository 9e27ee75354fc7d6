"""The ``terngrad`` command line.

``terngrad demo`` compares every quantizer on one gradient-shaped tensor: wire bytes, the
reduction against fp32, the exact normalised error ``E||Q(g) - g||^2 / ||g||^2``, and encode
and decode time, all measured in the same run.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from terngrad import __version__, quantize


def _demo_gradient(numel: int, seed: int) -> torch.Tensor:
    """A bell-shaped gradient with a heavy tail, like the layer histograms of TernGrad Fig. 2:
    Gaussian values with 1 % of them drawn 10x wider."""
    gen = torch.Generator().manual_seed(seed)
    g = torch.randn(numel, generator=gen) * 1e-3
    wide = torch.rand(numel, generator=gen) < 0.01
    return torch.where(wide, g * 10, g)


def _time(fn, repeats: int) -> float:
    fn()  # warm-up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def demo(args: argparse.Namespace) -> int:
    g = _demo_gradient(args.numel, args.seed)
    norm2 = float(g.double().square().sum())
    print(
        f"terngrad {__version__}: every quantizer on one synthetic gradient of {args.numel:,} "
        f"float32 elements\n(bell-shaped with a 1 % heavy tail; seed {args.seed}; "
        f"times are the best of {args.repeats} runs on this machine)\n"
    )
    header = (
        f"{'method':<12}{'bytes':>12}{'bits/elem':>11}{'vs fp32':>9}"
        f"{'E|Q-g|^2/|g|^2':>16}{'encode ms':>11}{'decode ms':>11}"
    )
    print(header)
    print("-" * len(header))
    fp32_bytes = quantize.get("fp32").encode(g).nbytes
    for name in quantize.names():
        q = quantize.get(name)
        gen = torch.Generator().manual_seed(args.seed)
        enc = q.encode(g, generator=gen)
        t_enc = _time(lambda q=q, gen=gen: q.encode(g, generator=gen), args.repeats)
        t_dec = _time(lambda q=q, enc=enc: q.decode(enc), args.repeats)
        print(
            f"{name:<12}{enc.nbytes:>12,}{enc.bits_per_element:>11.3f}"
            f"{fp32_bytes / enc.nbytes:>8.1f}x{q.variance(g) / norm2:>16.4f}"
            f"{1e3 * t_enc:>11.1f}{1e3 * t_dec:>11.1f}"
        )
    print(
        "\nDefaults: terngrad clips at 2.5 sigma, one scale per tensor, base-3 packing; "
        "qsgd/linear/orq use 5 levels in buckets of 512."
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="terngrad",
        description="Communication-efficient data-parallel training with quantized gradients.",
    )
    parser.add_argument("--version", action="version", version=f"terngrad {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("demo", help="compare every quantizer on one gradient")
    p.add_argument("--numel", type=_positive_int, default=1_000_000, help="gradient size")
    p.add_argument("--seed", type=int, default=0, help="random seed")
    p.add_argument("--repeats", type=_positive_int, default=3, help="timing repeats")
    p.set_defaults(func=demo)
    return parser


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
