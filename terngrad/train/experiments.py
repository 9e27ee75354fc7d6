"""The TernGrad paper's experiments as runnable comparisons, and the demo.

An experiment is a list of runs (label, :class:`TrainConfig`) trained one after another into
sub-folders of one output folder, then compared in ``results.md`` (a Markdown table next to the
paper's figures) and ``curves.png`` (every run's accuracy and loss against step).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from terngrad.comm import Options
from terngrad.train.report import markdown_table, write_curves
from terngrad.train.trainer import (
    DEFAULT_TIMEOUT,
    RESUMABLE_CHANGES,
    TrainConfig,
    launch,
    prepare_out,
)
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


def _lenet_settings(out: str, steps: int) -> TrainConfig:
    return TrainConfig(
        out=out, model="lenet", dataset="mnist", optimizer="momentum", lr=0.01, momentum=0.9,
        lr_schedule="poly", weight_decay=5e-4, batch_size=None, total_batch_size=64,
        steps=steps, eval_every=max(1, min(500, steps // 10)),
        exchange=Options(quantize_last=True, min_numel=0, timeout=DEFAULT_TIMEOUT),
    )  # fmt: skip


def lenet(out: str, steps: int = 10_000, workers: tuple[int, ...] = (2, 4)) -> list:
    """MNIST, total batch 64, momentum 0.9, lr 0.01 with polynomial decay, weight decay 5e-4,
    10,000 iterations; fp32 and TernGrad (every layer ternarized), 2 and 4 workers."""
    return _grid(_lenet_settings(out, steps), workers)


def _convnet(out: str, dataset: str, data_dir: str | None, steps: int, workers) -> list:
    base = TrainConfig(
        out=out, model="cifarnet", dataset=dataset, data_dir=data_dir, optimizer="adam",
        lr=2e-4, batch_size=64, steps=steps, eval_every=max(1, min(1000, steps // 10)),
    )  # fmt: skip
    return _grid(base, workers)


def cifar(out: str, data_dir: str | None, steps: int = 100_000, workers=(2,)) -> list:
    """Table 1's ConvNet on CIFAR-10: Adam, lr 2e-4, 64 per worker; fp32 and TernGrad."""
    return _convnet(out, "cifar10", data_dir, steps, workers)


def fashion(out: str, data_dir: str | None, steps: int = 5_000, workers=(2,)) -> list:
    """The ConvNet protocol on Fashion-MNIST."""
    return _convnet(out, "fashion", data_dir, steps, workers)


def demo(out: str, steps: int = 800) -> list:
    """The main job on the bundled data: LeNet on MNIST with the paper's LeNet settings,
    4 workers, fp32 against TernGrad, for a short budget."""
    return _grid(_lenet_settings(out, steps), (4,))


def _grid(base: TrainConfig, workers) -> list[tuple[str, TrainConfig]]:
    runs = []
    for n in workers:
        for quantizer in ("fp32", "terngrad"):
            label = f"{quantizer}, {n} workers"
            folder = str(Path(base.out) / f"{quantizer}-{n}w")
            exchange = base.exchange.replace(quantizer=quantizer)
            runs.append((label, replace(base, out=folder, workers=n, exchange=exchange)))
    return runs


def finished_summary(cfg: TrainConfig) -> dict[str, Any] | None:
    """The summary of a run already trained with these settings (up to what a resumed run may
    change, ``steps`` aside), or ``None``."""
    path = Path(cfg.out) / "summary.json"
    if not path.exists():
        return None
    summary = json.loads(path.read_text())
    saved = TrainConfig.from_dict(summary["config"])
    ignore = [name for name in RESUMABLE_CHANGES if name != "steps"]
    return summary if not cfg.diff(saved, ignore=ignore) else None


