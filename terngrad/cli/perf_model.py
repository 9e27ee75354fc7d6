"""``terngrad perf-model``: the performance model against the testbed (``validate``) and
extrapolated to GPU clusters (``scale``). ``terngrad model ...`` is its older spelling."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from terngrad.cli.flags import Deprecated, add_settings, deprecated, positive_float, positive_int
from terngrad.util.files import atomic_write_text


def add(sub: argparse._SubParsersAction) -> None:
    from terngrad.bench.scaling import NETWORKS
    from terngrad.train import models
    from terngrad.train.config import TrainConfig

    for name, shown in (("perf-model", True), ("model", False)):
        options = {"help": "the performance model: validate it, extrapolate with it"}
        p = sub.add_parser(name, **(options if shown else {}))
        group = p.add_subparsers(dest="perf_model", required=True)
        b = group.add_parser("validate", help="calibrate on an unshaped run, predict shaped runs")
        b.add_argument(
            "--calibrate", required=True, help="results.json of a --bandwidth unlimited run"
        )
        b.add_argument("--runs", nargs="+", required=True, help="results.json of shaped runs")
        b.add_argument("--out", help="folder for validation.json and validation.md")
        b.set_defaults(func=validate, old=not shown)
        b = group.add_parser("scale", help="images/s against workers (the paper's Figure 5)")
        b.add_argument(
            "--models", nargs="+", default=["alexnet", "googlenet", "vgg-a"], choices=models.names()
        )
        b.add_argument(
            "--worker-counts", nargs="+", type=positive_int, metavar="N",
            default=[8, 16, 32, 64, 128, 256, 512],
            help="the cluster sizes predicted (8 16 32 64 128 256 512)",
        )  # fmt: skip
        b.add_argument(
            "--workers", nargs="+", type=positive_int, dest="worker_counts", action=Deprecated,
            new="--worker-counts", help=argparse.SUPPRESS,
        )  # fmt: skip
        b.add_argument("--networks", nargs="+", default=list(NETWORKS), choices=list(NETWORKS))
        b.add_argument(
            "--methods",
            nargs="+",
            default=["fp32", "fp16", "terngrad"],
            metavar="METHOD",
            help="methods of the table (docs/methods.md; fp32 fp16 terngrad)",
        )
        b.add_argument(
            "--gpu-tflops",
            type=positive_float,
            default=10.0,
            help="sustained training FLOP/s of one worker, in TFLOP/s (10)",
        )
        add_settings(b, TrainConfig, only=("batch_size",), defaults={"batch_size": 64})
        b.add_argument(
            "--codec-rate",
            type=positive_float,
            default=1e11,
            help="elements/s the worker's fused codec encodes+decodes (1e11)",
        )
        b.add_argument("--out", default="runs/scaling", help="folder for scaling.json, scaling.png")
        b.set_defaults(func=scale, old=not shown)


def _say_renamed(args: argparse.Namespace) -> None:
    if args.old:
        deprecated(f"terngrad model {args.perf_model} is now terngrad perf-model {args.perf_model}")


def validate(args: argparse.Namespace) -> int:
    from terngrad.bench import perf_model, validation

    _say_renamed(args)
    base = validation.load_summary(args.calibrate)
    runs = [validation.load_summary(r) for r in args.runs]
    prof = perf_model.profile_model(base["model"], base.get("input_shape"))
    calibration = validation.calibrate(base, prof)
    checks = validation.validate(calibration, runs, prof)
    table = validation.validation_table(calibration, checks)
    print(table)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        result = {
            "calibration": vars(calibration),
            "calibrated_on": args.calibrate,
            "runs": args.runs,
            "checks": [dict(vars(c), error=c.error) for c in checks],
        }
        atomic_write_text(out / "validation.json", json.dumps(result, indent=2) + "\n")
        atomic_write_text(out / "validation.md", table + "\n")
        print(f"Written: {out}/validation.json, {out}/validation.md")
    return 0


def scale(args: argparse.Namespace) -> int:
    from terngrad.bench import perf_model, scaling

    _say_renamed(args)
    gpu = scaling.Accelerator(args.gpu_tflops * 1e12, args.batch_size, args.codec_rate)
    results: dict[str, Any] = {
        "assumptions": {
            "gpu_flops_per_s": gpu.flops_per_s,
            "batch_size_per_worker": gpu.batch_size,
            "codec_elements_per_s": gpu.codec_elements_per_s,
            "networks": {k: vars(scaling.NETWORKS[k]) for k in args.networks},
            "input": "3x224x224, 1000 classes",
        },
        "workers": args.worker_counts,
        "networks": args.networks,
        "models": args.models,
        "images_per_second": {},
    }
    for name in args.models:
        print(f"profiling {name} ...", file=sys.stderr, flush=True)
        prof = perf_model.profile_model(name, (3, 224, 224), 1000)
        one = gpu.batch_size / gpu.compute_seconds(prof)
        for net in args.networks:
            per = scaling.scaling(
                prof, args.methods, args.worker_counts, scaling.NETWORKS[net], gpu
            )
            results["images_per_second"].setdefault(net, {})[name] = {
                "ideal": [n * one for n in args.worker_counts],
                "methods": per,
            }
            for method, ys in per.items():
                shown = ", ".join(
                    f"{n}: {y:,.0f}" for n, y in zip(args.worker_counts, ys, strict=True)
                )
                print(f"{name:<10} {net:<7} {method:<18} images/s at {shown}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "scaling.json", json.dumps(results, indent=2) + "\n")
    scaling.plot_scaling(results, out / "scaling.png")
    print(f"Written: {out}/scaling.json, {out}/scaling.png")
    return 0
