"""``terngrad bench accuracy``: wall-clock time to a target test accuracy on a bandwidth-limited
cluster, every method trained in turn — the TernGrad paper's claim (the same accuracy in less
time), measured end to end rather than as accuracy and step time apart.

The testbed of :mod:`terngrad.bench.network` (one network namespace per rank, links shaped with
``tc tbf``) is built once; in it each method runs the trainer as it is
(:mod:`terngrad.train.trainer`: real data, evaluations, checkpoints), its ranks started in their
namespaces (``python -m terngrad.train.trainer``, environment rendezvous over the shaped links).
The methods are those of :mod:`terngrad.bench.methods`: PyTorch's own (``fp32``, ``fp16``,
``powersgd``) as :mod:`terngrad.train.baselines` sets them up, and terngrad's hook.

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

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from terngrad.bench import methods as bench_methods
from terngrad.bench import network
from terngrad.train import data as datasets
from terngrad.train import models, run_folder, trainer
from terngrad.train.trainer import PER_NODE, TrainConfig
from terngrad.util.files import atomic_write, atomic_write_text

DEFAULT_METHODS = ("fp32", "fp16", "powersgd", "terngrad", "terngrad-ps", "qsgd", "orq")
PORT = network.PORT + 1  # method i rendezvous at PORT + i: no port reused within one testbed


@dataclass(frozen=True)
class Plan:
    """One comparison: ``base`` (model, data, optimiser, steps; its ``out`` the folder of the
    whole comparison), the ``methods`` in order, the links' ``bandwidth``, the ``target`` test
    accuracy (a fraction), seconds each method may take, the namespaces' prefix, and optionally
    the two ``bench network`` results the model predicts from."""

    base: TrainConfig
    methods: tuple[str, ...]
    bandwidth: str
    target: float
    timeout: float = 3600.0
    prefix: str = network.PREFIX
    predict_with: tuple[str, str] | None = None

    def config(self, name: str) -> TrainConfig:
        """The trainer's configuration of method ``name``, in its own sub-folder."""
        spec = bench_methods.method(name)
        out = str(Path(self.base.out) / name)
        if spec.builtin is not None:
            return replace(self.base, out=out, baseline=spec.builtin)
        x = self.base.exchange
        exchange = x.replace(
            quantizer=spec.quantizer,
            topology=spec.topology,
            quantizer_options={**x.quantizer_options, **spec.options},
        )
        return replace(self.base, out=out, baseline=None, exchange=exchange)


def _check_target(target: float) -> None:
    if not 0 < target <= 1:
        raise ValueError(
            f"target accuracy {100 * target:g}% can never be reached: give a test "
            "accuracy in percent, above 0 and at most 100 (for example --target 98.5)"
        )


def check(plan: Plan) -> list[tuple[str, TrainConfig]]:
    """Every check that needs nothing built: methods, target, rate, ranks, root, data, the
    model's inputs; ``ValueError`` with one line for the first that fails."""
    if not plan.methods:
        raise ValueError("give at least one method")
    for name in plan.methods:
        bench_methods.method(name)  # unknown: ValueError naming the choices
    repeated = sorted({m for m in plan.methods if plan.methods.count(m) > 1})
    if repeated:
        raise ValueError(f"methods given twice: {', '.join(repeated)}")
    _check_target(plan.target)
    network.rate_bits(plan.bandwidth)
    network.Testbed(plan.base.workers, plan.bandwidth, plan.prefix)  # 2 to 8 ranks
    try:
        network.check_host()
    except network.TestbedUnavailable as exc:
        raise ValueError(f"--bandwidth {plan.bandwidth}: {exc}") from None
    if plan.predict_with is not None:
        _step_predictions(plan)  # unreadable or mismatched results fail now
    trainer.check_data(plan.base)  # a missing data set or a too large batch fails here, once
    runs = [(name, plan.config(name)) for name in plan.methods]
    for _, cfg in runs:
        trainer.check_launch(cfg)
        trainer.prepare_out(cfg)  # an unwritable folder or another run's files fail here
    return runs


def run(plan: Plan, echo=print) -> dict[str, Any]:
    """Train every method of ``plan`` in one testbed, then write ``results.json``,
    ``results.md`` and ``time-to-accuracy.png`` into ``plan.base.out``; returns the results.
    A method that stopped part-way resumes from its newest checkpoint when run again."""
    from terngrad import kernels
    from terngrad.quantize.levels import LevelQuantizer

    runs = check(plan)
    levels = any(isinstance(c.exchange.make_quantizer(), LevelQuantizer) for _, c in runs)
    kernels.warm_up(levels=levels)  # compiled once here, loaded from the cache by every rank
    out, base = Path(plan.base.out), plan.base
    echo(
        f"building {base.workers} namespaces with {plan.bandwidth} links; {base.model} on "
        f"{base.dataset}, {len(plan.methods)} methods x {base.steps} steps, target "
        f"{100 * plan.target:g}% ..."
    )
    with run_folder.claim(out), network.Testbed(base.workers, plan.bandwidth, plan.prefix) as bed:
        for i, (name, cfg) in enumerate(runs):
            echo(f"== {name} ({bench_methods.METHODS[name].label}): {cfg.steps} steps")
            started = time.perf_counter()
            with run_folder.claim(Path(cfg.out)):
                trainer.prepare_out(cfg)  # again, now that no other run can change the folder
                run_folder.remove_leftovers(Path(cfg.out))
                on_eval = lambda m, n=name: echo(_progress(n, m))  # noqa: E731
                _train(bed, cfg, PORT + i, plan.timeout, on_eval)
            summary = json.loads((Path(cfg.out) / "summary.json").read_text())
            echo(f"   {name} done in {time.perf_counter() - started:.0f} s: " + _line(
                _method_row(name, cfg, summary, plan.target)
            ))  # fmt: skip
    results = summarise(plan, runs)
    atomic_write_text(out / "results.json", json.dumps(results, indent=2) + "\n")
    atomic_write_text(out / "results.md", markdown(results))
    plot(results, out / "time-to-accuracy.png")
    return results


