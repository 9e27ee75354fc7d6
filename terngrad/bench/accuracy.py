"""``terngrad bench accuracy``: wall-clock time to a target test accuracy on a bandwidth-limited
cluster, every method trained in turn — the TernGrad paper's claim (the same accuracy in less
time), measured end to end rather than as accuracy and step time apart.

A comparison (:class:`AccuracyComparison`) over the runner of :mod:`terngrad.train.comparison`:
the testbed of :mod:`terngrad.bench.testbed` (one network namespace per rank, links shaped with
``tc tbf``) is built once; in it each method trains as ``terngrad train`` does (real data,
evaluations, checkpoints), its ranks started in their namespaces (``python -m
terngrad.train.launch``, environment rendezvous over the shaped links). The methods are those of
:data:`terngrad.train.methods.METHODS`: PyTorch's own (``fp32``, ``fp16``, ``powersgd``) and
terngrad's hook, every one under the run's ``quantize_last`` and ``min_numel``.

Per method, from the trainer's evaluations (``metrics.jsonl``):

* **time to target** — the training seconds (steps only: evaluations and checkpoints left out)
  at the first evaluation whose test accuracy reaches the target; its resolution is the
  evaluation interval;
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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from terngrad.bench import testbed
from terngrad.train import data as datasets
from terngrad.train import methods, models, outputs, run_folder
from terngrad.train.comparison import Comparison, Echo, Run, Train
from terngrad.train.config import TrainConfig
from terngrad.train.launch import check_data, check_launch, warm_up_kernels
from terngrad.util.files import atomic_write, atomic_write_text

DEFAULT_METHODS = ("fp32", "fp16", "powersgd", "terngrad", "terngrad-ps", "qsgd-5", "orq-5")
PORT = testbed.PORT + 1  # method i rendezvous at PORT + i: no port reused within one testbed


@dataclass(frozen=True)
class AccuracyComparison(Comparison):
    """One comparison: ``base`` (model, data, optimiser, steps, which tensors the hook keeps in
    full precision; its ``out`` the folder of the whole comparison), the ``methods`` in order,
    the links' ``bandwidth``, the ``target`` test accuracy (a fraction), seconds each method
    may take, the namespaces' prefix, and optionally the two ``bench network`` results the
    model predicts from."""

    base: TrainConfig
    methods: tuple[str, ...]
    bandwidth: str
    target: float
    time_limit: float = 3600.0
    prefix: str = testbed.PREFIX
    predict_with: tuple[str, str] | None = None
    title = "terngrad bench accuracy"

    def plan(self) -> list[Run]:
        _check_target(self.target)
        x = self.base.exchange
        protocol = {"quantize_last": x.quantize_last, "min_numel": x.min_numel}
        return [
            Run(
                m.name,
                m.configure(self.base, str(Path(self.base.out) / m.name), protocol),
                f"{m.name} ({m.label})",
            )
            for m in methods.select(self.methods)
        ]

    def check(self, runs: list[Run]) -> None:
        """Every check that needs nothing built: methods, target, rate, ranks, root, data, the
        model's inputs; ``ValueError`` with one line for the first that fails."""
        testbed.rate_bits(self.bandwidth)
        testbed.Testbed(self.base.workers, self.bandwidth, self.prefix)  # 2 to 8 ranks
        try:
            testbed.check_host()
        except testbed.TestbedUnavailable as exc:
            raise ValueError(f"--bandwidth {self.bandwidth}: {exc}") from None
        if self.predict_with is not None:
            _step_predictions(self)  # unreadable or mismatched results fail now
        check_data(self.base)  # a missing data set or a too large batch fails here, once
        for r in runs:
            check_launch(r.config)
            run_folder.prepare_out(r.config)  # an unwritable folder or another run's files

    @contextlib.contextmanager
    def session(self, runs: list[Run], echo: Echo) -> Iterator[Train]:
        """The testbed, built once; each run trains in it, its folder held while it does."""
        warm_up_kernels([r.config for r in runs])  # compiled once, loaded by every rank
        base = self.base
        echo(
            f"building {base.workers} namespaces with {self.bandwidth} links; {base.model} on "
            f"{base.dataset}, {len(runs)} methods x {base.steps} steps, target "
            f"{100 * self.target:g}% ..."
        )
        ports = {r.method: PORT + i for i, r in enumerate(runs)}
        with (
            run_folder.claim(Path(base.out)),
            testbed.Testbed(base.workers, self.bandwidth, self.prefix) as bed,
        ):

            def train(r: Run) -> dict[str, Any]:
                echo(f"== {r.label}: {r.config.steps} steps")
                with run_folder.claim(Path(r.config.out)):
                    run_folder.prepare_out(r.config)  # again, now that no other run can
                    run_folder.remove_leftovers(Path(r.config.out))
                    _train(bed, r.config, ports[r.method], self.time_limit,
                           lambda m, n=r.method: echo(_progress(n, m)))  # fmt: skip
                return json.loads((Path(r.config.out) / outputs.SUMMARY).read_text())

            yield train

    def describe(self, summary: dict[str, Any]) -> str:
        row = _method_row("", TrainConfig.from_dict(summary["config"]), summary, self.target)
        return _line(row)

    def report(self, runs: list[Run], summaries: list[dict[str, Any]], out: Path) -> str:
        results = summarise(self, runs)
        atomic_write_text(out / "results.json", json.dumps(results, indent=2) + "\n")
        text = markdown(results)
        atomic_write_text(out / "results.md", text)
        plot(results, out / "time-to-accuracy.png")
        return text


