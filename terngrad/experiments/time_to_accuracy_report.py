"""The report of ``terngrad bench accuracy``: per run, the first evaluation that reached the
target — a test accuracy, or a test loss (``--target-loss``: a language model's validation
loss) — (its step and training seconds); per method, their mean and spread over the seeds, how
many times sooner than fp32 and fp16 (ratios of the mean seconds to target), the performance
model's prediction where asked for; ``results.md`` and ``time-to-accuracy.png``."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from terngrad.comm.spec import methods
from terngrad.experiments.comparison import Run
from terngrad.train import data as datasets
from terngrad.train import models, outputs
from terngrad.train.config import TrainConfig
from terngrad.util.files import read_json

#: what a target is of: a test accuracy (reached at or above it) or a test loss (at or below)
METRICS = ("accuracy", "loss")


def target_words(target: float, metric: str = "accuracy") -> str:
    """The target in words: ``98%`` (a test accuracy) or ``loss 1.4505`` (a test loss)."""
    return f"{100 * target:g}%" if metric == "accuracy" else f"loss {target:.4g}"


def results_target(results: dict[str, Any]) -> tuple[str, bool]:
    """A ``results.json``'s target in words, and whether it is a loss (files from before
    loss targets hold an accuracy's)."""
    metric = results.get("target_metric", "accuracy")
    return target_words(results["target"], metric), metric == "loss"


def time_to_target(
    curve: Sequence[dict[str, Any]], target: float, metric: str = "accuracy"
) -> dict[str, Any] | None:
    """The first evaluation that reaches ``target`` (its accuracy at least it, or with
    ``metric="loss"`` its test loss at most it): its step, training seconds and wall-clock
    seconds; ``None`` if none does."""
    for record in curve:
        if outputs.reaches_target(record, **{metric: target}):
            return {
                "step": record["step"],
                "train_seconds": record["train_seconds"],
                "seconds": record["seconds"],
            }
    return None


def run_row(
    name: str, cfg: TrainConfig, summary: dict, target: float, metric: str = "accuracy"
) -> dict[str, Any]:
    """One run: when it reached ``target`` (of ``metric``), how it ended, its step and bytes,
    its curve."""
    curve = outputs.read_metrics(Path(cfg.out) / outputs.METRICS)
    return {
        "method": name,
        "seed": cfg.seed,
        "label": methods.get(methods.canonical(name)).label if name else "",
        "lr": cfg.lr,
        "outer_lr": cfg.method.local.outer_lr if cfg.method.local else None,
        "reached": time_to_target(curve, target, metric),
        "final_accuracy": summary["accuracy"],
        "best_accuracy": summary["best_accuracy"],
        "final_loss": summary.get("loss"),
        "best_loss": summary.get("best_loss"),
        "steps": summary["steps"],
        "train_seconds": summary["train_seconds"],
        "step_seconds": summary["train_seconds"] / summary["steps"],
        "wire_bytes_per_step": summary["wire_bytes_per_step"],
        "hook_bytes_per_step": summary["bytes_sent_per_step"],
        "curve": curve,
    }


def line(row: dict[str, Any]) -> str:
    """A run in a line (its progress line)."""
    reached = row["reached"]
    to_target = (
        f"target at step {reached['step']} after {reached['train_seconds']:.0f} s"
        if reached
        else "target not reached"
    )
    return (
        f"{to_target}; final {100 * row['final_accuracy']:.2f}%"
        + (f" (loss {row['final_loss']:.4f})" if row.get("final_loss") is not None else "")
        + "; "
        f"{row['step_seconds']:.3f} s a step; {_mb(row['wire_bytes_per_step'])} MB a step"
    )


def _mb(nbytes: float | None) -> str:
    return f"{nbytes / 1e6:.3f}" if nbytes is not None else "-"


def step_predictions(plan) -> dict[str, Any]:
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


