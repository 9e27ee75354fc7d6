"""The tuning flags of a comparison (``bench accuracy``, ``reproduce transformer``): every
method first at each learning rate given, on a seed kept out of the race, then compared at its
own best (:mod:`terngrad.experiments.tuning`)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from terngrad.cli.flags import in_range, positive_float
from terngrad.util.settings import INT64

if TYPE_CHECKING:
    from terngrad.experiments.tuning import LrTuning, Tunable


def add_tuning_flags(parser: argparse.ArgumentParser, race: str) -> None:
    """``--tune-lr``, ``--tune-outer-lr``, ``--tune-seed``, ``--tune-only`` in their own group;
    ``race``: what the tuned runs are then compared in ("race", "comparison")."""
    from terngrad.experiments import tuning

    t = parser.add_argument_group(
        "tuning (a fair comparison: every method at its own best learning rate)",
        f"Each method first trains on the tuning seed at every rate given (into --out/tuning; "
        f"finished points are read back; bench accuracy: on an unlimited link), then the "
        f"{race} runs each at the rate that reached the target in the fewest steps (a loss: the "
        "lowest final loss).",
    )
    t.add_argument("--tune-lr", type=positive_float, nargs="+", metavar="LR",
                   help="the learning rates to tune every method over")  # fmt: skip
    t.add_argument(
        "--tune-outer-lr", type=positive_float, nargs="+", metavar="LR",
        help="with --tune-lr: the outer learning rates to tune methods with local steps over "
        "too (their grid: every pair; default: --outer-lr alone)",
    )  # fmt: skip
    t.add_argument(
        "--tune-seed", type=in_range(INT64), metavar="SEED",
        help=f"with --tune-lr: the seed of the tuning runs, never one of the {race}'s "
        f"({tuning.DEFAULT_SEED})",
    )  # fmt: skip
    t.add_argument("--tune-only", action="store_true",
                   help=f"with --tune-lr: tune and report the rates; no {race}")  # fmt: skip


def tuning_from_args(
    args: argparse.Namespace, race: Tunable, above_fp32: float | None = None
) -> LrTuning | None:
    """The tuning ``--tune-lr`` asks for before ``race``, or ``None``; ``ValueError`` in one
    line for a tuning flag (or ``--target-loss-above-fp32``, ``above_fp32``) without it, and
    for a rate given both ways (``--lr`` and ``--tune-lr``: the tuning chooses it)."""
    from terngrad.experiments import tuning

    if not args.tune_lr:
        tuning_flags = {
            "--tune-outer-lr": args.tune_outer_lr,
            "--tune-seed": args.tune_seed is not None,
            "--tune-only": args.tune_only,
            "--target-loss-above-fp32": above_fp32 is not None,
        }
        for flag, given in tuning_flags.items():
            if given:
                raise ValueError(f"{flag} is a setting of the tuning: give --tune-lr too")
        return None
    for flag, tuned_by in (("lr", "--tune-lr"), ("outer_lr", "--tune-outer-lr")):
        if getattr(args, flag, None) is not None and getattr(args, tuned_by[2:].replace("-", "_")):
            raise ValueError(
                f"--{flag.replace('_', '-')} and {tuned_by}: the tuning chooses each method's "
                f"rate; give {tuned_by} alone"
            )
    seed = tuning.DEFAULT_SEED if args.tune_seed is None else args.tune_seed
    grid = tuning.LrGrid(tuple(args.tune_lr), seed, tuple(args.tune_outer_lr or ()))
    return tuning.LrTuning.of(race, grid)