def report(plan: Plan) -> dict[str, Any]:
    """Write the results of methods already trained into ``plan.base.out`` again (for another
    target, say) without building anything; ``ValueError`` if one has not finished, or was
    trained with other settings."""
    _check_target(plan.target)
    runs = [(name, plan.config(name)) for name in plan.methods]
    with run_folder.claim(Path(plan.base.out)):
        return _report(plan, runs)


def _report(plan: Plan, runs: list[tuple[str, TrainConfig]]) -> dict[str, Any]:
    for name, cfg in runs:
        path = Path(cfg.out) / "summary.json"
        if not path.exists():
            raise ValueError(f"{name} has not finished in {cfg.out}: train it first")
        saved = TrainConfig.from_dict(json.loads(path.read_text())["config"])
        differing = cfg.diff(saved, ignore=PER_NODE)  # a finished run may be moved
        if differing:
            raise ValueError(
                f"{cfg.out} was trained with other settings ({'; '.join(differing)}): report "
                "with the settings it was trained with"
            )
    out = Path(plan.base.out)
    results = summarise(plan, runs)
    atomic_write_text(out / "results.json", json.dumps(results, indent=2) + "\n")
    atomic_write_text(out / "results.md", markdown(results))
    plot(results, out / "time-to-accuracy.png")
    return results


def _train(bed: network.Testbed, cfg: TrainConfig, port: int, timeout: float, on_eval) -> None:
    """One method: its ranks in their namespaces, until they finish; ``on_eval(record)`` for
    each new evaluation; ``BenchFailed`` (with the logs' folder) if a rank fails."""
    out = Path(cfg.out)
    config_file = trainer.write_run_config(cfg)
    metrics = out / "metrics.jsonl"
    seen = len(_records(metrics))

    def tick() -> None:
        nonlocal seen
        records = _records(metrics)
        for record in records[seen:]:
            on_eval(record)
        seen = max(seen, len(records))

    bed.run([str(config_file)], out, timeout, "terngrad.train.trainer", port, tick)
    tick()
    if not (out / "summary.json").exists():
        raise network.BenchFailed(f"rank 0 wrote no summary; the ranks' logs: {out}/rank*.log")


def _records(path: Path) -> list[dict[str, Any]]:
    """The evaluations written so far (a line being written is skipped until complete)."""
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return records


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
    curve = _records(Path(cfg.out) / "metrics.jsonl")
    return {
        "method": name,
        "label": bench_methods.METHODS[name].label,
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


def _step_predictions(plan: Plan) -> dict[str, Any]:
    """The model's step time per method, from ``plan.predict_with`` (unshaped run to calibrate,
    the run at this bandwidth to predict), and what the model took from them."""
    from terngrad.bench import model

    assert plan.predict_with is not None
    unshaped, shaped = (model.load_summary(p) for p in plan.predict_with)
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
    prof = model.profile_model(base.model, shape)
    calibration = model.calibrate(unshaped, prof)
    checks = model.validate(calibration, [shaped], prof)
    link = shaped["link_probe"]["bytes_per_second"]
    gpu = model.Accelerator(batch_size=base.worker_batch)
    return {
        "from": list(plan.predict_with),
        "compute_seconds": shaped["compute_seconds"],
        "link_bytes_per_second": link,
        "communication_ratio": model.communication_ratio(
            prof, base.workers, link, shaped["compute_seconds"]
        ),
        "gpu_communication_ratios": {
            "assumptions": f"8 GPUs at {gpu.flops_per_s / 1e12:g} TFLOP/s, batch "
            f"{gpu.batch_size}, Ethernet at 95.7% of line rate",
            "ratios": model.gpu_ratios(workers=8, gpu=gpu),
        },
        "host_bytes_per_second": calibration.host_bytes_per_s,
        "step_seconds": {c.method: c.predicted for c in checks},
        "bench_step_seconds": {c.method: c.measured for c in checks},
    }


def summarise(plan: Plan, runs: list[tuple[str, TrainConfig]]) -> dict[str, Any]:
    """Every method's row, the speedups to target against fp32 and fp16, and the model's
    predictions where asked for."""
    rows = []
    for name, cfg in runs:
        summary = json.loads((Path(cfg.out) / "summary.json").read_text())
        rows.append(_method_row(name, cfg, summary, plan.target))
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
            "seed": base.exchange.seed,
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
