"""The one way an experiment compares methods: plan the runs, check them all, train each (a
finished run is read back, a stopped one resumes), collect what each wrote, report.

An experiment is a :class:`Comparison`: it declares its runs (:meth:`~Comparison.plan`), how a
finished run reads in a line (:meth:`~Comparison.describe`), and its report
(:meth:`~Comparison.report`); :func:`run` does the rest. ``terngrad demo``, ``reproduce
lenet|cifar|fashion|orq|transformer`` and ``bench accuracy`` are such declarations
(:mod:`terngrad.experiments.paper`, :mod:`terngrad.experiments.optimal_quantization`,
:mod:`terngrad.experiments.gpt`, :mod:`terngrad.experiments.time_to_accuracy`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import statistics
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from terngrad.comm.spec.method_spec import Method
from terngrad.comm.spec.options import Options
from terngrad.train import models, outputs, run_folder
from terngrad.train.config import RESUMABLE_CHANGES, TrainConfig
from terngrad.train.launch import check_launch, launch, warm_up_kernels
from terngrad.train.setup import load_data
from terngrad.util.files import read_json

Echo = Callable[[str], None]
Train = Callable[["Run"], dict[str, Any]]
#: called with a run and each evaluation's record as it trains, where a session can watch
Observe = Callable[["Run", dict[str, Any]], None]


class RunStopped(Exception):
    """Raised by an :data:`Observe` to end the run it watches at once (its ranks killed)."""


@dataclass(frozen=True)
class Run:
    """One training run of a comparison: its ``method`` (a name of
    :data:`terngrad.comm.spec.methods.METHODS`), its config (whose ``out`` is its own folder),
    its ``label`` in progress lines, and ``tags`` the report groups by (seed, variant, ...)."""

    method: str
    config: TrainConfig
    label: str
    tags: Mapping[str, Any] = field(default_factory=dict, hash=False)


class Comparison(ABC):
    """An experiment over methods, declared: its runs and its report."""

    #: what the progress says is being compared
    title: str = "comparison"

    @abstractmethod
    def plan(self) -> list[Run]:
        """The runs, in the order they train; ``ValueError`` for a bad request."""

    def describe(self, summary: dict[str, Any]) -> str:
        """A finished run in a few words (its progress line)."""
        if "bits_per_char" in summary:
            return (
                f"validation {summary['bits_per_char']:.3f} bits/char "
                f"(best {summary['best_bits_per_char']:.3f})"
            )
        return f"final {100 * summary['accuracy']:.2f}%, best {100 * summary['best_accuracy']:.2f}%"

    def check(self, runs: list[Run]) -> None:
        """Every check that needs nothing trained (by default: each run's launch and the folder
        of each run not yet finished; a finished run's summary alone is read back)."""
        folders = [Path(r.config.out).absolute() for r in runs]
        if len(set(folders)) != len(folders):
            raise ValueError("two runs of the comparison would share a folder")
        for r in runs:
            check_launch(r.config)
            if self.finished(r) is None:
                run_folder.prepare_out(r.config)  # a bad setting or unwritable folder fails here

    @contextlib.contextmanager
    def session(
        self, runs: list[Run], echo: Echo, observe: Observe | None = None
    ) -> Iterator[Train]:
        """What trains one run, for the whole comparison (by default: :func:`launch`, which
        ``observe`` cannot watch: it is not called)."""
        warm_up_kernels([r.config for r in runs])
        yield lambda r: launch(r.config) or {}

    def finished(self, run: Run) -> dict[str, Any] | None:
        """The summary of ``run`` if it is already trained (read back, not trained again)."""
        return finished_summary(run.config)

    @abstractmethod
    def report(self, runs: list[Run], summaries: list[dict[str, Any]], out: Path) -> str:
        """Write the comparison's results into ``out``; returns them as Markdown."""


def base_protocol(base: TrainConfig, names: tuple[str, ...] = ()) -> dict[str, Any]:
    """The protocol a comparison's ``base`` holds in its method, which the comparison puts over
    each method it runs: the exchange's ``names`` settings (``quantize_last``, ``min_numel``),
    over terngrad's defaults. ``ValueError`` in one line for any other part of the base's
    method: each run takes its own method, so that part would be dropped unsaid."""
    x = base.method.exchange
    protocol = {} if x is None else {name: getattr(x, name) for name in names}
    plain = Method(exchange=Options(**protocol))
    if base.method != plain:
        raise ValueError(
            f"the base's method {base.method.name} would not run: each run takes its own method "
            f"(the base holds {'the protocol ' + ', '.join(names) if names else 'no method'}); "
            f"give {base.method.name} among the methods, or leave the base's method {plain.name}"
        )
    return protocol


def at_rates(cfg: TrainConfig, lr: float | None = None,
             outer_lr: float | None = None) -> TrainConfig:  # fmt: skip
    """``cfg`` at a tuned ``lr`` and, for a method of local steps, ``outer_lr`` (its outer
    step's: the method's local steps at that rate; ``None``: as it is)."""
    if lr is not None:
        cfg = cfg.replace(lr=lr)
    local = cfg.method.local
    if outer_lr is None or local is None or local.outer_lr == outer_lr:
        return cfg
    return cfg.replace(method=dataclasses.replace(cfg.method, local=local.replace(
        outer_lr=outer_lr)), full_precision_steps=cfg.full_precision_steps)  # fmt: skip


def finished_summary(cfg: TrainConfig) -> dict[str, Any] | None:
    """The summary of a run already trained with these settings (up to what a resumed run may
    change, ``steps`` aside), or ``None``."""
    path = Path(cfg.out) / outputs.SUMMARY
    if not path.exists():
        return None
    summary = read_json(path, "run summary")
    saved = TrainConfig.from_dict(summary["config"])
    stops = ("steps", "stop_at_accuracy", "stop_at_loss")
    ignore = [name for name in RESUMABLE_CHANGES if name not in stops]
    return summary if not cfg.diff(saved, ignore=ignore) else None


def train_each(comparison: Comparison, runs: list[Run], echo: Echo = print) -> list[dict]:
    """Train the runs one after another (a finished one is read back) and return their
    summaries. After each run, one line: ``[i/n] label: describe(summary) (seconds, about N
    min left)``."""
    summaries: list[dict[str, Any]] = []
    began, trained = time.perf_counter(), 0
    with comparison.session(runs, echo) as train:
        for i, r in enumerate(runs, start=1):
            summary = comparison.finished(r)
            if summary is None:
                started = time.perf_counter()
                summary = train(r)
                trained += 1
                per_run = (time.perf_counter() - began) / trained
                left = per_run * sum(1 for later in runs[i:] if comparison.finished(later) is None)
                note = f"{time.perf_counter() - started:.0f} s, about {left / 60:.0f} min left"
            else:
                note = "done before"
            summaries.append(summary)
            echo(f"[{i}/{len(runs)}] {r.label}: {comparison.describe(summary)} ({note})")
    return summaries


def run(comparison: Comparison, out: Path, echo: Echo = print) -> str:
    """Plan, check, train each run, and report into ``out``; returns the report (Markdown)."""
    runs = comparison.plan()
    comparison.check(runs)
    echo(f"{comparison.title}: {len(runs)} runs into {out}/")
    summaries = train_each(comparison, runs, echo)
    Path(out).mkdir(parents=True, exist_ok=True)
    return comparison.report(runs, summaries, Path(out))


def report_only(comparison: Comparison, out: Path) -> str:
    """Write the report of runs already trained again (for another target, say), training
    nothing; ``ValueError`` naming a run that has not finished with these settings."""
    runs = comparison.plan()
    summaries = []
    for r in runs:
        summary = comparison.finished(r)
        if summary is None:
            raise ValueError(f"{r.label} has not finished in {r.config.out} with these settings: "
                             "train it first")  # fmt: skip
        summaries.append(summary)
    return comparison.report(runs, summaries, Path(out))


# --------------------------------------------------------------------------- collecting


def gradient_numel(cfg: TrainConfig) -> int:
    """Elements of one gradient of the run's model (its classes or vocabulary from the data)."""
    return _gradient_numel(cfg.model, cfg.dataset, cfg.data_dir)


@functools.cache
def _gradient_numel(model: str, dataset: str, data_dir: str | None) -> int:
    cfg = TrainConfig(out="-", model=model, dataset=dataset, data_dir=data_dir)
    data = load_data(cfg, synthetic_size=1)
    net = models.build(model, models.default_input_shape(model), data.num_classes)
    return sum(p.numel() for p in net.parameters())


def bytes_per_step(cfg: TrainConfig, summary: dict[str, Any]) -> float | None:
    """Bytes one rank sent per step: the hook's count, or for PyTorch's fp32 and fp16
    all-reduce the ring's ``2 (N-1)/N`` times the gradient's bytes (``None`` for PowerSGD,
    whose bytes are not counted outside the testbed)."""
    sent = summary.get("bytes_sent_per_step")
    if sent is not None or cfg.method.baseline not in ("fp32", "fp16"):
        return sent
    per_value = 2 if cfg.method.baseline == "fp16" else 4
    return 2 * (cfg.workers - 1) * per_value * gradient_numel(cfg) / cfg.workers


def curve(cfg: TrainConfig, key: str = "accuracy") -> list[tuple[int, float]]:
    """``(step, metrics[key])`` of every evaluation of the run."""
    return [(m["step"], m[key]) for m in outputs.read_metrics(Path(cfg.out) / outputs.METRICS)]


def spread(values: Sequence[float], digits: int, scale: float = 1.0) -> str:
    """``mean ± sample standard deviation`` (the mean alone for one value), times ``scale``."""
    mean = scale * statistics.fmean(values)
    if len(values) == 1:
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {scale * statistics.stdev(values):.{digits}f}"
