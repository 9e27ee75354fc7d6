"""The ``terngrad`` command line.

* ``terngrad demo`` — LeNet on MNIST, 4 workers, fp32 against TernGrad: accuracy, bytes, time.
* ``terngrad train`` — one training run with N workers (see ``terngrad train --help``).
* ``terngrad reproduce lenet|cifar|fashion`` — the paper's experiments, with a results table.
* ``terngrad bench quantizers`` — every quantizer on one gradient: bytes, error, encode time.

Bad arguments print one line and exit with status 2; a failed worker exits with status 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import torch

from terngrad import __version__, quantize

# --------------------------------------------------------------------------- benchmarks


def bench_quantizers(args: argparse.Namespace) -> int:
    from terngrad.bench.quantizers import report

    print(f"terngrad {__version__}: " + report(args.numel, args.seed, args.repeats))
    return 0


def bench_codec(args: argparse.Namespace) -> int:
    from pathlib import Path

    from terngrad.bench import codec
    from terngrad.train.files import atomic_write_text

    rows = []
    for numel in args.sizes:
        print(f"measuring {numel:,} elements ...", file=sys.stderr, flush=True)
        rows += codec.measure(numel, args.repeats, args.workers, kernels=args.kernels)
    print(codec.table(rows))
    if args.json:
        atomic_write_text(Path(args.json), json.dumps(rows, indent=2) + "\n")
        print(f"Written: {args.json}")
    return 0


def bench_network(args: argparse.Namespace) -> int:
    from pathlib import Path

    from terngrad.bench import network

    if args.cleanup:
        gone = network.cleanup()
        print(f"removed {len(gone)} namespace(s): {', '.join(gone) or 'none'}")
        return 0
    network.rate_bits(args.bandwidth)  # a bad rate fails here, before anything is built
    print(
        f"building {args.ranks} namespaces with {args.bandwidth} links; {args.model}, "
        f"{len(args.methods)} methods x {args.warmup} + {args.steps} steps ...",
        file=sys.stderr,
        flush=True,
    )
    summary = network.run(
        args.ranks, args.bandwidth, args.model, args.methods, Path(args.out),
        batch_size=args.batch_size, steps=args.steps, warmup=args.warmup, timeout=args.timeout,
    )  # fmt: skip
    print(network.table(summary))
    print(f"Written: {args.out}/results.json, {args.out}/speedup.png")
    return 0


# --------------------------------------------------------------------------- training


def _quantizer_options(args: argparse.Namespace) -> dict[str, Any]:
    options: dict[str, Any] = {}
    if args.no_clip:
        options["clip"] = None
    elif args.clip is not None:
        options["clip"] = args.clip
    for name in ("bucket_size", "levels", "packing"):
        if getattr(args, name) is not None:
            options[name] = getattr(args, name)
    return options


def _config(args: argparse.Namespace):
    from terngrad.train.trainer import TrainConfig

    given = args.batch_size is not None or args.total_batch_size is not None
    batch = args.batch_size if given else 64  # both given: TrainConfig refuses it
    return TrainConfig(
        out=args.out,
        model=args.model,
        dataset=args.dataset,
        data_dir=args.data_dir,
        workers=args.workers,
        quantizer=args.quantizer,
        quantizer_options=_quantizer_options(args),
        topology=args.topology,
        kernels=args.kernels,
        error_feedback=args.error_feedback,
        keep_last_fp32=not args.quantize_last,
        min_numel=args.min_numel,
        optimizer=args.optimizer,
        lr=args.lr,
        momentum=args.momentum,
        weight_decay=args.weight_decay,
        lr_schedule=args.lr_schedule,
        lr_power=args.lr_power,
        batch_size=batch,
        total_batch_size=args.total_batch_size,
        steps=args.steps,
        eval_every=args.eval_every,
        dropout=args.dropout,
        seed=args.seed,
        progress=not args.quiet,
    )


def train(args: argparse.Namespace) -> int:
    from terngrad.train.trainer import launch

    cfg = _config(args)
    summary = launch(
        cfg, nnodes=args.nnodes, node_rank=args.node_rank, rdzv_endpoint=args.rdzv_endpoint
    )
    if summary:
        print(
            f"test accuracy {100 * summary['accuracy']:.2f}% after {cfg.steps} steps; "
            f"{summary['bytes_sent_per_rank'] / 1e6:.2f} MB sent by rank 0 "
            f"({summary['bytes_sent_per_step']:,.0f} bytes a step); {summary['seconds']:.0f} s; "
            f"outputs in {cfg.out}/ (metrics.jsonl, summary.json, checkpoint.pt, curves.png)"
        )
    return 0


def reproduce(args: argparse.Namespace) -> int:
    from terngrad.train import experiments

    out = args.out or f"runs/reproduce-{args.experiment}"
    workers = tuple(args.workers) if args.workers else None
    if args.experiment == "lenet":
        runs = experiments.lenet(out, args.steps or 10_000, workers or (2, 4))
    elif args.experiment == "cifar":
        runs = experiments.cifar(out, args.data_dir, args.steps or 100_000, workers or (2,))
    else:
        runs = experiments.fashion(out, args.data_dir, args.steps or 5_000, workers or (2,))
    print(experiments.run(args.experiment, runs, out))
    print(f"Written: {out}/results.md, {out}/curves.png")
    return 0


def demo(args: argparse.Namespace) -> int:
    from terngrad.train import experiments

    runs = experiments.demo(args.out, args.steps)
    print(
        f"terngrad demo: LeNet on MNIST, 4 workers, {args.steps} steps each, fp32 and then "
        "TernGrad (sharded exchange), on this machine's cores\n",
        flush=True,
    )
    print(experiments.run("demo", runs, args.out))
    print(f"Plot: {args.out}/curves.png; per-run outputs in {args.out}/*/")
    return 0


# --------------------------------------------------------------------------- parser


def _number(kind: type, minimum: float, strict: bool, what: str):
    """An argparse type: ``kind`` (int or float) at least (or, if ``strict``, above) ``minimum``."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if value < minimum or (strict and value == minimum):
            raise argparse.ArgumentTypeError(f"expected {what}, got {value}")
        return value

    return parse


