"""What the performance model (:mod:`terngrad.bench.perf_model`) says of clusters it was not
measured on: images per second against workers on GPU clusters, like the TernGrad paper's
Figure 5 (``terngrad perf-model scale``), and how far a network holds training back
(:func:`communication_ratio`). Modelled, not measured: the assumptions are stated in
docs/performance.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from terngrad.bench.perf_model import Cluster, Profile, predict, profile_model
from terngrad.comm.exchanges.traffic import ring_bytes
from terngrad.util.files import atomic_write


@dataclass(frozen=True)
class Network:
    """A cluster network for the scaling study."""

    name: str
    bytes_per_s: float
    latency_s: float


#: 1 Gbit/s Ethernet at the 957 Mbit/s TCP measured on the testbed, 50 µs a message; 100 Gbit/s
#: InfiniBand at 95% of line rate, 2 µs a message (assumptions, stated in docs/performance.md).
NETWORKS = {
    "1gbe": Network("1 Gb Ethernet", 0.957e9 / 8, 50e-6),
    "100gib": Network("100 Gb InfiniBand", 0.95 * 100e9 / 8, 2e-6),
}


@dataclass(frozen=True)
class Accelerator:
    """A GPU worker for the scaling study: sustained training FLOP/s, batch per worker, and the
    elements per second its fused codec encodes and decodes."""

    flops_per_s: float = 10e12
    batch_size: int = 64
    codec_elements_per_s: float = 1e11

    def compute_seconds(self, prof: Profile) -> float:
        """Forward and backward of one batch: 3 x forward FLOPs."""
        return 3 * prof.forward_flops * self.batch_size / self.flops_per_s


def communication_ratio(
    prof: Profile, workers: int, bytes_per_s: float, compute_seconds: float
) -> float:
    """Seconds of an fp32 ring all-reduce of the model's gradients over its compute seconds:
    how far data-parallel training is held back by the network (TernGrad's regime: well
    above 1)."""
    return ring_bytes(4 * prof.numel, workers) / bytes_per_s / compute_seconds


#: the GPU clusters the testbed's ratio is set beside: Ethernet at the testbed's TCP efficiency
ETHERNET = {"1 GbE": 0.957e9 / 8, "10 GbE": 9.57e9 / 8}


def gpu_ratios(
    names: Sequence[str] = ("alexnet", "googlenet", "vgg-a"),
    workers: int = 8,
    gpu: Accelerator = Accelerator(),
) -> dict[str, dict[str, float]]:
    """:func:`communication_ratio` of ``workers`` GPUs (``gpu``'s FLOP/s and batch) on 1 and
    10 GbE, per model."""
    ratios = {}
    for name in names:
        prof = profile_model(name)
        compute = gpu.compute_seconds(prof)
        ratios[name] = {
            link: communication_ratio(prof, workers, rate, compute)
            for link, rate in ETHERNET.items()
        }
    return ratios


def scaling(
    prof: Profile,
    methods: Sequence[str],
    workers: Sequence[int],
    network: Network,
    gpu: Accelerator,
) -> dict[str, list[float]]:
    """Images per second against workers, per method (the paper's Figure 5 axes)."""
    compute = gpu.compute_seconds(prof)
    out: dict[str, list[float]] = {}
    for name in methods:
        kappa = 0.0 if name == "fp32" else 1.0 / gpu.codec_elements_per_s
        out[name] = [
            n * gpu.batch_size / predict(
                prof, name, Cluster(n, network.bytes_per_s, math.inf, network.latency_s, False),
                compute, kappa,
            ).seconds
            for n in workers
        ]  # fmt: skip
    return out


def plot_scaling(results: dict, path: Path | str) -> None:
    """Images/s against workers: one panel per network and model, a line per method, and the
    ideal (N x one worker's compute-only rate)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    nets, models_ = results["networks"], results["models"]
    fig, axes = plt.subplots(
        len(nets), len(models_), figsize=(4.2 * len(models_), 3.6 * len(nets)), squeeze=False
    )
    workers = results["workers"]
    for i, net in enumerate(nets):
        for j, name in enumerate(models_):
            ax, panel = axes[i][j], results["images_per_second"][net][name]
            ax.plot(workers, panel["ideal"], "k:", label="linear (no communication)")
            for method, ys in panel["methods"].items():
                ax.plot(workers, ys, marker="o", ms=3, label=method)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{name}, {NETWORKS[net].name}", fontsize=10)
            ax.set_xlabel("workers")
            ax.set_ylabel("images/s")
            ax.grid(alpha=0.3, which="both")
    axes[0][0].legend(fontsize=8)
    fig.suptitle("Modelled training throughput (terngrad model scale; not measured)", fontsize=11)
    fig.tight_layout()
    atomic_write(Path(path), lambda f: fig.savefig(f, format="png", dpi=110))
    plt.close(fig)
