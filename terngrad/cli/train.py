"""``terngrad train`` (one run with N workers) and ``terngrad demo`` (LeNet on MNIST, fp32
against TernGrad). The training flags are made from :class:`~terngrad.train.config.TrainConfig`
and :class:`~terngrad.comm.Options` (:mod:`terngrad.cli.flags`)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from terngrad.cli.flags import (
    add_exchange_flags,
    add_settings,
    exchange_settings,
    given,
    non_negative_int,
    positive_int,
    spelling,
)

if TYPE_CHECKING:  # (the commands import the training layer when they run)
    pass


def add(sub: argparse._SubParsersAction) -> None:
    from terngrad.comm.spec.local import LocalSteps
    from terngrad.comm.spec.method_spec import BASELINES
    from terngrad.train.config import TrainConfig

    p = sub.add_parser("demo", help="LeNet on MNIST, 4 workers, fp32 against TernGrad")
    add_settings(p, TrainConfig, only=("steps",), defaults={"steps": 800})
    p.add_argument("--out", default="runs/demo", help="output folder (runs/demo)")
    p.set_defaults(func=demo)

    p = sub.add_parser("train", help="train a model with N workers")
    groups = add_settings(p, TrainConfig, exclude=("out",))
    add_exchange_flags(p, groups)
    add_settings(p, LocalSteps, groups=groups)
    g = groups.setdefault("baseline", p.add_argument_group("baseline"))
    g.add_argument(
        "--baseline", choices=list(BASELINES),
        help="PyTorch's own averaging instead of terngrad's hook: DDP's fp32 all-reduce, "
        "fp16_compress_hook, or powerSGD_hook (one bucket): the methods fp32, fp16, powersgd",
    )  # fmt: skip
    g.add_argument("--powersgd-rank", type=positive_int, metavar="R",
                   help="with --baseline powersgd: its low-rank factors' rank (2)")  # fmt: skip
    g = groups.setdefault("output", p.add_argument_group("output"))
    g.add_argument("--out", required=True, help="output folder (resumes from its checkpoint)")
    g.add_argument("--resume", help="start from this checkpoint file (default: --out's newest)")
    g.add_argument("--quiet", action="store_true", help="no progress line")
    g = p.add_argument_group("cluster (torchrun)")
    g.add_argument(
        "--max-restarts",
        type=non_negative_int,
        default=0,
        help="torchrun: restarts of failed workers, which resume (0)",
    )
    g.add_argument("--nnodes", type=positive_int, default=1, help="machines (1)")
    g.add_argument("--node-rank", type=non_negative_int, help="this machine's rank")
    g.add_argument("--rdzv-endpoint", help="HOST:PORT of the rendezvous")
    p.set_defaults(func=train)


def config(args: argparse.Namespace, **fixed: Any):
    """The run's :class:`~terngrad.train.config.TrainConfig` from the training flags (and
    ``fixed`` settings of the command), checked where it is made: ``--method`` (by default
    ``terngrad``, or PyTorch's ``--baseline``) with the exchange and local-steps flags put over
    it by the one rule (:func:`~terngrad.comm.spec.over.over`): a flag of what the method
    leaves at its default adds to it (the run's method is then named with it), a flag of what
    it sets otherwise (``--local-steps 8`` with ``terngrad-local16``) is refused in one
    line."""
    from terngrad.comm import Options
    from terngrad.comm.spec import methods
    from terngrad.comm.spec.local import LocalSteps
    from terngrad.comm.spec.method_spec import Method
    from terngrad.comm.spec.over import over
    from terngrad.train.config import TrainConfig

    settings = {**given(args, TrainConfig), **fixed}
    exchange = exchange_settings(args)
    local = given(args, LocalSteps)
    if args.baseline is not None:
        if args.method is not None:
            raise ValueError(
                "give --method or --baseline, not both (fp32, fp16, powersgd are methods)"
            )
        rank = {} if args.powersgd_rank is None else {"powersgd_rank": args.powersgd_rank}
        method = Method(baseline=args.baseline, **rank)
    elif args.powersgd_rank is not None:
        raise ValueError(
            f"--powersgd-rank is PowerSGD's rank: give --method powersgd-r{args.powersgd_rank}"
        )
    else:
        method = methods.get(args.method or "terngrad")
    method = over(method, exchange, local, spelling(TrainConfig, Options, LocalSteps))
    return TrainConfig(**settings, method=method)


def train(args: argparse.Namespace) -> int:
    from pathlib import Path

    from terngrad.train.board import EVENTS
    from terngrad.train.launch import launch

    cfg = config(args, out=args.out, progress=not args.quiet)
    summary = launch(
        cfg,
        nnodes=args.nnodes,
        node_rank=args.node_rank,
        rdzv_endpoint=args.rdzv_endpoint,
        resume=args.resume,
        max_restarts=args.max_restarts,
    )
    if summary:
        sent = (
            f"{summary['bytes_sent_per_rank'] / 1e6:.2f} MB sent by rank 0 "
            f"({summary['bytes_sent_per_step']:,.0f} bytes a step)"
            if summary["bytes_sent_per_rank"] is not None
            else f"PyTorch's {cfg.method.baseline} averaging (bytes not counted outside the "
            "testbed)"
        )
        score = (
            f"validation {summary['bits_per_char']:.3f} bits/char"
            if "bits_per_char" in summary
            else f"test accuracy {100 * summary['accuracy']:.2f}%"
        )
        flag = "--stop-at-loss" if cfg.stop_at_accuracy is None else "--stop-at-accuracy"
        stopped = f" (its target, {flag})" if summary.get("stopped_at_target") else ""
        events = ", events.out.tfevents.*" if any(Path(cfg.out).glob(EVENTS)) else ""
        print(
            f"{score} after {summary['steps']} steps{stopped}; {sent}; "
            f"{summary['seconds']:.0f} s; outputs in {cfg.out}/ (metrics.jsonl, summary.json, "
            f"checkpoint-*.pt, curves.png{events})"
        )
    return 0


def demo(args: argparse.Namespace) -> int:
    from pathlib import Path

    from terngrad.experiments import comparison, paper

    print(
        f"terngrad demo: LeNet on MNIST, 4 workers, {args.steps} steps each, fp32 and then "
        "TernGrad (sharded exchange), on this machine's cores\n",
        flush=True,
    )
    print(comparison.run(paper.demo(args.out, args.steps), Path(args.out)))
    print(f"Plot: {args.out}/curves.png; per-run outputs in {args.out}/*/")
    return 0
