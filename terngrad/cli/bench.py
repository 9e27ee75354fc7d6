"""``terngrad bench``: ``quantizers`` (every quantizer on one gradient), ``codec`` (encode and
decode cost against the memory floor), ``network`` (step time of each method on a shaped
cluster) and ``accuracy`` (time to a target accuracy on it)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from terngrad import __version__, quantize
from terngrad.cli.flags import (
    Deprecated,
    Described,
    OneValue,
    add_methods,
    add_settings,
    add_time_limit,
    in_range,
    one_or_list,
    positive_float,
    positive_int,
)
from terngrad.cli.tuning import add_tuning_flags, tuning_from_args
from terngrad.util.files import atomic_write_text
from terngrad.util.settings import INT64


def add(sub: argparse._SubParsersAction) -> None:
    from terngrad.bench.network import DEFAULT_METHODS as NETWORK_METHODS
    from terngrad.bench.testbed import BANDWIDTHS
    from terngrad.comm import Options
    from terngrad.comm.spec import methods
    from terngrad.experiments.time_to_accuracy import DEFAULT_METHODS as ACCURACY_METHODS
    from terngrad.train import models
    from terngrad.train.config import TrainConfig

    p = sub.add_parser("bench", help="benchmarks")
    bench = p.add_subparsers(dest="bench", required=True)
    b = bench.add_parser("quantizers", help="every quantizer on one gradient")
    b.add_argument("--numel", type=positive_int, default=1_000_000, help="gradient size")
    b.add_argument("--seed", type=in_range(INT64), default=0, help="seed of the gradient (0)")
    b.add_argument("--repeats", type=positive_int, default=3, help="timing repeats")
    b.set_defaults(func=quantizers)

    b = bench.add_parser("codec", help="encode/decode/owner-sum time against tensor.half()")
    b.add_argument(
        "--sizes",
        type=positive_int,
        nargs="+",
        default=[1_000_000, 25_000_000],
        help="tensor sizes (1000000 25000000)",
    )
    b.add_argument("--repeats", type=positive_int, default=5, help="timed calls (median)")
    b.add_argument(
        "--simulated-workers",
        type=positive_int,
        default=4,
        metavar="N",
        help="workers of the exchange, simulated in this process: the shard owner sums their "
        "payloads (4)",
    )
    b.add_argument("--workers", type=positive_int, dest="simulated_workers", action=Deprecated,
                   new="--simulated-workers", help=argparse.SUPPRESS)  # fmt: skip
    kernels = ("numba", "torch")
    b.add_argument(
        "--kernel-backends",
        nargs="+",
        choices=kernels,
        metavar="NAME",
        help="kernel backends to time (numba torch; numba: fused, torch: the reference)",
    )
    b.add_argument(
        "--kernels", choices=kernels, action=OneValue, new="--kernel-backends",
        new_dest="kernel_backends", metavar="NAME", help="one kernel backend to time",
    )  # fmt: skip
    b.add_argument(
        "--quantizers",
        nargs="*",
        default=quantize.names(),
        metavar="NAME",
        help="quantizers whose public encode/decode are timed (all; none: give the flag alone)",
    )
    b.add_argument("--json", help="also write the rows to this JSON file")
    b.set_defaults(func=codec)

    b = bench.add_parser(
        "overhead", help="where the hook's own seconds go in a step, beside fp32 and fp16"
    )
    b.add_argument("--models", nargs="+", default=["lenet"], choices=models.names(), help="(lenet)")
    add_settings(
        b, TrainConfig, only=("workers", "steps", "batch_size"),
        defaults={"workers": 4, "steps": 20,
                  "batch_size": Described("lenet, cifarnet: 64; alexnet: 8; others: 32")},
    )  # fmt: skip
    b.add_argument(
        "--methods",
        nargs="+",
        default=["fp32", "fp16", "terngrad"],
        metavar="METHOD",
        help="fp32, fp16 and hook methods of the table (fp32 fp16 terngrad)",
    )
    _add_untimed_steps(b, 5)
    b.add_argument("--json", help="also write the summaries to this JSON file")
    b.set_defaults(func=overhead)

    rates = f"link rate: {', '.join(BANDWIDTHS)} or any NNmbit/NNgbit"
    b = bench.add_parser(
        "network", help="step time of each method on a bandwidth-limited cluster of namespaces"
    )
    add_settings(
        b, TrainConfig, only=("model", "workers", "batch_size", "steps"),
        defaults={"model": "alexnet", "workers": 4, "batch_size": 8, "steps": 5},
    )  # fmt: skip
    b.add_argument(
        "--ranks",
        type=positive_int,
        dest="workers",
        action=Deprecated,
        new="--workers",
        help=argparse.SUPPRESS,
    )
    b.add_argument("--bandwidth", default="1gbit", metavar="RATE", help=f"{rates} (1gbit)")
    add_methods(b, list(NETWORK_METHODS), methods.METHODS)
    b.add_argument(
        "--input-shape",
        type=positive_int,
        nargs=3,
        metavar=("C", "H", "W"),
        help="the synthetic images' shape (the model's own: 3 224 224 for alexnet, 3 32 32 for "
        "cifarnet; Fashion-MNIST's is 1 28 28)",
    )
    _add_untimed_steps(b, 3)
    add_time_limit(b, 1800.0, "of the run (every method)")
    b.add_argument("--out", default="runs/network", help="folder for results.json, speedup.png")
    b.add_argument(
        "--cleanup",
        action="store_true",
        help="remove what a killed run's testbed made (its namespaces and processes)",
    )
    b.set_defaults(func=network)

    b = bench.add_parser(
        "accuracy",
        help="time to a target accuracy (or loss) on a bandwidth-limited cluster, every method "
        "in turn",
    )
    groups = add_settings(
        b,
        TrainConfig,
        defaults={"eval_every": 100},
        exclude=(
            "out",
            "workers_threads",
            "kernels",
            "full_precision_steps",  # a method's (terngrad-warmup0.2)
            "checkpoint_every",
            "keep_checkpoints",
            "max_skipped_steps",
            "check_replicas_every",
            "timeout",
            "stop_at_accuracy",  # --stop-at-target
            "stop_at_loss",  # --stop-at-target with --target-loss
        ),
    )
    add_settings(b, Options, only=("quantize_last", "min_numel"), groups=groups)
    g = b.add_argument_group("comparison")
    g.add_argument(
        "--bandwidth", action=OneValue, new="--bandwidths", new_dest="bandwidths",
        metavar="RATE", help=f"{rates} (100mbit)",
    )  # fmt: skip
    g.add_argument(
        "--bandwidths", nargs="+", metavar="RATE",
        help="a sweep: each rate's comparison into --out/RATE, then sweep.md (one rate: a "
        "link of a sweep run a call a link, its tuning shared in --out/tuning)",
    )  # fmt: skip
    add_methods(g, list(ACCURACY_METHODS), methods.METHODS)
    target = g.add_mutually_exclusive_group(required=True)
    target.add_argument("--target", type=float, help="test accuracy to reach, in percent")
    target.add_argument(
        "--target-loss", type=float, metavar="LOSS",
        help="test loss to reach instead, in nats per prediction (a language model's validation "
        "loss: fp32's final loss + 1%%, say)",
    )  # fmt: skip
    target.add_argument(
        "--target-loss-above-fp32", type=positive_float, metavar="PERCENT",
        help="with --tune-lr: the target is the test loss fp32 ended at, at its tuned rate, "
        "plus PERCENT percent (the GPT race: 1)",
    )  # fmt: skip
    add_tuning_flags(b, "race")
    g.add_argument("--seeds", type=positive_int, default=1,
                   help="seeds of every method: --seed, --seed + 1, ... (1)")  # fmt: skip
    g.add_argument(
        "--stop-at-target", action="store_true",
        help="every run stops after the evaluation that reaches its target (what a sweep needs)",
    )  # fmt: skip
    g.add_argument(
        "--predict-with",
        nargs=2,
        metavar=("UNSHAPED", "SHAPED"),
        help="results.json of terngrad bench network runs (--bandwidth unlimited, and this "
        "bandwidth; same model, workers, --batch-size): the model's time to target beside the "
        "measurement",
    )
    add_time_limit(g, 3600.0, "of each method's run")
    g.add_argument("--out", default="runs/accuracy", help="output folder (runs/accuracy)")
    g.add_argument(
        "--report-only",
        action="store_true",
        help="train nothing: write the report of the methods already trained in --out again "
        "(another --target, say; no root needed)",
    )
    b.set_defaults(func=accuracy)


def _add_untimed_steps(b: argparse.ArgumentParser, default: int) -> None:
    """``--untimed-steps`` (steps before the timed ``--steps``); ``--warmup``, its older
    spelling, is not the learning rate's ``--warmup-steps``."""
    b.add_argument("--untimed-steps", type=positive_int, default=default,
                   help=f"untimed training steps before the timed --steps ({default})")  # fmt: skip
    b.add_argument("--warmup", type=positive_int, dest="untimed_steps", action=Deprecated,
                   new="--untimed-steps", help=argparse.SUPPRESS)  # fmt: skip