def train_each(
    runs: Sequence[tuple[str, TrainConfig]],
    describe: Callable[[dict[str, Any]], str],
    echo: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
    """Train the runs one after another (a finished one is read back, not trained again) and
    return their summaries; every folder is checked before the first run starts. After each
    run, one line: ``[i/n] label: describe(summary) (seconds, about N min left)``."""
    for _, cfg in runs:
        prepare_out(cfg)  # every bad setting or unwritable folder fails before training
    summaries: list[dict[str, Any]] = []
    began, trained = time.perf_counter(), 0
    for i, (label, cfg) in enumerate(runs, start=1):
        summary = finished_summary(cfg)
        if summary is None:
            started = time.perf_counter()
            summary = launch(cfg) or {}
            trained += 1
            per_run = (time.perf_counter() - began) / trained
            left = per_run * sum(1 for _, c in runs[i:] if finished_summary(c) is None)
            note = f"{time.perf_counter() - started:.0f} s, about {left / 60:.0f} min left"
        else:
            note = "done before"
        summaries.append(summary)
        echo(f"[{i}/{len(runs)}] {label}: {describe(summary)} ({note})")
    return summaries


def run(name: str, runs: list[tuple[str, TrainConfig]], out: str) -> str:
    """Train every run (resuming any that stopped), then write results.md and curves.png in
    ``out``; returns the Markdown."""
    for _, cfg in runs:
        prepare_out(cfg)  # every bad setting or unwritable folder fails before any training
    summaries: dict[str, dict[str, Any]] = {}
    for label, cfg in runs:
        print(f"== {label}: {cfg.steps} steps into {cfg.out}", flush=True)
        started = time.perf_counter()
        summaries[label] = launch(cfg) or {}
        print(f"   done in {time.perf_counter() - started:.0f} s", flush=True)
    return write_results(name, runs, summaries, Path(out))


def write_results(name: str, runs, summaries: dict[str, dict[str, Any]], out: Path) -> str:
    fp32_bytes = {
        cfg.workers: summaries[label]["bytes_sent_per_step"]
        for label, cfg in runs
        if cfg.exchange.quantizer == "fp32" and summaries.get(label)
    }
    rows = []
    for label, cfg in runs:
        s = summaries[label]
        per_step = s["bytes_sent_per_step"]
        ratio = fp32_bytes.get(cfg.workers, per_step) / per_step if per_step else float("nan")
        rows.append(
            [label, f"{100 * s['accuracy']:.2f}%", f"{100 * s['best_accuracy']:.2f}%",
             f"{per_step:,.0f}", f"{ratio:.1f}x", f"{s['seconds']:.0f}"]
        )  # fmt: skip
    table = markdown_table(
        ["run", "final test accuracy", "best", "bytes sent / step / rank", "vs fp32", "seconds"],
        rows,
    )
    first = runs[0][1]
    paper = PAPER.get(name, PAPER["lenet"])
    text = (
        f"# {name}: {first.model} on {first.dataset}, {first.steps} steps\n\n{table}\n"
        f"{paper}\n\nSettings: optimizer {first.optimizer}, lr {first.lr} "
        f"({first.lr_schedule}), weight decay {first.weight_decay}, batch "
        f"{first.total_batch_size or first.batch_size} "
        f"{'in total' if first.total_batch_size else 'per worker'}; TernGrad: "
        f"{_tern_settings(first)}. Bytes are what rank 0 handed to the collectives per step "
        "(fp32 runs through the same sharded exchange, which moves what a ring all-reduce "
        "does). Times are wall-clock on this machine, all workers sharing its cores.\n"
    )
    atomic_write_text(out / "results.md", text)
    curves = {
        label: [json.loads(line) for line in (Path(cfg.out) / "metrics.jsonl").open()]
        for label, cfg in runs
    }
    write_curves(curves, out / "curves.png", title=f"{name}: {first.model} on {first.dataset}")
    atomic_write_text(out / "results.json", json.dumps(summaries, indent=2))
    return text


def _tern_settings(cfg: TrainConfig) -> str:
    x = cfg.exchange
    options = x.quantizer_options or {"clip": 2.5}
    if x.quantize_last and not x.min_numel:
        kept = "every tensor ternarized"
    else:
        last = "" if x.quantize_last else "the last layer and "
        kept = f"{last}tensors under {x.min_numel} elements kept fp32"
    return f"{options}, {x.topology} exchange, {kept}"