def _check_target(target: float) -> None:
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
        f"   {name} step {record['step']}: test accuracy {100 * record['accuracy']:.2f}% after "
        f"{record['train_seconds']:.0f} s of training"
    )


# --------------------------------------------------------------------------- results


def time_to_target(curve: Sequence[dict[str, Any]], target: float) -> dict[str, Any] | None:
    """The first evaluation whose accuracy reaches ``target``: its step, training seconds and
    wall-clock seconds; ``None`` if none does."""
    for record in curve:
        if record["accuracy"] >= target:
            return {
                "step": record["step"],
                "train_seconds": record["train_seconds"],
                "seconds": record["seconds"],
            }
    return None


def _method_row(name: str, cfg: TrainConfig, summary: dict, target: float) -> dict[str, Any]:
    curve = outputs.read_metrics(Path(cfg.out) / outputs.METRICS)
    return {
        "method": name,
        "label": methods.get(name).label if name else "",
        "reached": time_to_target(curve, target),
        "final_accuracy": summary["accuracy"],
        "best_accuracy": summary["best_accuracy"],
        "steps": summary["steps"],
        "train_seconds": summary["train_seconds"],
        "step_seconds": summary["train_seconds"] / summary["steps"],
        "wire_bytes_per_step": summary["wire_bytes_per_step"],
        "hook_bytes_per_step": summary["bytes_sent_per_step"],
        "curve": curve,
    }


def _line(row: dict[str, Any]) -> str:
    reached = row["reached"]
    to_target = (
        f"target at step {reached['step']} after {reached['train_seconds']:.0f} s"
        if reached
        else "target not reached"
    )
    return (
        f"{to_target}; final {100 * row['final_accuracy']:.2f}%; "
        f"{row['step_seconds']:.3f} s a step; {_mb(row['wire_bytes_per_step'])} MB a step"
    )


def _mb(nbytes: float | None) -> str:
    return f"{nbytes / 1e6:.3f}" if nbytes is not None else "-"


def _step_predictions(plan: AccuracyComparison) -> dict[str, Any]:
    """The model's step time per method, from ``plan.predict_with`` (unshaped run to calibrate,
    the run at this bandwidth to predict), and what the model took from them."""
    from terngrad.bench import perf_model, scaling, validation

    assert plan.predict_with is not None
    unshaped, shaped = (validation.load_summary(p) for p in plan.predict_with)
    base = plan.base
    shape = list(
        datasets.load(
            base.dataset,
            base.data_dir,
            synthetic_size=1,
            synthetic_shape=models.default_input_shape(base.model),
        ).input_shape
    )
    for path, s in zip(plan.predict_with, (unshaped, shaped), strict=True):
        wanted = {"model": base.model, "ranks": base.workers, "batch_size": base.worker_batch,
                  "input_shape": shape}  # fmt: skip
        found = {k: s.get(k) for k in wanted}  # (results before 0.3: the model's own input)
        found["input_shape"] = s.get("input_shape") or list(models.default_input_shape(s["model"]))
        if found != wanted:
            raise ValueError(
                f"{path} measured {found}, this run trains {wanted}: predict from a "
                "terngrad bench network run of the same model, ranks, --batch-size and "
                "--input-shape"
            )
    if shaped["bandwidth"] != plan.bandwidth:
        raise ValueError(
            f"{plan.predict_with[1]} was measured at {shaped['bandwidth']}, this run at "
            f"{plan.bandwidth}"
        )
    prof = perf_model.profile_model(base.model, shape)
    calibration = validation.calibrate(unshaped, prof)
    checks = validation.validate(calibration, [shaped], prof)
    link = shaped["link_probe"]["bytes_per_second"]
    gpu = scaling.Accelerator(batch_size=base.worker_batch)
    return {
        "from": list(plan.predict_with),
        "compute_seconds": shaped["compute_seconds"],
        "link_bytes_per_second": link,
        "communication_ratio": scaling.communication_ratio(
            prof, base.workers, link, shaped["compute_seconds"]
        ),
        "gpu_communication_ratios": {
            "assumptions": f"8 GPUs at {gpu.flops_per_s / 1e12:g} TFLOP/s, batch "
            f"{gpu.batch_size}, Ethernet at 95.7% of line rate",
            "ratios": scaling.gpu_ratios(workers=8, gpu=gpu),
        },
        "host_bytes_per_second": calibration.host_bytes_per_s,
        "step_seconds": {c.method: c.predicted for c in checks},
        "bench_step_seconds": {c.method: c.measured for c in checks},
    }