def quantizers(args: argparse.Namespace) -> int:
    from terngrad.bench.quantizers import report

    print(f"terngrad {__version__}: " + report(args.numel, args.seed, args.repeats))
    return 0


def codec(args: argparse.Namespace) -> int:
    from terngrad.bench import codec as bench_codec

    kernels = one_or_list(args, "kernels", "kernel_backends", ["numba", "torch"])
    rows = []
    for numel in args.sizes:
        print(f"measuring {numel:,} elements ...", file=sys.stderr, flush=True)
        rows += bench_codec.measure(
            numel, args.repeats, args.simulated_workers, kernels=kernels, quantizers=args.quantizers
        )
    print(f"on {bench_codec.cpu_name()}, {torch.get_num_threads()} threads")
    print(bench_codec.table(rows))
    if args.json:
        result = {"cpu": bench_codec.cpu_name(), "threads": torch.get_num_threads(), "rows": rows}
        atomic_write_text(Path(args.json), json.dumps(result, indent=2) + "\n")
        print(f"Written: {args.json}")
    return 0


def overhead(args: argparse.Namespace) -> int:
    from terngrad.bench import codec as bench_codec
    from terngrad.bench import overhead as bench_overhead

    summaries = []
    for model in args.models:
        print(f"measuring {model} on {args.workers} ranks ...", file=sys.stderr, flush=True)
        summaries.append(
            bench_overhead.measure(
                model, args.workers, args.methods, args.steps, args.untimed_steps, args.batch_size
            )
        )
        print(bench_overhead.table(summaries[-1]), flush=True)
    print(f"on {bench_codec.cpu_name()}")
    if args.json:
        result = {"cpu": bench_codec.cpu_name(), "models": summaries}
        atomic_write_text(Path(args.json), json.dumps(result, indent=2) + "\n")
        print(f"Written: {args.json}")
    return 0


