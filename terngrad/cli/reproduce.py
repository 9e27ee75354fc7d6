"""``terngrad reproduce EXPERIMENT``: the papers' experiments, each a subcommand with its own
flags — ``lenet``, ``cifar``, ``fashion`` (the TernGrad paper), ``orq`` (the optimal-quantization
paper's comparison), ``transformer`` (TernGrad on a GPT with AdamW). Each is a comparison of
:mod:`terngrad.experiments.comparison`: finished runs are read back, stopped ones resume."""

from __future__ import annotations

import argparse
from pathlib import Path

from terngrad.cli.flags import (
    Described,
    OneValue,
    add_methods,
    add_settings,
    one_or_list,
    positive_int,
)
from terngrad.cli.tuning import add_tuning_flags, tuning_from_args

#: each paper experiment's steps and worker counts (a run per count) unless told
PAPER = {
    "lenet": ("LeNet on MNIST, fp32 and TernGrad (the paper's Fig. 3 setting)", 10_000, [2, 4]),
    "cifar": ("Table 1's ConvNet on CIFAR-10 (--data-dir required)", 100_000, [2]),
    "fashion": ("the ConvNet protocol on Fashion-MNIST", 5_000, [2]),
}
TENTH = "a tenth of --steps"


def add(sub: argparse._SubParsersAction) -> None:
    from terngrad.comm import Options
    from terngrad.experiments import gpt as tf
    from terngrad.experiments import optimal_quantization as oq
    from terngrad.train.config import TrainConfig

    p = sub.add_parser(
        "reproduce",
        help="the papers' experiments: lenet, cifar, fashion (TernGrad); orq (ORQ/BinGrad); "
        "transformer (TernGrad on a GPT with AdamW)",
    )
    experiments = p.add_subparsers(dest="experiment", required=True, metavar="EXPERIMENT")
    for name, (what, steps, counts) in PAPER.items():
        e = experiments.add_parser(name, help=what)
        shown = " ".join(map(str, counts))
        add_settings(
            e, TrainConfig, only=("steps", "workers", "data_dir"),
            defaults={"steps": steps, "workers": Described(f"a run per --worker-counts ({shown})")},
            actions={"workers": {"action": OneValue, "new": "--worker-counts",
                                 "new_dest": "worker_counts"}},
        )  # fmt: skip
        e.add_argument(
            "--worker-counts", type=positive_int, nargs="+", metavar="N",
            help=f"a run per worker count ({shown})",
        )  # fmt: skip
        e.add_argument("--out", help=f"output folder (runs/reproduce-{name})")
        e.set_defaults(func=paper)

    e = experiments.add_parser("orq", help="the optimal-quantization paper's comparison")
    add_settings(
        e, TrainConfig, only=("model", "dataset", "data_dir", "workers", "steps", "eval_every",
                              "warmup_steps"),
        defaults={
            "model": "lenet", "workers": 4,
            "dataset": Described("lenet: mnist; cifarnet: fashion; another model: synthetic"),
            "steps": Described("600; cifarnet: 1000"), "eval_every": Described(TENTH),
            "warmup_steps": Described(f"the clip variant's: {TENTH}; the others: none"),
        },
    )  # fmt: skip
    e.add_argument("--out", help="output folder (runs/reproduce-orq-MODEL)")
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
        "--no-algorithm2",
        action="store_true",
        help="skip the parameter-server rows (ORQ-5, BinGrad-b with both broadcasts)",
    )
    e.set_defaults(func=orq)

    e = experiments.add_parser("transformer", help="TernGrad on a GPT with AdamW")
    groups = add_settings(
        e, TrainConfig, only=("data_dir", "workers", "steps", "eval_every"),
        defaults={"workers": 4, "steps": 1000, "eval_every": Described(TENTH)},
    )  # fmt: skip
    e.add_argument("--out", help="output folder (runs/reproduce-transformer)")
    e.add_argument(  # a choice of the comparison's two GPTs, not any model of --model
        "--model",
        choices=tf.MODELS,
        default="gpt",
        help="gpt (d = 256, 3.3M parameters) or gpt-small (d = 128, 0.8M) (gpt)",
    )
    e.add_argument("--seeds", type=positive_int, default=1, help="seeds of every method (1)")
    add_methods(e, tf.DEFAULT_METHODS, (*tf.DEFAULT_METHODS, *tf.LOCAL_METHODS))
    add_settings(
        e, Options, only=("full_precision_steps",), groups=groups,
        defaults={"full_precision_steps": Described(
            "a fifth of --steps; of the -warmup methods, the others none")},
    )  # fmt: skip
    add_tuning_flags(e, "comparison")
    e.set_defaults(func=transformer)


def paper(args: argparse.Namespace) -> int:
    from terngrad.experiments import comparison, paper

    out = args.out or f"runs/reproduce-{args.experiment}"
    workers = tuple(one_or_list(args, "workers", "worker_counts", PAPER[args.experiment][2]))
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
    from terngrad.experiments import comparison, tuning
    from terngrad.experiments import gpt as tf

    out = args.out or "runs/reproduce-transformer"
    base = tf.protocol(
        out, args.data_dir, args.workers, args.steps, args.eval_every, model=args.model
    )
    experiment = tf.TransformerComparison(
        base, tuple(args.methods), args.seeds, args.full_precision_steps
    )
    tuned = tuning_from_args(args, experiment)
    if tuned is not None:  # each method at its own rate (the lowest final loss on the seed)
        record, text = tuning.tune(tuned, print)
        print(text)
        print(f"Written: {tuned.out}/tuning.json, {tuned.out}/tuning.md, {tuned.out}/tuning.png")
        if args.tune_only:
            return 0
        experiment = tuning.raced(experiment, record)
    print(comparison.run(experiment, Path(out)))
    print(f"Written: {out}/results.json, {out}/results.md, {out}/curves.png, {out}/tradeoff.png")
    return 0
