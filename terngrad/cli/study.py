"""``terngrad study``: every quantizer on a model's real gradients, as an HTML/Markdown report
(:mod:`terngrad.bench.study`)."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from terngrad.cli.flags import non_negative_int, number, positive_float, positive_int


def add(sub: argparse._SubParsersAction) -> None:
    from terngrad.bench.study import DEFAULT_METHODS
    from terngrad.train import data, models

    p = sub.add_parser("study", help="every quantizer on a model's real gradients: a report")
    p.add_argument("--model", choices=models.names(), help="(lenet; with --from-checkpoint: its)")
    p.add_argument(
        "--dataset", choices=data.names(), help="(mnist, gpt: pydoc; with --from-checkpoint: its)"
    )
    p.add_argument("--data-dir", help="the data set's folder (CIFAR-10: required)")
    p.add_argument("--from-checkpoint", help="start from a terngrad train checkpoint file")
    p.add_argument("--steps", type=non_negative_int, default=200, help="training steps (200)")
    p.add_argument(
        "--capture-at",
        type=non_negative_int,
        nargs="+",
        help="steps whose gradients are studied (five from 0 to --steps)",
    )
    p.add_argument(
        "--methods",
        nargs="+",
        default=list(DEFAULT_METHODS),
        metavar="METHOD",
        help=f"methods to compare (all): {', '.join(DEFAULT_METHODS)}",
    )
    p.add_argument(
        "--draws",
        type=number(int, 2, False, "an integer >= 2"),
        default=16,
        help="random draws per stochastic quantizer (16)",
    )
    p.add_argument("--batch-size", type=positive_int, default=64, help="(64)")
    p.add_argument(
        "--lr",
        type=positive_float,
        help="learning rate of SGD with momentum 0.9 (0.01); with --from-checkpoint the run's "
        "own optimizer goes on from its saved state and learning rate, unless --lr is given",
    )
    p.add_argument("--seed", type=int, default=0, help="(0)")
    p.add_argument("--out", default="runs/study", help="folder of the report (runs/study)")
    p.set_defaults(func=study)


def study(args: argparse.Namespace) -> int:
    from terngrad.bench import study as st
    from terngrad.bench.study_report import findings, write_report
    from terngrad.train import models

    st.check_methods(args.methods)  # fail before loading anything
    ready = st.setup(
        args.model,
        args.dataset,
        args.data_dir,
        args.from_checkpoint,
        args.batch_size,
        args.steps,
        args.lr,
        args.seed,
    )
    result = st.study(
        ready.model,
        models.loss,
        ready.batches,
        steps=args.steps,
        capture_at=args.capture_at,
        methods=args.methods,
        draws=args.draws,
        optimizer=ready.optimizer,
        title=ready.title,
        seed=args.seed,
        progress=lambda m: print(m, file=sys.stderr, flush=True),
    )
    report = write_report(result, Path(args.out), "terngrad " + shlex.join(args.argv))
    for line in findings(result):
        print(line)
    print(f"Written: {report}, {Path(args.out) / 'report.md'}, {Path(args.out) / 'study.json'}")
    return 0