def network(args: argparse.Namespace) -> int:
    from terngrad.bench import network as bench_network
    from terngrad.bench import testbed

    if args.cleanup:
        removed, foreign = testbed.cleanup()
        print(f"removed {len(removed)} namespace(s) and the processes in them: "
              f"{', '.join(removed) or 'none'}")  # fmt: skip
        if foreign:
            print(f"left {', '.join(foreign)}: terngrad's testbed did not make them (no record "
                  "of them); 'ip netns delete NAME' removes one")  # fmt: skip
        return 0
    testbed.rate_bits(args.bandwidth)  # a bad rate fails here, before anything is built
    print(
        f"building {args.workers} namespaces with {args.bandwidth} links; {args.model}, "
        f"{len(args.methods)} methods x {args.untimed_steps} + {args.steps} steps ...",
        file=sys.stderr,
        flush=True,
    )
    summary = bench_network.run(
        args.workers,
        args.bandwidth,
        args.model,
        args.methods,
        Path(args.out),
        batch_size=args.batch_size,
        steps=args.steps,
        warmup=args.untimed_steps,
        timeout=args.time_limit,
        input_shape=args.input_shape,
    )
    print(bench_network.table(summary))
    print(f"Written: {args.out}/results.json, {args.out}/speedup.png")
    return 0