_positive_int = _number(int, 1, False, "a positive integer")
_non_negative_int = _number(int, 0, False, "an integer >= 0")
_positive_float = _number(float, 0.0, True, "a positive number")


def _add_train_arguments(p: argparse.ArgumentParser) -> None:
    from terngrad.comm import TOPOLOGIES
    from terngrad.kernels import KERNELS
    from terngrad.train import data, models
    from terngrad.train.trainer import OPTIMIZERS, SCHEDULES

    g = p.add_argument_group("model and data")
    g.add_argument("--model", default="lenet", choices=models.names())
    g.add_argument("--dataset", default="mnist", choices=data.names())
    g.add_argument("--data-dir", help="folder of the data set's files (CIFAR-10: required)")
    g.add_argument("--dropout", type=float, help="dropout ratio of the model's dropout layers")
    g = p.add_argument_group("workers and exchange")
    g.add_argument("--workers", type=_positive_int, default=4, help="processes (total)")
    g.add_argument("--quantizer", default="terngrad", choices=quantize.names())
    g.add_argument("--topology", default="sharded", choices=TOPOLOGIES)
    g.add_argument(
        "--kernels", default="auto", choices=KERNELS,
        help="encode/decode kernels: fused (numba, triton), the torch reference, or auto",
    )  # fmt: skip
    g.add_argument("--clip", type=_positive_float, help="TernGrad: clip at CLIP sigma (2.5)")
    g.add_argument("--no-clip", action="store_true", help="TernGrad: no clipping")
    g.add_argument("--bucket-size", type=_positive_int, help="elements per scale")
    g.add_argument("--levels", type=_positive_int, help="qsgd/linear/orq: distinct values")
    g.add_argument("--packing", choices=("base3", "2bit"), help="TernGrad: wire packing")
    g.add_argument("--error-feedback", action="store_true", help="worker-side error feedback")
    g.add_argument(
        "--quantize-last", action="store_true", help="quantize the last layer too (default: fp32)"
    )
    g.add_argument(
        "--min-numel", type=_non_negative_int, default=1024,
        help="tensors with fewer elements stay fp32 (default 1024)",
    )  # fmt: skip
    g = p.add_argument_group("optimisation")
    g.add_argument("--optimizer", default="momentum", choices=OPTIMIZERS)
    g.add_argument("--lr", type=_positive_float, default=0.01)
    g.add_argument("--momentum", type=float, default=0.9)
    g.add_argument("--weight-decay", type=float, default=0.0)
    g.add_argument("--lr-schedule", default="constant", choices=SCHEDULES)
    g.add_argument("--lr-power", type=_positive_float, default=0.5, help="poly schedule power")
    g.add_argument("--batch-size", type=_positive_int, help="per worker (default 64)")
    g.add_argument("--total-batch-size", type=_positive_int, help="split over the workers")
    g.add_argument("--steps", type=_positive_int, default=1000)
    g.add_argument("--eval-every", type=_positive_int, default=500)
    g.add_argument("--seed", type=int, default=0)
    g = p.add_argument_group("output and cluster")
    g.add_argument("--out", required=True, help="output folder (resumes from its checkpoint)")
    g.add_argument("--quiet", action="store_true", help="no progress line")
    g.add_argument("--nnodes", type=_positive_int, default=1, help="machines (torchrun)")
    g.add_argument("--node-rank", type=_non_negative_int, help="this machine's rank (torchrun)")
    g.add_argument("--rdzv-endpoint", help="HOST:PORT of the rendezvous (torchrun)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="terngrad",
        description="Communication-efficient data-parallel training with quantized gradients.",
    )
    parser.add_argument("--version", action="version", version=f"terngrad {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("demo", help="LeNet on MNIST, 4 workers, fp32 against TernGrad")
    p.add_argument("--steps", type=_positive_int, default=800, help="steps per run (800)")
    p.add_argument("--out", default="runs/demo", help="output folder (runs/demo)")
    p.set_defaults(func=demo)

    p = sub.add_parser("train", help="train a model with N workers")
    _add_train_arguments(p)
    p.set_defaults(func=train)

    p = sub.add_parser("reproduce", help="the paper's experiments: lenet, cifar, fashion")
    p.add_argument("experiment", choices=("lenet", "cifar", "fashion"))
    p.add_argument("--steps", type=_positive_int, help="shorten (or lengthen) every run")
    p.add_argument("--workers", type=_positive_int, nargs="+", help="worker counts to run")
    p.add_argument("--data-dir", help="the data set's folder (CIFAR-10: required)")
    p.add_argument("--out", help="output folder (runs/reproduce-EXPERIMENT)")
    p.set_defaults(func=reproduce)

    p = sub.add_parser("bench", help="benchmarks")
    bench = p.add_subparsers(dest="bench", required=True)
    b = bench.add_parser("quantizers", help="every quantizer on one gradient")
    b.add_argument("--numel", type=_positive_int, default=1_000_000, help="gradient size")
    b.add_argument("--seed", type=int, default=0, help="random seed")
    b.add_argument("--repeats", type=_positive_int, default=3, help="timing repeats")
    b.set_defaults(func=bench_quantizers)
    b = bench.add_parser("codec", help="encode/decode/owner-sum time against tensor.half()")
    b.add_argument(
        "--sizes", type=_positive_int, nargs="+", default=[1_000_000, 25_000_000, 100_000_000],
        help="tensor sizes (1000000 25000000 100000000)",
    )  # fmt: skip
    b.add_argument("--repeats", type=_positive_int, default=5, help="timed calls (median)")
    b.add_argument("--workers", type=_positive_int, default=4, help="N for the owner's sum")
    b.add_argument(
        "--kernels", nargs="+", choices=("numba", "torch"), default=["numba", "torch"],
        help="kernel backends to time (numba: fused; torch: the reference)",
    )  # fmt: skip
    b.add_argument("--json", help="also write the rows to this JSON file")
    b.set_defaults(func=bench_codec)
    from terngrad.bench.network import BANDWIDTHS, DEFAULT_METHODS, METHODS
    from terngrad.train import models

    b = bench.add_parser(
        "network", help="step time of each method on a bandwidth-limited cluster of namespaces"
    )
    b.add_argument("--ranks", type=_positive_int, default=4, help="ranks, 2 to 8 (4)")
    b.add_argument(
        "--bandwidth", default="1gbit",
        help=f"link rate: {', '.join(BANDWIDTHS)} or any NNmbit/NNgbit (1gbit)",
    )  # fmt: skip
    b.add_argument("--model", default="alexnet", choices=models.names())
    b.add_argument("--methods", nargs="+", default=list(DEFAULT_METHODS), choices=list(METHODS))
    b.add_argument("--batch-size", type=_positive_int, default=8, help="examples per rank")
    b.add_argument("--steps", type=_positive_int, default=5, help="timed steps per method")
    b.add_argument("--warmup", type=_positive_int, default=3, help="untimed steps first")
    b.add_argument("--timeout", type=_positive_float, default=1800.0, help="seconds for it all")
    b.add_argument("--out", default="runs/network", help="folder for results.json, speedup.png")
    b.add_argument("--cleanup", action="store_true", help="remove a killed run's namespaces")
    b.set_defaults(func=bench_network)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from terngrad.bench.network import BenchFailed, TestbedUnavailable
    from terngrad.train.data import DataMissing

    try:
        return args.func(args)
    except (ValueError, DataMissing) as exc:  # what the user asked for: one line, status 2
        parser.exit(2, f"terngrad: error: {exc}\n")
    except (TestbedUnavailable, BenchFailed) as exc:  # the machine could not: status 1
        parser.exit(1, f"terngrad: {exc}\n")
    except KeyboardInterrupt as exc:  # Ctrl-C: what was being built is already torn down
        parser.exit(130, f"terngrad: interrupted{f' ({exc})' if str(exc) else ''}\n")
    except torch.multiprocessing.ProcessRaisedException as exc:
        last = str(exc).strip().splitlines()[-1]
        parser.exit(1, f"terngrad: a worker failed: {last}\n")


if __name__ == "__main__":
    sys.exit(main())
