"""``terngrad bench codec``: what encoding and decoding cost against what they save.

For each tensor size, in one run, the median over ``repeats`` timed calls after a warm-up of:

* ``half()`` — all that PyTorch's fp16 hook pays to compress;
* ``clone()`` — the memory-copy floor;
* TernGrad ``encode`` (clip, scale, stochastic rounding, base-3 packing) and ``decode``;
* the shard owner's work in the sharded exchange with N workers: unpack N frames of ternary codes
  for a shard of size/N, add them, pack the sums in base 2N + 1 into a frame.

Each is reported in milliseconds, as a ratio to ``half()`` on the same tensor, and as GB/s of
float32 input read (size * 4 bytes / time; the owner's figure counts its shard's share). Ratios
measured in one run are what to compare: absolute times depend on the machine and its load.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from terngrad import quantize
from terngrad.comm.exchange import codes_frame, read_codes, shard_bounds
from terngrad.quantize import Layout


def _median_seconds(fn: Callable[[], Any], repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(numel: int, repeats: int = 5, workers: int = 4, seed: int = 0) -> list[dict]:
    """Rows ``{"op", "numel", "seconds"}`` for one tensor size."""
    gen = torch.Generator().manual_seed(seed)
    g = torch.randn(numel, generator=gen) * 1e-3
    q = quantize.get("terngrad")
    enc = q.encode(g, generator=gen)
    shard = shard_bounds(numel, workers)[0]
    size = shard[1] - shard[0]
    layout = Layout.of(numel, None, None)
    _, digits = q.quantize(g, layout, gen, scale=q.local_scales(g))
    frames = [codes_frame(q.method_id, digits[:size] - 1, 1, 1) for _ in range(workers)]

    def owner_sum() -> torch.Tensor:
        total = sum(read_codes(f, q.method_id, size, 1, 1, r) for r, f in enumerate(frames))
        return codes_frame(q.method_id, total, workers, 1)

    ops: list[tuple[str, Callable[[], Any], int]] = [
        ("half()", g.half, numel),
        ("clone()", g.clone, numel),
        ("terngrad encode", lambda: q.encode(g, generator=gen), numel),
        ("terngrad decode", lambda: q.decode(enc), numel),
        (f"owner sum, {workers} workers", owner_sum, size),
    ]
    return [
        {"op": name, "numel": numel, "input_numel": read, "seconds": _median_seconds(fn, repeats)}
        for name, fn, read in ops
    ]


def table(rows: list[dict]) -> str:
    """A plain-text table: ms, ratio to half() of the same size, GB/s of input read."""
    half = {r["numel"]: r["seconds"] for r in rows if r["op"] == "half()"}
    lines = [f"{'size':>12}  {'operation':<24}{'ms':>10}{'x half()':>10}{'GB/s':>8}"]
    for r in rows:
        gbps = 4 * r["input_numel"] / r["seconds"] / 1e9
        lines.append(
            f"{r['numel']:>12,}  {r['op']:<24}{1e3 * r['seconds']:>10.2f}"
            f"{r['seconds'] / half[r['numel']]:>10.2f}{gbps:>8.2f}"
        )
    return "\n".join(lines)
