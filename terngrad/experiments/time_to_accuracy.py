"""``terngrad bench accuracy``: wall-clock time to a target test accuracy (or test loss: a
language model's validation loss, ``--target-loss``) on a bandwidth-limited cluster, every
method trained in turn — the TernGrad paper's claim (the same accuracy in less time), measured
end to end rather than as accuracy and step time apart.

A comparison (:class:`AccuracyComparison`) over the runner of
:mod:`terngrad.experiments.comparison`:
the testbed of :mod:`terngrad.bench.testbed` (one network namespace per rank, links shaped with
``tc tbf``) is built once; in it each method trains as ``terngrad train`` does (real data,
evaluations, checkpoints), its ranks started in their namespaces (``python -m
terngrad.train.launch``, environment rendezvous over the shaped links). The methods are those of
:data:`terngrad.comm.spec.methods.METHODS`: PyTorch's own (``fp32``, ``fp16``, ``powersgd``) and
terngrad's hook, every one under the run's ``quantize_last`` and ``min_numel``.

Per method, from the trainer's evaluations (``metrics.jsonl``):

* **time to target** — the training seconds (steps only: evaluations and checkpoints left out)
  at the first evaluation whose test accuracy reaches the target (whose test loss is at most
  it, for a loss target); its resolution is the evaluation interval;
* final and best accuracy; the step time (training seconds / steps);
* **wire bytes per step** — what each rank's interface sent during the steps (IP packets,
  headers included; mean over ranks), the same for every method whatever counts it keeps.

With ``predict_with`` (a ``bench network`` run with unshaped links and one at this run's
bandwidth, same model, ranks and batch), the performance model (:mod:`terngrad.bench.model`)
predicts each method's step time, and its time to target as *measured steps to target x
predicted step time*; the report sets it beside the measurement.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from terngrad.bench import testbed
from terngrad.comm.spec import methods
from terngrad.comm.spec.methods import Method
from terngrad.experiments import time_to_accuracy_report as report
from terngrad.experiments.comparison import (
    Comparison,
    Echo,
    Observe,
    Run,
    Train,
    at_rates,
    base_protocol,
)
from terngrad.experiments.time_to_accuracy_plot import plot
from terngrad.train import outputs, run_folder
from terngrad.train.config import TrainConfig
from terngrad.train.launch import check_data, check_launch, warm_up_kernels
from terngrad.util.files import atomic_write_text, read_json

DEFAULT_METHODS = ("fp32", "fp16", "powersgd", "terngrad", "terngrad-ps", "qsgd-5", "orq-5")
PORT = testbed.PORT + 1  # method i rendezvous at PORT + i: no port reused within one testbed


@dataclass(frozen=True)
class AccuracyComparison(Comparison):
    """One comparison: ``base`` (model, data, optimiser, steps, which tensors the hook keeps in
    full precision; its ``out`` the folder of the whole comparison), the ``methods`` in order,
    the links' ``bandwidth``, the ``target`` (a test accuracy as a fraction, or with
    ``target_metric="loss"`` a test loss in nats), seconds each method may take, the
    namespaces' prefix, and optionally the two ``bench network`` results the model predicts
    from."""

    base: TrainConfig
    methods: tuple[str | Method, ...]
    bandwidth: str
    target: float
    time_limit: float = 3600.0
    prefix: str = testbed.PREFIX
    predict_with: tuple[str, str] | None = None
    #: seeds of every method: ``base.seed``, ``base.seed + 1``, ...
    seeds: int = 1
    #: every run stops after the evaluation that reaches the target (a sweep's runs)
    stop_at_target: bool = False
    #: what ``target`` is of: ``"accuracy"`` or ``"loss"``
    target_metric: str = "accuracy"
    #: settings over ``base`` by method name (a tuned race: each method's ``lr``, ``outer_lr``)
    per_method: Mapping[str, Mapping[str, Any]] = field(default_factory=dict, hash=False)
    #: the seed the rates were tuned on, in a tuned race (:mod:`terngrad.experiments.tuning`)
    tuned_on: int | None = None
    title = "terngrad bench accuracy"

    def plan(self) -> list[Run]:
        """Every method with every seed, in that order (each with its own settings of
        ``per_method`` over the base); runs in ``<out>/<method>`` (one seed) or
        ``<out>/<method>-s<seed>``."""
        _check_target(self.target, self.target_metric)
        if self.seeds < 1:
            raise ValueError(f"seeds must be at least 1, got {self.seeds}")
        protocol = base_protocol(self.base, ("quantize_last", "min_numel"))
        stop = self.target if self.stop_at_target else None
        by_loss = self.target_metric == "loss"
        runs = []
        for m in methods.select(self.methods):
            for seed in range(self.base.seed, self.base.seed + self.seeds):
                folder = m.name if self.seeds == 1 else f"{m.name}-s{seed}"
                cfg = at_rates(
                    self.base.replace(seed=seed, stop_at_accuracy=None if by_loss else stop,
                                      stop_at_loss=stop if by_loss else None,
                                      out=str(Path(self.base.out) / folder),
                                      method=m.under(**protocol)),
                    **self.per_method.get(m.name, {}),
                )  # fmt: skip
                label = f"{m.name} ({m.label})" + (f" seed {seed}" if self.seeds > 1 else "")
                runs.append(Run(m.name, cfg, label, {"seed": seed}))
        return runs

    def for_tuning(self, seed: int, out: str) -> AccuracyComparison:
        """This comparison as a learning rate's tuning (:mod:`terngrad.experiments.tuning`):
        one run a method on ``seed`` into ``out``, unlimited links, an accuracy target's runs
        stopped there and a loss target's trained to the end (the lowest final loss chooses)."""
        return replace(
            self, base=self.base.replace(out=out, seed=seed), bandwidth="unlimited", seeds=1,
            stop_at_target=self.target_metric == "accuracy", predict_with=None, per_method={},
            tuned_on=None,
        )  # fmt: skip

    def at_rates(
        self, per_method: Mapping[str, Mapping[str, Any]], seed: int
    ) -> AccuracyComparison:
        """The race with each method's tuned settings (tuned on ``seed``)."""
        return replace(self, per_method=per_method, tuned_on=seed)

    def _testbed(self) -> testbed.Testbed:
        """The testbed of the race (not built): its ranks, link and nodes."""
        per_node = self.base.ranks_per_node or 1
        return testbed.Testbed(self.base.workers, self.bandwidth, self.prefix, per_node)

    def check(self, runs: list[Run]) -> None:
        """Every check that needs nothing built: methods, target, rate, ranks, root, data, the
        model's inputs, the folder of each run not yet finished (a finished run's checkpoint
        is never read again: one that diverged to NaN holds a loss no run resumes from);
        ``ValueError`` with one line for the first that fails."""
        testbed.rate_bits(self.bandwidth)
        self._testbed()  # 2 to 8 ranks, nodes that divide them
        try:
            testbed.check_host()
        except testbed.TestbedUnavailable as exc:
            raise ValueError(f"--bandwidth {self.bandwidth}: {exc}") from None
        if self.predict_with is not None:
            report.step_predictions(self)  # unreadable or mismatched results fail now
        check_data(self.base)  # a missing data set or a too large batch fails here, once
        for r in runs:
            check_launch(r.config)
            if self.finished(r) is None:  # (a finished run's summary alone is read back)
                run_folder.prepare_out(r.config)  # an unwritable folder or another run's files

    @contextlib.contextmanager
    def session(
        self, runs: list[Run], echo: Echo, observe: Observe | None = None
    ) -> Iterator[Train]:
        """The testbed, built once; each run trains in it, its folder held while it does;
        ``observe(run, record)`` after each of its evaluations (:class:`RunStopped` from it
        ends the run)."""
        warm_up_kernels([r.config for r in runs])  # compiled once, loaded by every rank
        base = self.base
        echo(
            f"building {self._testbed().nodes} namespaces with {self.bandwidth} links; "
            f"{base.model} on "
            f"{base.dataset}, {len(runs)} runs of at most {base.steps} steps, target "
            f"{report.target_words(self.target, self.target_metric)} ..."
        )
        ports = {r.config.out: PORT + i for i, r in enumerate(runs)}
        with (
            run_folder.claim(Path(base.out)),
            self._testbed() as bed,
        ):

            def train(r: Run) -> dict[str, Any]:
                echo(f"== {r.label}: {r.config.steps} steps")
                with run_folder.claim(Path(r.config.out)):
                    run_folder.prepare_out(r.config)  # again, now that no other run can
                    run_folder.remove_leftovers(Path(r.config.out))

                    def on_eval(record: dict[str, Any], r: Run = r) -> None:
                        echo(_progress(r.method, record))
                        if observe is not None:
                            observe(r, record)

                    _train(bed, r.config, ports[r.config.out], self.time_limit, on_eval)
                return read_json(Path(r.config.out) / outputs.SUMMARY, "run summary")

            yield train

    def describe(self, summary: dict[str, Any]) -> str:
        cfg = TrainConfig.from_dict(summary["config"])
        return report.line(report.run_row("", cfg, summary, self.target, self.target_metric))

    def report(self, runs: list[Run], summaries: list[dict[str, Any]], out: Path) -> str:
        results = report.summarise(self, runs)
        atomic_write_text(out / "results.json", json.dumps(results, indent=2) + "\n")
        text = report.markdown(results)
        atomic_write_text(out / "results.md", text)
        plot(results, out / "time-to-accuracy.png")
        return text


