"""``terngrad reproduce EXPERIMENT``: the papers' experiments, each a subcommand with its own
flags — ``lenet``, ``cifar``, ``fashion`` (the TernGrad paper), ``orq`` (the optimal-quantization
paper's comparison), ``transformer`` (TernGrad on a GPT with AdamW). Each is a comparison of
:mod:`terngrad.experiments.comparison`: finished runs are read back, stopped ones resume."""

from __future__ import annotations

import argparse
from pathlib import Path

from terngrad.cli.flags import add_methods, non_negative_int, positive_int


def add(sub: argparse._SubParsersAction) -> None:
    from terngrad.experiments import gpt as tf
    from terngrad.experiments import optimal_quantization as oq
    from terngrad.train import data, models

    p = sub.add_parser(
        "reproduce",
        help="the papers' experiments: lenet, cifar, fashion (TernGrad); orq (ORQ/BinGrad); "
        "transformer (TernGrad on a GPT with AdamW)",
    )
    experiments = p.add_subparsers(dest="experiment", required=True, metavar="EXPERIMENT")
    for name, what, steps, workers in (
        ("lenet", "LeNet on MNIST, fp32 and TernGrad (the paper's Fig. 3 setting)", 10_000, "2 4"),
        ("cifar", "Table 1's ConvNet on CIFAR-10 (--data-dir required)", 100_000, "2"),
        ("fashion", "the ConvNet protocol on Fashion-MNIST", 5_000, "2"),
    ):
        e = experiments.add_parser(name, help=what)
        e.add_argument("--steps", type=positive_int, default=steps, help=f"({steps})")
        e.add_argument(
            "--workers",
            type=positive_int,
            nargs="+",
            default=[int(n) for n in workers.split()],
            help=f"a run per worker count ({workers})",
        )
        e.add_argument("--data-dir", help="the data set's folder (CIFAR-10: required)")
        e.add_argument("--out", help=f"output folder (runs/reproduce-{name})")
        e.set_defaults(func=paper)

    e = experiments.add_parser("orq", help="the optimal-quantization paper's comparison")
    e.add_argument(
        "--model", default="lenet", choices=models.names(), help="lenet (default) or cifarnet, ..."
    )
    e.add_argument("--dataset", choices=data.names(), help="(lenet: mnist, cifarnet: fashion)")
    _common(e, "runs/reproduce-orq-MODEL", "600; cifarnet: 1000")
    e.add_argument("--seeds", type=positive_int, default=3, help="seeds of the main methods (3)")
    add_methods(e, oq.DEFAULT_METHODS)
    e.add_argument(
        "--variants",
        nargs="+",
        choices=oq.VARIANTS,
        default=list(oq.VARIANTS),
        help="noclip, clip (both)",
    )
    e.add_argument(
        "--warmup-steps",
        type=non_negative_int,
        help="warm-up of the clip variant, from lr/10 (default: a tenth of --steps)",
    )
    e.add_argument(
        "--no-algorithm2",
        action="store_true",
        help="skip the parameter-server rows (ORQ-5, BinGrad-b with both broadcasts)",
    )
    e.set_defaults(func=orq)

    e = experiments.add_parser("transformer", help="TernGrad on a GPT with AdamW")
    _common(e, "runs/reproduce-transformer", "1000")
    e.add_argument(
        "--model",
        choices=tf.MODELS,
        default="gpt",
        help="gpt (d = 256, 3.3M parameters) or gpt-small (d = 128, 0.8M) (gpt)",
    )
    e.add_argument("--seeds", type=positive_int, default=1, help="seeds of every method (1)")
    add_methods(e, tf.DEFAULT_METHODS)
    e.add_argument(
        "--full-precision-steps",
        type=positive_int,
        metavar="K",
        help="the full-precision steps of the -warmup methods before TernGrad (their share "
        "of --steps)",
    )
    e.set_defaults(func=transformer)


def _common(e: argparse.ArgumentParser, out: str, steps: str) -> None:
    e.add_argument("--steps", type=positive_int, help=f"steps of every run ({steps})")
    e.add_argument("--workers", type=positive_int, default=4, help="processes of every run (4)")
    e.add_argument("--eval-every", type=positive_int, help="(a tenth of --steps)")
    e.add_argument("--data-dir", help="the data set's folder")
    e.add_argument("--out", help=f"output folder ({out})")


def paper(args: argparse.Namespace) -> int:
    from terngrad.experiments import comparison, paper

    out = args.out or f"runs/reproduce-{args.experiment}"
    workers = tuple(args.workers)
    if args.experiment == "lenet":
        experiment = paper.lenet(out, args.steps, workers)
    elif args.experiment == "cifar":
        experiment = paper.cifar(out, args.data_dir, args.steps, workers)
    else:
        experiment = paper.fashion(out, args.data_dir, args.steps, workers)
    print(comparison.run(experiment, Path(out)))
    print(f"Written: {out}/results.md, {out}/results.json, {out}/curves.png")
    return 0


def orq(args: argparse.Namespace) -> int:
    from terngrad.experiments import comparison
    from terngrad.experiments import optimal_quantization as oq

    out = args.out or f"runs/reproduce-orq-{args.model}"
    base = oq.protocol(
        out, args.model, args.dataset, args.data_dir, args.workers, args.steps, args.eval_every
    )
    experiment = oq.ORQComparison(
        base,
        tuple(args.methods),
        tuple(args.variants),
        args.seeds,
        args.warmup_steps,
        algorithm2=not args.no_algorithm2,
    )
    print(comparison.run(experiment, Path(out)))
    print(f"Written: {out}/results.json, {out}/results.md, {out}/curves-*.png")
    return 0


def transformer(args: argparse.Namespace) -> int:
    from terngrad.experiments import comparison
    from terngrad.experiments import gpt as tf

    out = args.out or "runs/reproduce-transformer"
    base = tf.protocol(
        out, args.data_dir, args.workers, args.steps or 1000, args.eval_every, model=args.model
    )
    experiment = tf.TransformerComparison(
        base, tuple(args.methods), args.seeds, args.full_precision_steps
    )
    print(comparison.run(experiment, Path(out)))
    print(f"Written: {out}/results.json, {out}/results.md, {out}/curves.png, {out}/tradeoff.png")
    return 0