def summarise(plan: AccuracyComparison, runs: list[Run]) -> dict[str, Any]:
    """Every method's row, the speedups to target against fp32 and fp16, and the model's
    predictions where asked for."""
    rows = []
    for r in runs:
        summary = json.loads((Path(r.config.out) / outputs.SUMMARY).read_text())
        rows.append(_method_row(r.method, r.config, summary, plan.target))
    prediction = _step_predictions(plan) if plan.predict_with else None
    by_name = {r["method"]: r for r in rows}
    for row in rows:
        for base in ("fp32", "fp16"):
            other = by_name.get(base)
            mine = row["reached"]
            theirs = other["reached"] if other else None
            row[f"sooner_than_{base}"] = (
                theirs["train_seconds"] / mine["train_seconds"] if mine and theirs else None
            )
        step = prediction["step_seconds"].get(row["method"]) if prediction else None
        row["predicted_step_seconds"] = step
        row["predicted_seconds_to_target"] = (
            step * row["reached"]["step"] if step is not None and row["reached"] else None
        )
    base = plan.base
    return {
        "model": base.model,
        "dataset": base.dataset,
        "workers": base.workers,
        "bandwidth": plan.bandwidth,
        "target": plan.target,
        "settings": {
            "optimizer": base.optimizer,
            "lr": base.lr,
            "momentum": base.momentum,
            "weight_decay": base.weight_decay,
            "lr_schedule": base.lr_schedule,
            "batch_size_per_worker": base.worker_batch,
            "steps": base.steps,
            "eval_every": base.eval_every,
            "seed": base.seed,
            "quantize_last": base.exchange.quantize_last,
            "min_numel": base.exchange.min_numel,
        },
        "prediction": prediction,
        "methods": rows,
    }


