"""``terngrad bench network``: a bandwidth-limited cluster on one machine, and the step time of
each way a user could train on it, measured in one run.

The testbed: N network namespaces ``tg-r0 .. tg-r{N-1}``, one per rank, each joined by a veth
pair to a bridge in a hub namespace ``tg-hub``, both ends of every link shaped with
``tc ... tbf`` to the given rate — a switch with N ports of that speed. Addresses are
``10.213.0.{r+1}/24``, inside these namespaces only; nothing is routed anywhere else. It needs
root and iproute2; everything is torn down on exit, on Ctrl-C and on error, and
``terngrad bench network --cleanup`` removes leftovers of a killed run.

Each rank (``python -m terngrad.bench.network``, started in its namespace) trains a model on a
fixed synthetic batch with one thread, and for each method measures, over ``steps`` steps after
``warmup`` steps: the step time (the slowest rank's, median over steps), the compute time (the
same steps without DDP, all ranks at once), the bytes its interface sent per step (IP packets:
the real wire, headers included), and, for terngrad's hook, the share of the step spent encoding
and decoding. Methods:

* ``fp32`` — DDP's default all-reduce (ring, gloo);
* ``fp16`` — PyTorch's ``fp16_compress_hook``;
* ``powersgd`` — PyTorch's ``powerSGD_hook`` (rank 2), with DDP in a single bucket: on gloo it
  hangs with several;
* ``terngrad``, ``terngrad-ps``, ``terngrad-allgather``, ``qsgd``, ``orq`` — this library's hook
  (sharded unless named).

The methods are those of :mod:`terngrad.bench.methods`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from terngrad.bench import methods as bench_methods
from terngrad.train import models
from terngrad.util import netdev
from terngrad.util.timing import timings

PREFIX = "tg"
SUBNET = "10.213.0"
PORT = 29517
BANDWIDTHS = ("100mbit", "1gbit", "10gbit", "unlimited")
#: each method's label, by name
METHODS = {name: m.label for name, m in bench_methods.METHODS.items()}
DEFAULT_METHODS = bench_methods.DEFAULT_METHODS


class TestbedUnavailable(RuntimeError):
    """The machine cannot host the testbed (not root, no iproute2, no namespaces)."""


class BenchFailed(RuntimeError):
    """A rank failed or the run outlived its timeout (the ranks' logs say more)."""


def rate_bits(bandwidth: str) -> int | None:
    """Bits per second of ``100mbit``/``1gbit``/``10gbit``-style rates; ``None`` for
    ``unlimited``; ``ValueError`` for anything else."""
    units = {"kbit": 10**3, "mbit": 10**6, "gbit": 10**9}
    text = bandwidth.strip().lower()
    if text == "unlimited":
        return None
    for unit, scale in units.items():
        number = text.removesuffix(unit)
        if number != text:
            try:
                value = float(number)
            except ValueError:
                break
            if value > 0:
                return int(value * scale)
    raise ValueError(
        f"bandwidth must be a rate such as 100mbit, 1gbit, 2.5gbit or 'unlimited', "
        f"got {bandwidth!r}"
    )


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run an ip/tc command; ``TestbedUnavailable`` with its message if it fails."""
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if check and done.returncode:
        raise TestbedUnavailable(
            f"'{' '.join(argv)}' failed: {done.stderr.strip() or f'exit {done.returncode}'}"
        )
    return done


def _namespaces() -> list[str]:
    out = _run("ip", "netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _ours(name: str, prefix: str) -> bool:
    """True for the names this tool gives: ``{prefix}-hub`` and ``{prefix}-r<rank>``."""
    rest = name.removeprefix(f"{prefix}-")
    return rest != name and (rest == "hub" or (rest[:1] == "r" and rest[1:].isdigit()))


def cleanup(prefix: str = PREFIX) -> list[str]:
    """Delete the namespaces this tool makes (``{prefix}-hub``, ``{prefix}-r<rank>``); returns
    the names deleted. Deleting a namespace deletes the veth ends and qdiscs in it.
    ``TestbedUnavailable`` if one could not be deleted (not root?)."""
    gone, failed = [], []
    for name in _namespaces():
        if _ours(name, prefix):
            done = _run("ip", "netns", "delete", name, check=False)
            (failed if done.returncode else gone).append(name)
    if failed:
        raise TestbedUnavailable(f"could not delete namespaces {failed} (run as root)")
    return gone


def check_host() -> None:
    """``TestbedUnavailable`` naming what is missing to build the testbed here."""
    if os.geteuid() != 0:
        raise TestbedUnavailable(
            "terngrad bench network needs root (it creates network namespaces and shapes "
            "links with tc): run it with sudo, or as root in a container with CAP_NET_ADMIN"
        )
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise TestbedUnavailable(
                f"terngrad bench network needs the '{tool}' command from iproute2: install "
                "iproute2 (Debian/Ubuntu: apt install iproute2)"
            )


@dataclass
class Testbed:
    """``ranks`` namespaces on a bridge, links shaped to ``bandwidth``; a context manager that
    builds it on entry and always tears it down."""

    ranks: int
    bandwidth: str = "1gbit"
    prefix: str = PREFIX

    def __post_init__(self) -> None:
        if not 2 <= self.ranks <= 8:
            raise ValueError(f"the testbed has 2 to 8 ranks, got {self.ranks}")
        self.rate = rate_bits(self.bandwidth)

    def namespace(self, rank: int) -> str:
        return f"{self.prefix}-r{rank}"

    def interface(self, rank: int) -> str:
        return f"{self.prefix}v{rank}"

    @staticmethod
    def address(rank: int) -> str:
        return f"{SUBNET}.{rank + 1}"

    def __enter__(self) -> Testbed:
        check_host()
        if any(_ours(name, self.prefix) for name in _namespaces()):
            raise TestbedUnavailable(
                f"namespaces {self.prefix}-* already exist (another run, or a killed one): "
                "remove them with 'terngrad bench network --cleanup'"
            )
        self._signals = {
            sig: signal.signal(sig, self._interrupted) for sig in (signal.SIGINT, signal.SIGTERM)
        }
        try:
            self._build()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._restore_signals()
        cleanup(self.prefix)

    def _restore_signals(self) -> None:
        for sig, handler in getattr(self, "_signals", {}).items():
            signal.signal(sig, handler)
        self._signals = {}

    def _interrupted(self, signum: int, frame: Any) -> None:
        self._restore_signals()  # a second signal during the teardown acts as usual
        cleanup(self.prefix)
        raise KeyboardInterrupt(f"signal {signum}: testbed removed")

    def _shape(self, namespace: str, device: str) -> None:
        if self.rate is None:
            return
        burst = max(self.rate // 8 // 100, 65536)  # 10 ms of traffic, at least 64 KB
        _run("ip", "netns", "exec", namespace, "tc", "qdisc", "add", "dev", device, "root",
             "tbf", "rate", str(self.rate), "burst", str(burst), "latency", "50ms")  # fmt: skip

    def _build(self) -> None:
        hub = f"{self.prefix}-hub"
        _run("ip", "netns", "add", hub)
        _run("ip", "-n", hub, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", hub, "link", "set", "br0", "up")
        for r in range(self.ranks):
            ns, inner, outer = self.namespace(r), self.interface(r), f"{self.prefix}p{r}"
            _run("ip", "netns", "add", ns)
            _run("ip", "link", "add", inner, "netns", ns, "type", "veth", "peer", "name",
                 outer, "netns", hub)  # fmt: skip
            _run("ip", "-n", ns, "addr", "add", f"{self.address(r)}/24", "dev", inner)
            _run("ip", "-n", ns, "link", "set", inner, "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            _run("ip", "-n", hub, "link", "set", outer, "master", "br0")
            _run("ip", "-n", hub, "link", "set", outer, "up")
            self._shape(ns, inner)
            self._shape(hub, outer)

    def launch(
        self,
        rank: int,
        argv: Sequence[str],
        log: Path,
        module: str = "terngrad.bench.network",
        port: int = PORT,
    ) -> subprocess.Popen:
        """Start ``python -m <module> <argv>`` as rank ``rank`` in its namespace, its output
        into ``log``; ``torch.distributed``'s environment rendezvous at rank 0's address and
        ``port`` (``LOCAL_WORLD_SIZE``: every rank shares this machine's cores)."""
        env = {
            **os.environ,
            "MASTER_ADDR": self.address(0),
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "WORLD_SIZE": str(self.ranks),
            "LOCAL_WORLD_SIZE": str(self.ranks),
            "GLOO_SOCKET_IFNAME": self.interface(rank),
            netdev.INTERFACE_ENV: self.interface(rank),
            "OMP_NUM_THREADS": "1",
        }
        cmd = ["ip", "netns", "exec", self.namespace(rank), sys.executable, "-m", module,
               *argv]  # fmt: skip
        with log.open("w") as out:  # the child keeps its own descriptor
            return subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)

    def run(
        self,
        argv: Sequence[str],
        logs: Path,
        timeout: float,
        module: str = "terngrad.bench.network",
        port: int = PORT,
        tick: Callable[[], None] | None = None,
    ) -> None:
        """Every rank runs ``python -m <module> <argv>`` (:meth:`launch`; logs
        ``logs/rank<r>.log``) until all have finished, calling ``tick`` now and then;
        ``BenchFailed`` when one fails or ``timeout`` seconds pass, the others killed."""
        procs: list[subprocess.Popen] = []
        try:
            for r in range(self.ranks):
                procs.append(self.launch(r, argv, logs / f"rank{r}.log", module, port))
            wait_all(procs, time.monotonic() + timeout, logs, tick)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        failed = [r for r, p in enumerate(procs) if p.returncode != 0]
        if failed:
            raise BenchFailed(f"ranks {failed} failed; their logs: {logs}/rank*.log")


# --------------------------------------------------------------------------- one rank


def _ddp(model: torch.nn.Module, method: str, seed: int):
    """The DDP model and terngrad hook state (``None`` for PyTorch's own methods)."""
    from torch import nn

    import terngrad.ddp
    from terngrad.train import baselines

    spec = bench_methods.method(method)
    if spec.builtin is not None:
        return baselines.wrap(model, spec.builtin, seed), None
    ddp = nn.parallel.DistributedDataParallel(model)
    state = terngrad.ddp.register(ddp, spec.quantizer, spec.topology, seed=seed, **spec.options)
    return ddp, state


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

    torch.set_num_threads(1)
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
    methods = []
    for i, first in enumerate(per_rank[0]["methods"]):
        steps = [
            max(s) for s in zip(*(r["methods"][i]["step_seconds"] for r in per_rank), strict=True)
        ]
        step = statistics.median(steps)
        codec = statistics.mean(r["methods"][i]["codec_seconds_per_step"] for r in per_rank)
        methods.append({
            "method": first["method"],
            "description": METHODS[first["method"]],
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
    base = next((m["step_seconds"] for m in methods if m["method"] == "fp32"), None)
    for m in methods:
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
        "methods": methods,
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

    methods = [m for m in summary["methods"] if m["speedup_vs_fp32"]]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    bars = ax.bar([m["method"] for m in methods], [m["speedup_vs_fp32"] for m in methods])
    ax.bar_label(bars, fmt="%.2fx")
    ax.axhline(1.0, color="gray", linewidth=0.8)
    ax.set_ylabel("step-time speedup vs fp32")
    ax.set_title(
        f"{summary['model']}, {summary['ranks']} ranks, {summary['bandwidth']} links (measured)"
    )
    fig.tight_layout()
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=120))
    plt.close(fig)


def wait_all(
    procs: list[subprocess.Popen],
    deadline: float,
    out: Path,
    tick: Callable[[], None] | None = None,
) -> None:
    """Wait for every rank, calling ``tick`` now and then (progress); ``BenchFailed`` as soon
    as one fails or the deadline passes (the others would otherwise wait for it until gloo's
    timeout)."""
    while any(p.poll() is None for p in procs):
        if tick is not None:
            tick()
        failed = [r for r, p in enumerate(procs) if p.poll() not in (None, 0)]
        if failed:
            raise BenchFailed(f"ranks {failed} failed; their logs: {out}/rank*.log")
        if time.monotonic() > deadline:
            raise BenchFailed(f"the ranks did not finish in time; their logs: {out}/rank*.log")
        time.sleep(0.2)


def run(
    ranks: int,
    bandwidth: str,
    model: str,
    methods: Sequence[str],
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

    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        raise ValueError(f"unknown methods {unknown}; choose from: {', '.join(METHODS)}")
    testbed = Testbed(ranks, bandwidth, prefix)  # checks the ranks and the rate first
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as folder, testbed as bed:
        result = Path(folder, "raw.json")
        argv = ["--model", model, "--batch-size", str(batch_size), "--steps", str(steps),
                "--warmup", str(warmup), "--seed", str(seed), "--timeout", str(int(timeout)),
                "--result", str(result), "--methods", *methods]  # fmt: skip
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
    worker(p.parse_args(argv))


if __name__ == "__main__":
    main()
