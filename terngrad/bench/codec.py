"""``terngrad bench codec``: what encoding and decoding cost against what they save.

For each tensor size, in one run, the median over ``repeats`` timed calls after a warm-up of:

* ``half()`` — all that PyTorch's fp16 hook pays to compress (it allocates its output, as the
  hook does; whether that costs page faults depends on the allocator's state, so this time can
  differ by 4x between runs of the same size);
* ``half() into buffer`` — the same cast into a preallocated tensor: the no-allocation floor;
* ``clone()`` — the memory-copy floor;
* per kernel backend (``numba``: the fused kernels; ``torch``: the reference), the exchange's own
  code path for one bucket of TernGrad (c = 2.5, per-tensor scale, base-3 packing):

  - ``encode``: statistics and scale, clip, stochastic rounding with the counter-based draws,
    packing into a checksummed frame (``GridStep.frame``);
  - ``decode``: check the frame, unpack and write ``s * sum / N`` into an existing float32
    buffer (as the hook writes into the DDP bucket);
  - ``owner sum``: the shard owner's work in the sharded exchange with N workers — check and
    unpack N frames of a shard of size/N, add, pack the sums in base 2N + 1 into a frame;
  - encode's passes one by one: the ``statistics pass`` (``grid_prepare``: the float64 sums and
    ``max |g|`` that give the scale), the ``rounding pass`` (``grid_pack``: clip, round with the
    counter-based draws, pack, into a preallocated payload), the same with ``draws given``
    (uniforms read from memory instead of hashed: what the hash costs, against 4 more bytes
    read an element), and the ``frame checksum`` (CRC-32 of the frame);

* per quantizer (every one by default, default options), the public API: ``encode`` with a
  generator and ``decode(enc, out=buffer)`` (into an existing tensor, as the hook decodes) — on
  the fused kernels (every quantizer that packs digits), the float baselines in torch.

Each is reported in milliseconds, as a ratio to the cast into a preallocated buffer (the
yardstick: the memory floor, stable between runs), as a ratio to ``half()``, and as GB/s of
float32 input read (size * 4 bytes / time; the owner's figure counts its shard's share). Ratios
measured in one run are what to compare: absolute times depend on the machine and its load.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from terngrad import quantize
from terngrad.comm.exchanges.exchange import shard_bounds
from terngrad.comm.exchanges.grid_step import GridStep
from terngrad.kernels import Streams, resolve
from terngrad.quantize import Layout
from terngrad.util.timing import median_seconds
from terngrad.wire import seal_frame


def _grid_ops(kernels: str, g: torch.Tensor, workers: int) -> list[tuple[str, Callable, int]]:
    """The encode, decode and owner-sum operations of one backend on ``g``."""
    backend = resolve(kernels)
    q = quantize.get("terngrad")
    numel = g.numel()
    layout = Layout.of(numel)
    draws = Streams((12345,))

    def step() -> GridStep:
        grid = backend.grid_prepare(q, g, layout)
        return GridStep(backend, grid, grid.local, draws)

    ready = step()
    lo, hi = shard_bounds(numel, workers)[0]
    shard_frames = [ready.frame(lo, hi) for _ in range(workers)]
    summed = ready.sum_frames([ready.frame(0, numel)] * workers, numel, 1)
    out = torch.empty(numel)
    payload = torch.empty(q.codec.nbytes(numel), dtype=torch.uint8)
    uniform = torch.rand(numel, generator=torch.Generator().manual_seed(1))
    grid, frame = ready.grid, ready.frame(0, numel)

    def rounding(given: torch.Tensor | Streams) -> None:
        backend.grid_pack(grid, grid.local, given, 0, numel, q.codec, payload)

    return [
        (f"encode [{kernels}]", lambda: step().frame(0, numel), numel),
        (f"decode [{kernels}]", lambda: ready.decode(summed, 0, out, workers, 0), numel),
        (
            f"owner sum, {workers} workers [{kernels}]",
            lambda: ready.sum_frames(shard_frames, hi - lo, 1),
            hi - lo,
        ),
        (f"  statistics pass [{kernels}]", lambda: backend.grid_prepare(q, g, layout), numel),
        (f"  rounding pass [{kernels}]", lambda: rounding(draws), numel),
        (f"  rounding, draws given [{kernels}]", lambda: rounding(uniform), numel),
        (f"  frame checksum [{kernels}]", lambda: seal_frame(frame), numel),
    ]


def _public_ops(names: Sequence[str], g: torch.Tensor) -> list[tuple[str, Callable, int]]:
    """``Quantizer.encode`` and ``decode`` of each quantizer (default options) on ``g``: the
    public API, on the fused kernels where they exist."""
    ops = []
    out = torch.empty_like(g)
    for name in names:
        q = quantize.get(name)
        gen = torch.Generator().manual_seed(0)
        enc = q.encode(g, generator=gen)
        ops += [
            (f"{name} encode [public]", lambda q=q, gen=gen: q.encode(g, generator=gen), g.numel()),
            (f"{name} decode [public]", lambda q=q, enc=enc: q.decode(enc, out=out), g.numel()),
        ]
    return ops


def _seconds(fn: Callable[[], Any], repeats: int) -> float:
    """The median of ``repeats`` timed calls after a warm-up; one call for an operation whose
    warm-up took over 2 s (BinGrad-pb's level search on a large tensor)."""
    start = time.perf_counter()
    fn()
    if time.perf_counter() - start > 2.0:
        return median_seconds(fn, 1)
    return median_seconds(fn, repeats)


def measure(
    numel: int,
    repeats: int = 5,
    workers: int = 4,
    seed: int = 0,
    kernels: Sequence[str] = ("numba", "torch"),
    quantizers: Sequence[str] = (),
) -> list[dict]:
    """Rows ``{"op", "numel", "input_numel", "seconds"}`` for one tensor size: the floors, the
    exchange's grid path per backend in ``kernels``, the public API of each of ``quantizers``."""
    g = torch.randn(numel, generator=torch.Generator().manual_seed(seed)) * 1e-3
    h = torch.empty(numel, dtype=torch.float16)
    ops: list[tuple[str, Callable[[], Any], int]] = [
        ("half()", g.half, numel),
        (CAST, lambda: h.copy_(g), numel),
        ("clone()", g.clone, numel),
    ]
    for name in kernels:
        ops += _grid_ops(name, g, workers)
    ops += _public_ops(quantizers, g)
    return [
        {"op": name, "numel": numel, "input_numel": read, "seconds": _seconds(fn, repeats)}
        for name, fn, read in ops
    ]


CAST = "half() into buffer"


def cpu_name() -> str:
    """This machine's processor, as ``lscpu`` names it (where the tables came from)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    return names[0] if names else platform.processor() or "unknown CPU"


def table(rows: list[dict]) -> str:
    """A plain-text table: ms, the ratio to the cast into a preallocated buffer (the
    yardstick), the ratio to an allocating ``half()``, GB/s of input read."""
    cast = {r["numel"]: r["seconds"] for r in rows if r["op"] == CAST}
    half = {r["numel"]: r["seconds"] for r in rows if r["op"] == "half()"}
    lines = [f"{'size':>12}  {'operation':<34}{'ms':>10}{'x cast':>9}{'x half()':>10}{'GB/s':>8}"]
    for r in rows:
        gbps = 4 * r["input_numel"] / r["seconds"] / 1e9
        lines.append(
            f"{r['numel']:>12,}  {r['op']:<34}{1e3 * r['seconds']:>10.2f}"
            f"{r['seconds'] / cast[r['numel']]:>9.2f}{r['seconds'] / half[r['numel']]:>10.2f}"
            f"{gbps:>8.2f}"
        )
    return "\n".join(lines)