def markdown(results: dict[str, Any]) -> str:
    """The results as a Markdown page: one row per method."""
    from terngrad.train.report import markdown_table

    target = f"{100 * results['target']:g}%"
    modelled = results["prediction"] is not None
    header = ["method", f"step at {target}", f"seconds to {target}", "vs fp32", "vs fp16",
              "final accuracy", "best", "wire MB / step / rank", "s / step"]  # fmt: skip
    if modelled:
        header += ["model: s / step", f"model: s to {target}", "model error"]
    rows = []
    for r in results["methods"]:
        reached = r["reached"]
        row = [
            r["method"],
            f"{reached['step']}" if reached else "not reached",
            f"{reached['train_seconds']:.0f}" if reached else "-",
            _times(r["sooner_than_fp32"]),
            _times(r["sooner_than_fp16"]),
            f"{100 * r['final_accuracy']:.2f}%",
            f"{100 * r['best_accuracy']:.2f}%",
            _mb(r["wire_bytes_per_step"]),
            f"{r['step_seconds']:.3f}",
        ]
        if modelled:
            step, predicted = r["predicted_step_seconds"], r["predicted_seconds_to_target"]
            row += [
                f"{step:.3f}" if step is not None else "-",
                f"{predicted:.0f}" if predicted is not None else "-",
                f"{100 * (predicted / reached['train_seconds'] - 1):+.0f}%"
                if predicted is not None
                else "-",
            ]
        rows.append(row)
    s = results["settings"]
    text = (
        f"# Time to {target}: {results['model']} on {results['dataset']}, "
        f"{results['workers']} ranks, {results['bandwidth']} links\n\n"
        + markdown_table(header, rows)
        + f"\nSettings: {s['optimizer']}, lr {s['lr']} ({s['lr_schedule']}), momentum "
        f"{s['momentum']}, weight decay {s['weight_decay']}, batch {s['batch_size_per_worker']} "
        f"per worker, {s['steps']} steps, evaluated every {s['eval_every']} steps (the "
        f"resolution of the step and seconds to target), seed {s['seed']}.\n"
        "Seconds are training seconds (steps only; evaluations and checkpoints left out), "
        "wall-clock on the testbed; 'vs' is how many times sooner than that method the "
        "target was reached; wire bytes are what each rank's interface sent during the steps "
        "(mean over ranks, IP headers included).\n"
    )
    if modelled:
        p = results["prediction"]
        text += (
            f"\nModel: step times predicted from {p['from'][0]} (calibration) and "
            f"{p['from'][1]} (compute {p['compute_seconds']:.3f} s a step, link "
            f"{p['link_bytes_per_second'] / 1e6:.1f} MB/s); time to target = measured steps "
            "to target x predicted step time.\n"
        )
        gpus = p["gpu_communication_ratios"]
        others = "; ".join(
            f"{name} {r['1 GbE']:.0f} on 1 GbE, {r['10 GbE']:.1f} on 10 GbE"
            for name, r in gpus["ratios"].items()
        )
        text += (
            f"\nCommunication against compute: an fp32 ring all-reduce of {results['model']}'s "
            f"gradients over this link takes {p['communication_ratio']:.1f}x the compute time "
            f"of a step here; the same ratio for GPU clusters ({gpus['assumptions']}): "
            f"{others}.\n"
        )
    return text


def _times(value: float | None) -> str:
    return f"{value:.2f}x" if value is not None else "-"


def plot(results: dict[str, Any], path: Path) -> tuple[list[str], list[str]]:
    """Test accuracy against training seconds (left) and against steps (right), every method
    in both, the target as a dashed line; returns the methods drawn in each panel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_time, by_step) = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for r in results["methods"]:
        curve = r["curve"]
        accuracy = [100 * m["accuracy"] for m in curve]
        (line,) = by_time.plot([m["train_seconds"] for m in curve], accuracy, marker=".",
                               label=r["method"])  # fmt: skip
        by_step.plot([m["step"] for m in curve], accuracy, marker=".", color=line.get_color(),
                     label=r["method"])  # fmt: skip
        if r["reached"]:
            by_time.plot(r["reached"]["train_seconds"], 100 * results["target"], "o",
                         color=line.get_color(), markersize=8, fillstyle="none")  # fmt: skip
    target = 100 * results["target"]
    values = [100 * m["accuracy"] for r in results["methods"] for m in r["curve"]] or [target]
    for ax, label in ((by_time, "training seconds (wall-clock)"), (by_step, "step")):
        ax.axhline(target, color="gray", linestyle="--", linewidth=0.8)
        ax.set_xlabel(label)
        ax.grid(True, alpha=0.3)
        ax.set_ylim(max(min(values), target - 10) - 0.5, min(100, max(*values, target) + 0.5))
    by_time.set_ylabel("test accuracy (%)")
    by_step.legend(loc="lower right")
    fig.suptitle(
        f"{results['model']} on {results['dataset']}, {results['workers']} ranks, "
        f"{results['bandwidth']} links: time to {target:g}% (measured)"
    )
    fig.tight_layout()
    drawn = tuple(
        [line.get_label() for line in ax.get_lines() if not line.get_label().startswith("_")]
        for ax in (by_time, by_step)
    )
    try:
        atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=110))
    finally:
        plt.close(fig)
    return drawn


def speedup_goal(results: dict[str, Any], method: str = "terngrad") -> str:
    """One line: how much sooner ``method`` reached the target than fp32 and fp16."""
    row = next((r for r in results["methods"] if r["method"] == method), None)
    if row is None or not row["reached"]:
        return f"{method}: did not reach the target" if row else ""
    parts = [
        f"{row[f'sooner_than_{b}']:.2f}x sooner than {b}"
        for b in ("fp32", "fp16")
        if row[f"sooner_than_{b}"] is not None
    ]
    return f"{method} reached {100 * results['target']:g}% " + ", ".join(parts or ["(alone)"])