def _mean_sd(values: Sequence[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def method_row(name: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """A method over its seeds' runs: the mean (and sample sd) of the steps and seconds to
    target over the runs that reached it, ``reached`` only if every run did; the mean of the
    rest (accuracies, training seconds, seconds a step, bytes)."""
    hit = [r["reached"] for r in runs if r["reached"]]
    steps, steps_sd = _mean_sd([h["step"] for h in hit])
    seconds, seconds_sd = _mean_sd([h["train_seconds"] for h in hit])
    first = runs[0]
    return {
        "method": name,
        "label": first["label"],
        "lr": first.get("lr"),
        "outer_lr": first.get("outer_lr"),
        "seeds": [r["seed"] for r in runs],
        "reached_runs": len(hit),
        "reached": ({"step": steps, "train_seconds": seconds} if len(hit) == len(runs) else None),
        "steps_to_target_sd": steps_sd,
        "seconds_to_target_sd": seconds_sd,
        "final_accuracy": statistics.fmean(r["final_accuracy"] for r in runs),
        "best_accuracy": statistics.fmean(r["best_accuracy"] for r in runs),
        "final_loss": _mean_or_none([r.get("final_loss") for r in runs]),
        "best_loss": _mean_or_none([r.get("best_loss") for r in runs]),
        "train_seconds": statistics.fmean(r["train_seconds"] for r in runs),
        "step_seconds": statistics.fmean(r["step_seconds"] for r in runs),
        "wire_bytes_per_step": _mean_or_none([r["wire_bytes_per_step"] for r in runs]),
        "hook_bytes_per_step": _mean_or_none([r["hook_bytes_per_step"] for r in runs]),
        "curve": first["curve"],
    }


def _mean_or_none(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.fmean(known) if known else None


def summarise(plan, runs: list[Run]) -> dict[str, Any]:
    """Every run's row and every method's (over its seeds), the speedups to target against
    fp32 and fp16, and the model's predictions where asked for."""
    rows = []
    for r in runs:
        summary = read_json(Path(r.config.out) / outputs.SUMMARY, "run summary")
        rows.append(run_row(r.method, r.config, summary, plan.target, plan.target_metric))
    by_method: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_method.setdefault(row["method"], []).append(row)
    aggregated = [method_row(name, group) for name, group in by_method.items()]
    prediction = step_predictions(plan) if plan.predict_with else None
    by_name = {r["method"]: r for r in aggregated}
    for row in aggregated:
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
        "ranks_per_node": base.ranks_per_node,
        "bandwidth": plan.bandwidth,
        "target": plan.target,
        "target_metric": plan.target_metric,
        "seeds": sorted({row["seed"] for row in rows}),
        "stop_at_target": plan.stop_at_target,
        "tuned_on": plan.tuned_on,
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
            "quantize_last": base.hook_options.quantize_last,
            "min_numel": base.hook_options.min_numel,
        },
        "prediction": prediction,
        "methods": aggregated,
        "runs": rows,
    }


def markdown(results: dict[str, Any]) -> str:
    """The results as a Markdown page: one row per method."""
    from terngrad.train.report import markdown_table

    target, by_loss = results_target(results)
    modelled = results["prediction"] is not None
    scores = ["final loss", "best loss"] if by_loss else ["final accuracy", "best"]
    tuned = results.get("tuned_on") is not None
    header = ["method", *(["lr (outer lr)"] if tuned else []), "seeds", f"step at {target}",
              f"seconds to {target}", "vs fp32", "vs fp16", *scores, "wire MB / step / rank",
              "s / step"]  # fmt: skip
    if modelled:
        header += ["model: s / step", f"model: s to {target}", "model error"]
    rows = []
    for r in results["methods"]:
        reached = r["reached"]
        runs = len(r["seeds"])
        sd_steps = f" ± {r['steps_to_target_sd']:.0f}" if reached and runs > 1 else ""
        sd_secs = f" ± {r['seconds_to_target_sd']:.0f}" if reached and runs > 1 else ""
        row = [
            r["method"],
            *([rate_words(r)] if tuned else []),
            f"{runs}" if r["reached_runs"] == runs else f"{runs} ({r['reached_runs']} reached)",
            f"{reached['step']:.0f}{sd_steps}" if reached else "not reached",
            f"{reached['train_seconds']:.0f}{sd_secs}" if reached else "-",
            _times(r["sooner_than_fp32"]),
            _times(r["sooner_than_fp16"]),
            *(
                (_loss(r["final_loss"]), _loss(r["best_loss"]))
                if by_loss
                else (f"{100 * r['final_accuracy']:.2f}%", f"{100 * r['best_accuracy']:.2f}%")
            ),
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
        + f"\nSettings: {s['optimizer']}, "
        + (
            f"each method at its own learning rate ({s['lr_schedule']}; the column lr), tuned on "
            f"seed {results['tuned_on']}, kept out of the race (the tuning's tuning.md)"
            if tuned
            else f"lr {s['lr']} ({s['lr_schedule']})"
        )
        + ", momentum "
        f"{s['momentum']}, weight decay {s['weight_decay']}, batch {s['batch_size_per_worker']} "
        f"per worker, at most {s['steps']} steps"
        + (", each run stopped at the target" if results.get("stop_at_target") else "")
        + f", evaluated every {s['eval_every']} steps (the resolution of the step and seconds "
        f"to target), seeds {', '.join(map(str, results.get('seeds', [s['seed']])))} (± is the "
        "sample standard deviation over them; a method's time to target is its mean, shown "
        "only where every seed reached it).\n"
        "Seconds are training seconds (steps only; evaluations and checkpoints left out), "
        "wall-clock on the testbed; 'vs' is how many times sooner than that method the "
        "target was reached (a ratio of the mean seconds); wire bytes are what each rank's "
        "interface sent during the steps (mean over ranks, IP headers included)"
        + (
            f"; nodes of {results['ranks_per_node']} ranks share one interface: its bytes "
            "are the node's"
            if results.get("ranks_per_node")
            else ""
        )
        + ".\n"
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


def rate_words(row: dict[str, Any]) -> str:
    """A method's learning rate, and its outer rate where it runs local steps: ``0.05 (0.7)``."""
    if row.get("lr") is None:
        return "-"
    return f"{row['lr']:g}" + ("" if row.get("outer_lr") is None else f" ({row['outer_lr']:g})")


def _loss(value: float | None) -> str:
    return f"{value:.4f}" if value is not None else "-"


def _times(value: float | None) -> str:
    return f"{value:.2f}x" if value is not None else "-"


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
    words, _ = results_target(results)
    return f"{method} reached {words} " + ", ".join(parts or ["(alone)"])
