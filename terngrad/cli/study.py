"""``terngrad study``: every quantizer on a model's real gradients, as an HTML/Markdown report
(:mod:`terngrad.bench.study`)."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from terngrad.cli.flags import Described, add_settings, non_negative_int, number


def add(sub: argparse._SubParsersAction) -> None:
    from terngrad.bench.study import DEFAULT_METHODS
    from terngrad.train.config import TrainConfig

    p = sub.add_parser("study", help="every quantizer on a model's real gradients: a report")
    checkpoint = "with --from-checkpoint: the checkpoint's"
    add_settings(
        p, TrainConfig, only=("model", "dataset", "data_dir", "batch_size", "lr", "seed"),
        defaults={
            "model": Described(f"lenet; {checkpoint}"),
            "dataset": Described(f"the model's own: mnist; gpt: pydoc; {checkpoint}"),
            "batch_size": 64, "seed": 0,
            "lr": Described(f"0.01, SGD with momentum 0.9; {checkpoint} optimizer, from its "
                            "saved state and rate"),
        },
    )  # fmt: skip
    p.add_argument("--from-checkpoint", help="start from a terngrad train checkpoint file")
    # training steps as everywhere, but 0 too: the gradients of the model as it is
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
