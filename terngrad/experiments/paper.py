"""The TernGrad paper's experiments and the demo, declared over the comparison runner
(:mod:`terngrad.experiments.comparison`): fp32 (through the same sharded exchange, ``fp32-sharded``)
against TernGrad (``terngrad``), for each worker count, compared in ``results.md`` (a Markdown
table next to the paper's figures), ``results.json`` and ``curves.png`` (every run's accuracy
and loss against step).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from terngrad.comm.spec import methods
from terngrad.experiments.comparison import Comparison, Run
from terngrad.train import outputs
from terngrad.train.config import TrainConfig
from terngrad.train.report import markdown_table, write_curves
from terngrad.util.files import atomic_write_text

#: Wen et al. 2017, the figures each experiment is compared with
PAPER = {
    "lenet": "Paper (Fig. 3/Table 1 setting): LeNet on MNIST reaches about 99.1–99.35% test "
    "accuracy with both fp32 and TernGrad, 2 to 64 workers.",
    "cifar": "Paper (Table 1): ConvNet on CIFAR-10, Adam, lr 2e-4, 64 images per worker, "
    "2 workers: 86.56% fp32 vs 85.64% TernGrad.",
    "fashion": "No paper figure: the CIFAR ConvNet protocol (Adam, lr 2e-4, 64 per worker) on "
    "Fashion-MNIST (28×28×1), this project's second real data set.",
}
#: the two methods of every experiment here
COMPARED = ("fp32-sharded", "terngrad")
#: LeNet's protocol: every tensor ternarized
EVERY_TENSOR = {"quantize_last": True, "min_numel": 0}


@dataclass(frozen=True)
class PaperExperiment(Comparison):
    """fp32 against TernGrad with ``base``'s settings, for each of ``workers``, every method
    under ``protocol``; runs in ``<out>/<method>-<N>w``."""

    name: str
    base: TrainConfig
    workers: tuple[int, ...]
    protocol: tuple[tuple[str, Any], ...] = ()

    @property
    def title(self) -> str:  # type: ignore[override]
        return f"{self.name}: {self.base.model} on {self.base.dataset}"

    def plan(self) -> list[Run]:
        runs = []
        for n in self.workers:
            for name in COMPARED:
                folder = str(Path(self.base.out) / f"{name}-{n}w")
                method = methods.get(name).under(**dict(self.protocol))
                cfg = self.base.replace(workers=n, out=folder, method=method)
                runs.append(Run(name, cfg, f"{name}, {n} workers", {"workers": n}))
        return runs

    def report(self, runs: list[Run], summaries: list[dict[str, Any]], out: Path) -> str:
        fp32_bytes = {
            r.config.workers: s["bytes_sent_per_step"]
            for r, s in zip(runs, summaries, strict=True)
            if r.method == "fp32-sharded"
        }
        rows = []
        for r, s in zip(runs, summaries, strict=True):
            per_step = s["bytes_sent_per_step"]
            ratio = fp32_bytes.get(r.config.workers, per_step) / per_step if per_step else None
            rows.append(
                [r.label, f"{100 * s['accuracy']:.2f}%", f"{100 * s['best_accuracy']:.2f}%",
                 f"{per_step:,.0f}", "—" if ratio is None else f"{ratio:.1f}x",
                 f"{s['seconds']:.0f}"]
            )  # fmt: skip
        table = markdown_table(
            ["run", "final test accuracy", "best", "bytes sent / step / rank", "vs fp32",
             "seconds"],
            rows,
        )  # fmt: skip
        first = runs[0].config
        text = (
            f"# {self.name}: {first.model} on {first.dataset}, {first.steps} steps\n\n{table}\n"
            f"{PAPER.get(self.name, PAPER['lenet'])}\n\nSettings: optimizer {first.optimizer}, "
            f"lr {first.lr} ({first.lr_schedule}), weight decay {first.weight_decay}, batch "
            f"{first.total_batch_size or first.batch_size} "
            f"{'in total' if first.total_batch_size else 'per worker'}; TernGrad: "
            f"{_tern_settings(runs)}. Bytes are what rank 0 handed to the collectives per step "
            "(fp32 runs through the same sharded exchange, which moves what a ring all-reduce "
            "does). Times are wall-clock on this machine, all workers sharing its cores.\n"
        )
        atomic_write_text(out / "results.md", text)
        curves = {r.label: outputs.read_metrics(Path(r.config.out) / outputs.METRICS) for r in runs}
        write_curves(curves, out / "curves.png", title=self.title)
        by_label = {r.label: s for r, s in zip(runs, summaries, strict=True)}
        atomic_write_text(out / "results.json", json.dumps(by_label, indent=2))
        return text


def _tern_settings(runs: list[Run]) -> str:
    x = next(r.config.hook_options for r in runs if r.method == "terngrad")
    options = dict(x.quantizer_options) or {"clip": 2.5}
    if x.quantize_last and not x.min_numel:
        kept = "every tensor ternarized"
    else:
        last = "" if x.quantize_last else "the last layer and "
        kept = f"{last}tensors under {x.min_numel} elements kept fp32"
    return f"{options}, {x.topology} exchange, {kept}"


def _lenet_settings(out: str, steps: int) -> TrainConfig:
    return TrainConfig(
        out=out, model="lenet", dataset="mnist", optimizer="momentum", lr=0.01, momentum=0.9,
        lr_schedule="poly", weight_decay=5e-4, total_batch_size=64, steps=steps,
        eval_every=max(1, min(500, steps // 10)),
    )  # fmt: skip


def lenet(out: str, steps: int = 10_000, workers: tuple[int, ...] = (2, 4)) -> PaperExperiment:
    """MNIST, total batch 64, momentum 0.9, lr 0.01 with polynomial decay, weight decay 5e-4,
    10,000 iterations; fp32 and TernGrad (every layer ternarized), 2 and 4 workers."""
    base = _lenet_settings(out, steps)
    return PaperExperiment("lenet", base, tuple(workers), tuple(EVERY_TENSOR.items()))


def _convnet(name: str, out: str, dataset: str, data_dir: str | None, steps: int, workers):
    base = TrainConfig(
        out=out, model="cifarnet", dataset=dataset, data_dir=data_dir, optimizer="adam",
        lr=2e-4, batch_size=64, steps=steps, eval_every=max(1, min(1000, steps // 10)),
    )  # fmt: skip
    return PaperExperiment(name, base, tuple(workers))


def cifar(out: str, data_dir: str | None, steps: int = 100_000, workers=(2,)) -> PaperExperiment:
    """Table 1's ConvNet on CIFAR-10: Adam, lr 2e-4, 64 per worker; fp32 and TernGrad."""
    return _convnet("cifar", out, "cifar10", data_dir, steps, workers)


def fashion(out: str, data_dir: str | None, steps: int = 5_000, workers=(2,)) -> PaperExperiment:
    """The ConvNet protocol on Fashion-MNIST."""
    return _convnet("fashion", out, "fashion", data_dir, steps, workers)


def demo(out: str, steps: int = 800) -> PaperExperiment:
    """The main job on the bundled data: LeNet on MNIST with the paper's LeNet settings,
    4 workers, fp32 against TernGrad, for a short budget."""
    return PaperExperiment("demo", _lenet_settings(out, steps), (4,), tuple(EVERY_TENSOR.items()))