def accuracy(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from terngrad.bench import testbed
    from terngrad.cli.flags import given
    from terngrad.comm import Options
    from terngrad.comm.spec.method_spec import Method
    from terngrad.experiments import comparison, sweep, time_to_accuracy, time_to_accuracy_report
    from terngrad.experiments.tuning import raced, tune
    from terngrad.experiments.tuning_record import tuned_loss_target
    from terngrad.train import run_folder
    from terngrad.train.config import TrainConfig

    rates = one_or_list(args, "bandwidth", "bandwidths", ["100mbit"])
    settings = {**given(args, TrainConfig), "out": args.out, "keep_checkpoints": 1}
    # (the protocol every method runs under: --quantize-last, --min-numel)
    protocol = Options(**given(args, Options, exclude=("seed", "timeout")))
    base = TrainConfig(**settings, method=Method(exchange=protocol))
    above_fp32 = args.target_loss_above_fp32
    by_loss = args.target_loss is not None or above_fp32 is not None
    if not by_loss:
        target = args.target / 100
    else:  # --target-loss-above-fp32: set from the tuning; until then a placeholder
        target = 1.0 if args.target_loss is None else args.target_loss
    plan = time_to_accuracy.AccuracyComparison(
        base, tuple(args.methods), rates[0], target, args.time_limit,
        predict_with=tuple(args.predict_with) if args.predict_with else None,
        seeds=args.seeds, stop_at_target=args.stop_at_target,
        target_metric="loss" if by_loss else "accuracy",
    )  # fmt: skip
    out = Path(args.out)
    if args.target_loss_above_fp32 is not None and "fp32" not in args.methods:
        raise ValueError("--target-loss-above-fp32 sets the target from fp32's tuning: give "
                         "fp32 among --methods")  # fmt: skip
    tuned = tuning_from_args(args, plan, above_fp32=args.target_loss_above_fp32)
    echo = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731

    def train(one) -> None:
        folder = Path(one.base.out)
        if args.report_only:
            with run_folder.claim(folder):
                text = comparison.report_only(one, folder)
        else:  # every bad input fails in the plan's checks first: one line, status 2
            text = comparison.run(one, folder, echo=echo)
        print(text)
        results = json.loads((folder / "results.json").read_text())
        print(time_to_accuracy_report.speedup_goal(results))
        print(f"Written: {folder}/results.json, {folder}/results.md, "
              f"{folder}/time-to-accuracy.png")  # fmt: skip

    swept = args.bandwidths is not None  # a sweep, even of one rate: --out/RATE each
    plans = sweep.comparisons(plan, rates) if swept else [plan]
    for one in plans:  # every bandwidth's bad input fails before anything trains
        one.plan()
        testbed.rate_bits(one.bandwidth)
        if one.predict_with is not None:
            time_to_accuracy_report.step_predictions(one)
    if tuned is not None:
        record, text = tune(tuned, echo, args.report_only)
        print(text)
        folder = tuned.out
        print(f"Written: {folder}/tuning.json, {folder}/tuning.md, {folder}/tuning.png")
        if args.tune_only:
            return 0
        if above_fp32 is not None:
            loss = tuned_loss_target(record, "fp32", above_fp32)
            print(f"target: fp32's tuned loss + {above_fp32:g}% = {loss:.4f}")
            plans = [replace(one, target=loss) for one in plans]
        plans = [raced(one, record) for one in plans]
    if not swept:
        train(plans[0])
        return 0
    print(sweep.run(plans, train, out))
    print(f"Written: {out}/sweep.json, {out}/sweep.md, {out}/sweep.png")
    return 0