def _check_target(target: float, metric: str) -> None:
    if metric not in report.METRICS:
        raise ValueError(f"a target is of {' or '.join(report.METRICS)}, not {metric!r}")
    if metric == "loss":
        if not 0 < target < math.inf:
            raise ValueError(
                f"target loss {target:g} can never be reached: give a test loss above 0 in nats "
                "per prediction (for example --target-loss 1.45)"
            )
        return
    if not 0 < target <= 1:
        raise ValueError(
            f"target accuracy {100 * target:g}% can never be reached: give a test "
            "accuracy in percent, above 0 and at most 100 (for example --target 98.5)"
        )


def _train(bed: testbed.Testbed, cfg: TrainConfig, port: int, limit: float, on_eval) -> None:
    """One method: its ranks in their namespaces, until they finish; ``on_eval(record)`` for
    each new evaluation; ``BenchFailed`` (with the logs' folder) if a rank fails."""
    out = Path(cfg.out)
    config_file = run_folder.write_run_config(cfg)
    metrics = out / outputs.METRICS
    seen = len(outputs.read_metrics(metrics))

    def tick() -> None:
        nonlocal seen
        records = outputs.read_metrics(metrics)
        for record in records[seen:]:
            on_eval(record)
        seen = max(seen, len(records))

    bed.run([str(config_file)], out, limit, "terngrad.train.launch", port, tick)
    tick()
    if not (out / outputs.SUMMARY).exists():
        raise testbed.BenchFailed(f"rank 0 wrote no summary; the ranks' logs: {out}/rank*.log")


def _progress(name: str, record: dict[str, Any]) -> str:
    return (
        f"   {name} step {record['step']}: {outputs.scores(record)} after "
        f"{record['train_seconds']:.0f} s of training"
    )
