"""``terngrad bench network``: a bandwidth-limited cluster on one machine, and the step time of
each way a user could train on it, measured in one run.

The testbed is :mod:`terngrad.bench.testbed` (a network namespace per rank on a bridge, links
shaped with ``tc tbf``; root and iproute2). Each rank (``python -m terngrad.bench.network``,
started in its namespace) trains a model on a fixed synthetic batch with one thread, and for
each method measures, over ``steps`` steps after
``warmup`` steps: the step time (the slowest rank's, median over steps), the compute time (the
same steps without DDP, all ranks at once), the bytes its interface sent per step (IP packets:
the real wire, headers included), and, for terngrad's hook, the share of the step spent encoding
and decoding. Methods:

* ``fp32`` — DDP's default all-reduce (ring, gloo);
* ``fp16`` — PyTorch's ``fp16_compress_hook``;
* ``powersgd`` — PyTorch's ``powerSGD_hook`` (rank 2), with DDP in a single bucket: on gloo it
  hangs with several;
* ``terngrad``, ``terngrad-ps``, ``qsgd-5``, ... — this library's hook (sharded unless named).

The methods are those of :data:`terngrad.comm.spec.methods.METHODS`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from terngrad.bench.testbed import PREFIX, BenchFailed, Testbed
from terngrad.comm.spec import methods
from terngrad.train import models
from terngrad.util import lifetime, netdev
from terngrad.util.threads import use_threads
from terngrad.util.timing import timings

DEFAULT_METHODS = ("fp32", "fp16", "powersgd", "terngrad", "terngrad-ps", "qsgd-5")


# --------------------------------------------------------------------------- one rank


def _ddp(model: torch.nn.Module, method: str, seed: int):
    """The DDP model and terngrad hook state (``None`` for PyTorch's own methods)."""
    from torch import nn

    import terngrad.ddp
    from terngrad.train import baselines

    spec = methods.get(method)  # honoured (:func:`honoured`) and named as today
    if spec.baseline is not None:
        return baselines.wrap(model, spec.baseline, seed, spec.powersgd_rank), None
    ddp = nn.parallel.DistributedDataParallel(model)
    state = terngrad.ddp.register(ddp, options=spec.options(seed=seed))
    return ddp, state


def honoured(method: methods.Method) -> methods.Method:
    """``method``, if this benchmark runs all of it: PyTorch's baselines and terngrad's hook on
    SGD steps of a fixed batch (no optimizer recipe, no warm-up); one line otherwise."""
    return method.require("bench network", baselines=tuple(methods.BASELINES))


PROBE_NUMEL = 8 * 2**20  # 32 MiB of float32: long enough to measure a link's rate


def _probe_link(repeats: int = 3) -> list[float]:
    """Seconds of each of ``repeats`` fp32 all-reduces of :data:`PROBE_NUMEL` elements with
    nothing else running: the rate gloo's ring really gets from these links."""
    import torch.distributed as dist

    buf = torch.ones(PROBE_NUMEL)
    dist.all_reduce(buf)  # connections up, buffers allocated
    times = []
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(buf)
        times.append(time.perf_counter() - start)
    return times


def worker(args: argparse.Namespace) -> None:
    """One rank: every method in turn on the same model and batch; rank 0 writes the JSON."""
    import torch.distributed as dist
    from torch import nn

    use_threads(1)  # (every thread: PowerSGD decompresses on gloo's)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    shape = tuple(args.input_shape) if args.input_shape else models.default_input_shape(args.model)
    gen = torch.Generator().manual_seed(1000 + rank)
    x = torch.randn(args.batch_size, *shape, generator=gen)
    y = torch.randint(0, 10, (args.batch_size,), generator=gen)

    def fresh_model() -> nn.Module:
        torch.manual_seed(args.seed)
        return models.build(args.model, shape, 10)

    def compute_step(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()

    probe = _probe_link()
    model = fresh_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    dist.barrier()
    compute = timings(lambda: compute_step(model, optimizer), args.steps, warmup=1)
    rows = []
    for method in args.methods:
        model = fresh_model()
        ddp, state = _ddp(model, method, args.seed)
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
        for _ in range(args.warmup):
            compute_step(ddp, optimizer)
        dist.barrier()
        interface = netdev.interface_from_env() or ""
        sent, codec = netdev.tx_bytes(interface), state.timing.codec_seconds if state else 0.0
        resent = netdev.tcp_retransmits()
        times = timings(lambda m=ddp, o=optimizer: compute_step(m, o), args.steps)
        dist.barrier()
        row = {
            "method": method,
            "step_seconds": times,
            "wire_bytes_per_step": (netdev.tx_bytes(interface) - sent) / args.steps,
            "retransmitted_per_step": (netdev.tcp_retransmits() - resent) / args.steps,
            "codec_seconds_per_step": (
                (state.timing.codec_seconds - codec) / args.steps if state else 0.0
            ),
            "hook_bytes_per_step": state.stats.last_step_bytes_sent if state else None,
        }
        rows.append(row)
        if rank == 0:  # progress, in rank 0's log
            print(f"{method}: median step {statistics.median(times):.3f} s", flush=True)
        del ddp, state
    gathered: list[Any] = [None] * world
    dist.all_gather_object(
        gathered, {"compute_seconds": compute, "probe_seconds": probe, "methods": rows}
    )
    if rank == 0:
        Path(args.result).write_text(json.dumps({"ranks": gathered}))
    dist.barrier()
    dist.destroy_process_group()


# --------------------------------------------------------------------------- the benchmark


def summarise(
    raw: dict, ranks: int, bandwidth: str, model: str, batch_size: int | None = None,
    input_shape: Sequence[int] | None = None,
) -> dict:  # fmt: skip
    """Per method: median over steps of the slowest rank's step time, speedup against fp32,
    bytes per rank per step (mean and busiest rank), the encode/decode share; compute time
    and the link probe (an fp32 all-reduce alone) the same way."""
    per_rank = raw["ranks"]
    compute = statistics.median(
        max(s) for s in zip(*(r["compute_seconds"] for r in per_rank), strict=True)
    )
    probe = statistics.median(
        max(s) for s in zip(*(r["probe_seconds"] for r in per_rank), strict=True)
    )
    probe_bytes = 2 * (ranks - 1) * PROBE_NUMEL * 4 // ranks
    rows = []
    for i, first in enumerate(per_rank[0]["methods"]):
        steps = [
            max(s) for s in zip(*(r["methods"][i]["step_seconds"] for r in per_rank), strict=True)
        ]
        step = statistics.median(steps)
        codec = statistics.mean(r["methods"][i]["codec_seconds_per_step"] for r in per_rank)
        rows.append({
            "method": first["method"],
            "description": methods.get(methods.canonical(first["method"])).label,
            "step_seconds": step,
            "wire_bytes_per_rank_per_step": statistics.mean(
                r["methods"][i]["wire_bytes_per_step"] for r in per_rank
            ),
            "max_wire_bytes_per_rank_per_step": max(
                r["methods"][i]["wire_bytes_per_step"] for r in per_rank
            ),
            "codec_share": codec / step,
            "tcp_retransmits_per_step": sum(
                r["methods"][i].get("retransmitted_per_step", 0.0) for r in per_rank
            ),
        })  # fmt: skip
    base = next((m["step_seconds"] for m in rows if m["method"] == "fp32"), None)
    for m in rows:
        m["speedup_vs_fp32"] = base / m["step_seconds"] if base else None
    return {
        "ranks": ranks,
        "bandwidth": bandwidth,
        "model": model,
        "batch_size": batch_size,
        "input_shape": list(input_shape or models.default_input_shape(model)),
        "compute_seconds": compute,
        "link_probe": {
            "what": "fp32 ring all-reduce alone, bytes sent per rank / slowest rank's seconds",
            "bytes_per_rank": probe_bytes,
            "seconds": probe,
            "bytes_per_second": probe_bytes / probe,
        },
        "methods": rows,
    }


def table(summary: dict) -> str:
    lines = [
        f"{summary['model']}, {summary['ranks']} ranks, links {summary['bandwidth']}; compute "
        f"alone {summary['compute_seconds']:.3f} s a step (all ranks sharing this machine's cores)",
        f"{'method':<20}{'step s':>9}{'speedup':>9}{'MB/rank/step':>14}{'encode %':>10}",
    ]
    for m in summary["methods"]:
        speedup = f"{m['speedup_vs_fp32']:.2f}x" if m["speedup_vs_fp32"] else "-"
        lines.append(
            f"{m['method']:<20}{m['step_seconds']:>9.3f}{speedup:>9}"
            f"{m['wire_bytes_per_rank_per_step'] / 1e6:>14.2f}{100 * m['codec_share']:>9.1f}%"
        )
    return "\n".join(lines)


def plot(summary: dict, path: Path) -> None:
    """Bar chart of the speedup against fp32, one bar per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from terngrad.util.files import atomic_write

    shown = [m for m in summary["methods"] if m["speedup_vs_fp32"]]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    bars = ax.bar([m["method"] for m in shown], [m["speedup_vs_fp32"] for m in shown])
    ax.bar_label(bars, fmt="%.2fx")
    ax.axhline(1.0, color="gray", linewidth=0.8)
    ax.set_ylabel("step-time speedup vs fp32")
    ax.set_title(
        f"{summary['model']}, {summary['ranks']} ranks, {summary['bandwidth']} links (measured)"
    )
    fig.tight_layout()
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=120))
    plt.close(fig)


def run(
    ranks: int,
    bandwidth: str,
    model: str,
    names: Sequence[str],
    out: Path,
    batch_size: int = 8,
    steps: int = 5,
    warmup: int = 3,
    seed: int = 0,
    timeout: float = 600.0,
    prefix: str = PREFIX,
    input_shape: Sequence[int] | None = None,
) -> dict:
    """Build the testbed, run every rank, tear it down; write ``results.json`` and
    ``speedup.png`` into ``out`` and return the summary. ``input_shape`` (C, H, W): the
    synthetic batch's images (default: the model's own input, 3x32x32 for ``cifarnet``)."""
    from terngrad.util.files import atomic_write_text

    chosen = [honoured(m).name for m in methods.select(names)]  # refused here, at once
    from terngrad import kernels

    kernels.warm_up(levels=True, threads=1)  # the ranks' build, compiled once here
    testbed = Testbed(ranks, bandwidth, prefix)  # checks the ranks and the rate first
    testbed.check()  # (and what is in its way, before anything is written)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as folder, testbed as bed:
        result = Path(folder, "raw.json")
        argv = ["--model", model, "--batch-size", str(batch_size), "--steps", str(steps),
                "--warmup", str(warmup), "--seed", str(seed), "--timeout", str(int(timeout)),
                "--result", str(result), "--methods", *chosen]  # fmt: skip
        if input_shape:
            argv += ["--input-shape", *map(str, input_shape)]
        bed.run(argv, out, timeout)
        if not result.exists():
            raise BenchFailed(f"rank 0 wrote no result; the ranks' logs: {out}/rank*.log")
        raw = json.loads(result.read_text())
        summary = summarise(raw, ranks, bandwidth, model, batch_size, input_shape)
    atomic_write_text(out / "results.json", json.dumps(summary, indent=2) + "\n")
    plot(summary, out / "speedup.png")
    return summary


def main(argv: list[str] | None = None) -> None:
    """The per-rank entry point (``python -m terngrad.bench.network``)."""
    p = argparse.ArgumentParser(description="one rank of terngrad bench network")
    p.add_argument("--model", required=True)
    p.add_argument("--batch-size", type=int, required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--warmup", type=int, required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--timeout", type=int, required=True)
    p.add_argument("--result", required=True)
    p.add_argument("--methods", nargs="+", required=True)
    p.add_argument("--input-shape", type=int, nargs=3)
    args = p.parse_args(argv)
    lifetime.exit_with(os.getppid(), "the bench that started this rank")
    worker(args)


if __name__ == "__main__":
    main()
