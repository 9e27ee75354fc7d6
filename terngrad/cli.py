"""The ``terngrad`` command line.

* ``terngrad demo`` — LeNet on MNIST, 4 workers, fp32 against TernGrad: accuracy, bytes, time.
* ``terngrad train`` — one training run with N workers (see ``terngrad train --help``).
* ``terngrad reproduce lenet|cifar|fashion`` — the paper's experiments, with a results table;
  ``terngrad reproduce orq`` — the optimal-quantization paper's comparison of quantizers.
* ``terngrad bench quantizers`` — every quantizer on one gradient: bytes, error, encode time.
* ``terngrad bench codec`` / ``bench network`` — codec speed; step time on a shaped cluster.
* ``terngrad model validate`` / ``model scale`` — the performance model against the testbed, and
  extrapolated to many workers.
* ``terngrad study`` — every quantizer on a model's real gradients, as an HTML/Markdown report.

Bad arguments print one line and exit with status 2; a failed worker exits with status 1.
"""

from __future__ import annotations

import argparse
import json
import math
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
    from terngrad.util.files import atomic_write_text

    rows = []
    for numel in args.sizes:
        print(f"measuring {numel:,} elements ...", file=sys.stderr, flush=True)
        rows += codec.measure(
            numel, args.repeats, args.workers, kernels=args.kernels, quantizers=args.quantizers
        )
    print(f"on {codec.cpu_name()}, {torch.get_num_threads()} threads")
    print(codec.table(rows))
    if args.json:
        result = {"cpu": codec.cpu_name(), "threads": torch.get_num_threads(), "rows": rows}
        atomic_write_text(Path(args.json), json.dumps(result, indent=2) + "\n")
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
        input_shape=args.input_shape,
    )  # fmt: skip
    print(network.table(summary))
    print(f"Written: {args.out}/results.json, {args.out}/speedup.png")
    return 0


def bench_accuracy(args: argparse.Namespace) -> int:
    from pathlib import Path

    from terngrad.bench import accuracy
    from terngrad.comm import Options
    from terngrad.train.trainer import DEFAULT_TIMEOUT, TrainConfig

    given = args.batch_size is not None or args.total_batch_size is not None
    base = TrainConfig(
        out=args.out, model=args.model, dataset=_dataset(args), data_dir=args.data_dir,
        workers=args.workers, optimizer=args.optimizer, lr=args.lr, momentum=args.momentum,
        weight_decay=args.weight_decay, lr_schedule=args.lr_schedule, lr_power=args.lr_power,
        warmup_steps=args.warmup_steps, warmup_epochs=args.warmup_epochs,
        batch_size=args.batch_size if given else 64, total_batch_size=args.total_batch_size,
        steps=args.steps, eval_every=args.eval_every, dropout=args.dropout, keep_checkpoints=1,
        exchange=Options(
            seed=args.seed, quantize_last=args.quantize_last, min_numel=args.min_numel,
            timeout=DEFAULT_TIMEOUT,
        ),
    )  # fmt: skip
    plan = accuracy.Plan(
        base, tuple(args.methods), args.bandwidth, args.target / 100, args.timeout,
        predict_with=tuple(args.predict_with) if args.predict_with else None,
    )  # fmt: skip
    out = Path(args.out)
    written = f"Written: {out}/results.json, {out}/results.md, {out}/time-to-accuracy.png"
    if args.report_only:
        results = accuracy.report(plan)
        print(accuracy.markdown(results))
        print(accuracy.speedup_goal(results))
        print(written)
        return 0
    # every bad input fails in run's checks first: one line, status 2, nothing built
    results = accuracy.run(plan, echo=lambda line: print(line, file=sys.stderr, flush=True))
    print(accuracy.markdown(results))
    print(accuracy.speedup_goal(results))
    print(written)
    return 0


def model_validate(args: argparse.Namespace) -> int:
    from pathlib import Path

    from terngrad.bench import model
    from terngrad.util.files import atomic_write_text

    base = model.load_summary(args.calibrate)
    runs = [model.load_summary(r) for r in args.runs]
    prof = model.profile_model(base["model"], base.get("input_shape"))
    calibration = model.calibrate(base, prof)
    checks = model.validate(calibration, runs, prof)
    table = model.validation_table(calibration, checks)
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


def model_scale(args: argparse.Namespace) -> int:
    from pathlib import Path

    from terngrad.bench import model
    from terngrad.util.files import atomic_write_text

    gpu = model.Accelerator(args.gpu_tflops * 1e12, args.batch_size, args.codec_rate)
    results: dict[str, Any] = {
        "assumptions": {
            "gpu_flops_per_s": gpu.flops_per_s,
            "batch_size_per_worker": gpu.batch_size,
            "codec_elements_per_s": gpu.codec_elements_per_s,
            "networks": {k: vars(model.NETWORKS[k]) for k in args.networks},
            "input": "3x224x224, 1000 classes",
        },
        "workers": args.workers,
        "networks": args.networks,
        "models": args.models,
        "images_per_second": {},
    }
    for name in args.models:
        print(f"profiling {name} ...", file=sys.stderr, flush=True)
        prof = model.profile_model(name, (3, 224, 224), 1000)
        one = gpu.batch_size / gpu.compute_seconds(prof)
        for net in args.networks:
            per = model.scaling(prof, args.methods, args.workers, model.NETWORKS[net], gpu)
            results["images_per_second"].setdefault(net, {})[name] = {
                "ideal": [n * one for n in args.workers],
                "methods": per,
            }
            for method, ys in per.items():
                shown = ", ".join(f"{n}: {y:,.0f}" for n, y in zip(args.workers, ys, strict=True))
                print(f"{name:<10} {net:<7} {method:<18} images/s at {shown}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "scaling.json", json.dumps(results, indent=2) + "\n")
    model.plot_scaling(results, out / "scaling.png")
    print(f"Written: {out}/scaling.json, {out}/scaling.png")
    return 0


def study(args: argparse.Namespace) -> int:
    import shlex
    from pathlib import Path

    from terngrad.bench import study as st
    from terngrad.bench.study_report import findings, write_report
    from terngrad.train import data, models
    from terngrad.train.trainer import TrainConfig, check_pairing, make_optimizer

    st.check_methods(args.methods)  # fail before loading anything
    model_name = args.model or "lenet"
    dataset = args.dataset or default_dataset(model_name)
    data_dir, state, ckpt = args.data_dir, None, None
    if args.from_checkpoint:
        ckpt = _read_checkpoint(args.from_checkpoint)
        saved = ckpt["config"]
        if args.model and args.model != saved["model"]:
            raise ValueError(
                f"--model {args.model} does not match the checkpoint's model {saved['model']} "
                "(leave --model out with --from-checkpoint)"
            )
        model_name = saved["model"]
        dataset = args.dataset or saved["dataset"]
        data_dir = args.data_dir or saved.get("data_dir")
        state = ckpt["model"]
    check_pairing(model_name, dataset)
    shape = models.default_input_shape(model_name)
    ds = data.load(dataset, data_dir, synthetic_shape=shape, synthetic_classes=10,
                   seed=args.seed, context=shape[0])  # fmt: skip
    torch.manual_seed(args.seed)
    model = models.build(model_name, ds.input_shape, ds.num_classes)
    if state is not None:
        try:
            model.load_state_dict(state)
        except RuntimeError as exc:
            first = str(exc).strip().splitlines()[-1].strip()
            raise ValueError(
                f"{args.from_checkpoint} does not fit {model_name} on {dataset}: {first}"
            ) from None
    if ckpt is None:
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr or 0.01, momentum=0.9)
    else:  # the run's own optimizer goes on: AdamW's moments and the scheduled learning rate
        cfg = TrainConfig.from_dict(ckpt["config"])
        optimizer = make_optimizer(cfg, model)
        if "optimizer" in ckpt:
            optimizer.load_state_dict(ckpt["optimizer"])
        if args.lr is not None:
            for group in optimizer.param_groups:
                group["lr"] = args.lr
    sampler = data.ShardSampler(ds.train_size, 0, 1, args.batch_size, args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    batches = (ds.train_batch(sampler.batch(s), gen) for s in range(args.steps + 1))
    title = f"{model_name} on {dataset}" + (" (from a checkpoint)" if state is not None else "")
    result = st.study(
        model, models.loss, batches, steps=args.steps,
        capture_at=args.capture_at, methods=args.methods, draws=args.draws,
        optimizer=optimizer, title=title, seed=args.seed,
        progress=lambda m: print(m, file=sys.stderr, flush=True),
    )  # fmt: skip
    report = write_report(result, Path(args.out), "terngrad " + shlex.join(args.argv))
    for line in findings(result):
        print(line)
    print(f"Written: {report}, {Path(args.out) / 'report.md'}, {Path(args.out) / 'study.json'}")
    return 0


def _read_checkpoint(path: str) -> dict[str, Any]:
    """A ``terngrad train`` checkpoint (checksum verified, no pickled code run)."""
    from terngrad.train import checkpoints
    from terngrad.train.trainer import CHECKPOINT_FORMAT

    ckpt = checkpoints.load(path)
    if ckpt.get("format") != CHECKPOINT_FORMAT or "model" not in ckpt:
        raise ValueError(f"{path} is not a terngrad training checkpoint of this version")
    return ckpt


# --------------------------------------------------------------------------- training


def exchange_options(args: argparse.Namespace):
    """The exchange's :class:`~terngrad.comm.Options` from the "exchange" option group (one
    check, where it is made: a bad value is one line and exit status 2)."""
    from dataclasses import fields

    from terngrad.comm import Options

    if args.no_clip and args.clip is not None:
        raise ValueError("give --clip or --no-clip, not both")
    q_options: dict[str, Any] = {"clip": None} if args.no_clip else {}
    for name in ("clip", "bucket_size", "levels", "packing"):
        if getattr(args, name) is not None:
            q_options[name] = getattr(args, name)
    # a flag left out is None (a switch: False): the preset's value, or the default, stands
    given = {}
    for f in fields(Options):
        value = getattr(args, f.name, None)
        if f.name != "quantizer_options" and value is not None and value is not False:
            given[f.name] = value
    if args.preset is not None:
        return Options.preset(args.preset, **given, quantizer_options=q_options)
    return Options(**{**given, "quantizer_options": q_options})  # one name, flag to field


def _config(args: argparse.Namespace):
    from terngrad.train.trainer import TrainConfig

    given = args.batch_size is not None or args.total_batch_size is not None
    batch = args.batch_size if given else 64  # both given: TrainConfig refuses it
    return TrainConfig(
        out=args.out,
        model=args.model,
        dataset=_dataset(args),
        data_dir=args.data_dir,
        workers=args.workers,
        exchange=exchange_options(args),
        optimizer=args.optimizer,
        lr=args.lr,
        momentum=args.momentum,
        weight_decay=args.weight_decay,
        lr_schedule=args.lr_schedule,
        lr_power=args.lr_power,
        warmup_steps=args.warmup_steps,
        warmup_epochs=args.warmup_epochs,
        batch_size=batch,
        total_batch_size=args.total_batch_size,
        steps=args.steps,
        eval_every=args.eval_every,
        dropout=args.dropout,
        baseline=args.baseline,
        progress=not args.quiet,
        checkpoint_every=args.checkpoint_every,
        keep_checkpoints=args.keep_checkpoints,
        max_skipped_steps=args.max_skipped_steps,
        check_replicas_every=args.check_replicas_every,
    )


def train(args: argparse.Namespace) -> int:
    from terngrad.train.trainer import launch

    cfg = _config(args)
    summary = launch(
        cfg, nnodes=args.nnodes, node_rank=args.node_rank, rdzv_endpoint=args.rdzv_endpoint,
        resume=args.resume, max_restarts=args.max_restarts,
    )  # fmt: skip
    if summary:
        sent = (
            f"{summary['bytes_sent_per_rank'] / 1e6:.2f} MB sent by rank 0 "
            f"({summary['bytes_sent_per_step']:,.0f} bytes a step)"
            if summary["bytes_sent_per_rank"] is not None
            else f"PyTorch's {cfg.baseline} averaging (bytes not counted outside the testbed)"
        )
        score = (
            f"validation {summary['bits_per_char']:.3f} bits/char"
            if "bits_per_char" in summary
            else f"test accuracy {100 * summary['accuracy']:.2f}%"
        )
        print(
            f"{score} after {cfg.steps} steps; {sent}; "
            f"{summary['seconds']:.0f} s; outputs in {cfg.out}/ (metrics.jsonl, summary.json, "
            "checkpoint-*.pt, curves.png)"
        )
    return 0


def reproduce(args: argparse.Namespace) -> int:
    from terngrad.train import experiments

    if args.experiment == "orq":
        _only_for(args, "orq", _ORQ_FLAGS)
        return reproduce_orq(args)
    if args.experiment == "transformer":
        _only_for(args, "transformer", _TRANSFORMER_FLAGS)
        return reproduce_transformer(args)
    _only_for(args, args.experiment, {})
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


#: the options of ``reproduce orq`` alone, and their attribute names
_ORQ_FLAGS = {
    "--model": "model", "--dataset": "dataset", "--seeds": "seeds", "--methods": "methods",
    "--variants": "variants", "--warmup-steps": "warmup_steps", "--eval-every": "eval_every",
    "--no-algorithm2": "no_algorithm2",
}  # fmt: skip
#: the options of ``reproduce transformer``
_TRANSFORMER_FLAGS = {
    "--seeds": "seeds", "--methods": "methods", "--eval-every": "eval_every",
    "--full-precision-steps": "full_precision_steps",
}  # fmt: skip
#: the data set each model is compared on
_ORQ_DATASETS = {"lenet": "mnist", "cifarnet": "fashion"}


def _only_for(args: argparse.Namespace, experiment: str, allowed: dict[str, str]) -> None:
    """Refuse the options of another experiment than ``experiment``."""
    flags = {**_ORQ_FLAGS, **_TRANSFORMER_FLAGS}
    given = [f for f, name in flags.items() if f not in allowed and getattr(args, name) is not None]
    if given:
        owners = [e for e, own in (("orq", _ORQ_FLAGS), ("transformer", _TRANSFORMER_FLAGS))
                  if all(f in own for f in given)]  # fmt: skip
        where = (
            f"only for terngrad reproduce {' or '.join(owners)}"
            if owners
            else ("not for this experiment")
        )
        raise ValueError(f"{', '.join(given)}: {where}, not {experiment}")


def reproduce_transformer(args: argparse.Namespace) -> int:
    from pathlib import Path

    from terngrad.train import transformer as tf

    if args.workers and len(args.workers) != 1:
        raise ValueError("terngrad reproduce transformer runs one worker count: give --workers N")
    out = args.out or "runs/reproduce-transformer"
    steps = args.steps or 1000
    base = tf.protocol(out, args.data_dir, args.workers[0] if args.workers else 4, steps,
                       args.eval_every)  # fmt: skip
    runs = tf.plan(base, tuple(args.methods or tf.METHODS), args.seeds or 1,
                   args.full_precision_steps)  # fmt: skip
    print(
        f"terngrad reproduce transformer: {len(runs)} runs of {steps} steps, {base.model} on "
        f"{base.dataset}, {base.workers} workers, into {out}/",
        flush=True,
    )
    tf.run_all(runs, Path(out))
    print((Path(out) / "results.md").read_text())
    print(f"Written: {out}/results.json, {out}/results.md, {out}/curves.png, {out}/tradeoff.png")
    return 0


def reproduce_orq(args: argparse.Namespace) -> int:
    from pathlib import Path

    from terngrad.train import optimal_quantization as oq

    model = args.model or "lenet"
    dataset = args.dataset or _ORQ_DATASETS.get(model, "synthetic")
    if args.workers and len(args.workers) != 1:
        raise ValueError("terngrad reproduce orq runs one worker count: give --workers N")
    out = args.out or f"runs/reproduce-orq-{model}"
    steps = args.steps or (1000 if model == "cifarnet" else 600)
    base = oq.protocol(
        out, model, dataset, args.data_dir, args.workers[0] if args.workers else 4, steps,
        args.eval_every,
    )  # fmt: skip
    runs = oq.plan(
        base, tuple(args.methods or oq.METHODS), tuple(args.variants or oq.VARIANTS),
        args.seeds or 3, args.warmup_steps, algorithm2=not args.no_algorithm2,
    )  # fmt: skip
    print(
        f"terngrad reproduce orq: {len(runs)} runs of {steps} steps, {model} on {dataset}, "
        f"{base.workers} workers, into {out}/",
        flush=True,
    )
    oq.run_all(runs, Path(out))
    print((Path(out) / "results.md").read_text())
    print(f"Written: {out}/results.json, {out}/results.md, {out}/curves-*.png")
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


def _number(kind: type, minimum: float, strict: bool, what: str, below: float = math.inf):
    """An argparse type: a finite ``kind`` (int or float) at least (or, if ``strict``, above)
    ``minimum`` and under ``below``."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if not (math.isfinite(value) and value >= minimum and value < below) or (
            strict and value == minimum
        ):
            raise argparse.ArgumentTypeError(f"expected {what}, got {value}")
        return value

    return parse


_positive_int = _number(int, 1, False, "a positive integer")
_non_negative_int = _number(int, 0, False, "an integer >= 0")
_positive_float = _number(float, 0.0, True, "a positive finite number")
_non_negative_float = _number(float, 0.0, False, "a finite number >= 0")
_fraction = _number(float, 0.0, False, "a number from 0 up to (not including) 1", below=1.0)


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (what was wrong, and where the help is)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def add_exchange_arguments(p: argparse.ArgumentParser) -> None:
    """The "exchange" option group: every field of :class:`~terngrad.comm.Options`, each under
    its own name (``--quantize-last`` is ``quantize_last``); :func:`exchange_options` reads it."""
    from terngrad.comm import AGGREGATES, MIN_NUMEL, POLICIES, TOPOLOGIES
    from terngrad.comm.options import PRESETS
    from terngrad.kernels import KERNELS
    from terngrad.train.trainer import DEFAULT_TIMEOUT

    g = p.add_argument_group("exchange")
    g.add_argument(
        "--preset", choices=tuple(PRESETS),
        help="start from a documented setting (transformer: see docs/distributed.md); the "
        "flags below are put over it",
    )  # fmt: skip
    g.add_argument("--quantizer", help=f"one of {', '.join(quantize.names())} (terngrad)")
    g.add_argument("--topology", help=f"one of {', '.join(TOPOLOGIES)} (sharded)")
    g.add_argument(
        "--kernels",
        help=f"encode/decode kernels, one of {', '.join(KERNELS)} (fused numba/triton, the "
        "torch reference, or auto; default auto)",
    )  # fmt: skip
    g.add_argument(
        "--policy",
        help=f"one of {', '.join(POLICIES)} (quantize); auto: quantize only the DDP buckets "
        "where it is predicted to be faster",
    )  # fmt: skip
    g.add_argument("--clip", type=_positive_float, help="clip at CLIP sigma (TernGrad: 2.5)")
    g.add_argument("--no-clip", action="store_true", help="no clipping")
    g.add_argument("--bucket-size", type=_positive_int, help="elements per scale")
    g.add_argument("--levels", type=_positive_int, help="qsgd/linear/orq: distinct values")
    g.add_argument("--packing", help="TernGrad's wire packing: base3 or 2bit")
    g.add_argument("--error-feedback", action="store_true", help="worker-side error feedback")
    g.add_argument(
        "--quantize-last", action="store_true",
        help="quantize the last layer too (default: full precision)",
    )  # fmt: skip
    g.add_argument(
        "--min-numel", type=_non_negative_int,
        help=f"tensors with fewer elements stay full precision ({MIN_NUMEL})",
    )  # fmt: skip
    g.add_argument(
        "--full-precision-steps", type=_non_negative_int, metavar="K",
        help="average in full precision for the first K steps, then quantize (0)",
    )  # fmt: skip
    g.add_argument(
        "--aggregate",
        help=f"how aggregates off the shared grid travel: {', '.join(AGGREGATES)} (requantize; "
        "coherent: levels agreed by all ranks, the ORQ paper's Algorithm 2 option a)",
    )  # fmt: skip
    g.add_argument("--seed", type=int, default=0, help="seed of every random draw (0)")
    g.add_argument(
        "--timeout", type=_positive_float, default=DEFAULT_TIMEOUT,
        help=f"seconds a collective may wait for a dead or stuck rank ({DEFAULT_TIMEOUT:g})",
    )  # fmt: skip


def default_dataset(model: str) -> str:
    """The data set a model trains on unless told: pydoc for a language model, else MNIST."""
    from terngrad.train import models

    return "pydoc" if models.is_language_model(model) else "mnist"


def _dataset(args: argparse.Namespace) -> str:
    return args.dataset or default_dataset(args.model)


def _add_model_arguments(p: argparse.ArgumentParser) -> None:
    from terngrad.train import data, models

    g = p.add_argument_group("model and data")
    g.add_argument("--model", default="lenet", choices=models.names())
    g.add_argument("--dataset", choices=data.names(), help="(mnist; gpt: pydoc)")
    g.add_argument("--data-dir", help="folder of the data set's files (CIFAR-10: required)")
    g.add_argument(
        "--dropout", type=_fraction, help="dropout ratio of the model's dropout layers, [0, 1)"
    )
    g = p.add_argument_group("workers")
    g.add_argument("--workers", type=_positive_int, default=4, help="processes (total)")


def _add_optimisation_arguments(p: argparse.ArgumentParser, eval_every: int = 500) -> None:
    from terngrad.train.trainer import OPTIMIZERS, SCHEDULES

    g = p.add_argument_group("optimisation")
    g.add_argument("--optimizer", default="momentum", choices=OPTIMIZERS)
    g.add_argument("--lr", type=_positive_float, default=0.01)
    g.add_argument("--momentum", type=_fraction, default=0.9, help="[0, 1) (0.9)")
    g.add_argument("--weight-decay", type=_non_negative_float, default=0.0)
    g.add_argument("--lr-schedule", default="constant", choices=SCHEDULES)
    g.add_argument("--lr-power", type=_positive_float, default=0.5, help="poly schedule power")
    warm = g.add_mutually_exclusive_group()
    warm.add_argument(
        "--warmup-steps", type=_non_negative_int, default=0,
        help="linear warm-up from lr/10 over the first N steps",
    )  # fmt: skip
    warm.add_argument(
        "--warmup-epochs", type=_non_negative_float, default=0.0,
        help="the same warm-up, in epochs of the training set (the ORQ paper: 5)",
    )  # fmt: skip
    g.add_argument("--batch-size", type=_positive_int, help="per worker (default 64)")
    g.add_argument("--total-batch-size", type=_positive_int, help="split over the workers")
    g.add_argument("--steps", type=_positive_int, default=1000)
    g.add_argument("--eval-every", type=_positive_int, default=eval_every)


def _add_train_arguments(p: argparse.ArgumentParser) -> None:
    _add_model_arguments(p)
    add_exchange_arguments(p)
    from terngrad.train.baselines import BASELINES

    p.add_argument_group("baseline").add_argument(
        "--baseline", choices=BASELINES,
        help="PyTorch's own averaging instead of terngrad's hook: DDP's fp32 all-reduce, "
        "fp16_compress_hook, or powerSGD_hook (rank 2, one bucket); the exchange flags but "
        "--seed and --timeout are then unused",
    )  # fmt: skip
    _add_optimisation_arguments(p)
    g = p.add_argument_group("output and cluster")
    g.add_argument("--out", required=True, help="output folder (resumes from its checkpoint)")
    g.add_argument("--resume", help="start from this checkpoint file (default: --out's newest)")
    g.add_argument("--quiet", action="store_true", help="no progress line")
    g = p.add_argument_group("reliability")
    g.add_argument(
        "--checkpoint-every",
        type=_positive_int,
        help="steps between checkpoints (default: --eval-every)",
    )
    g.add_argument(
        "--keep-checkpoints", type=_positive_int, default=3, help="newest checkpoints kept (3)"
    )
    g.add_argument(
        "--max-skipped-steps",
        type=_positive_int,
        default=10,
        help="consecutive NaN/Inf steps before training stops (10)",
    )
    g.add_argument(
        "--check-replicas-every",
        type=_non_negative_int,
        default=100,
        help="steps between replica checksum checks, 0 never (100)",
    )
    g.add_argument(
        "--max-restarts",
        type=_non_negative_int,
        default=0,
        help="torchrun: restarts of failed workers, which resume (0)",
    )
    g.add_argument("--nnodes", type=_positive_int, default=1, help="machines (torchrun)")
    g.add_argument("--node-rank", type=_non_negative_int, help="this machine's rank (torchrun)")
    g.add_argument("--rdzv-endpoint", help="HOST:PORT of the rendezvous (torchrun)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
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

    p = sub.add_parser(
        "reproduce",
        help="the papers' experiments: lenet, cifar, fashion (TernGrad); orq (ORQ/BinGrad); "
        "transformer (TernGrad on a GPT with AdamW)",
    )
    p.add_argument("experiment", choices=("lenet", "cifar", "fashion", "orq", "transformer"))
    p.add_argument("--steps", type=_positive_int, help="shorten (or lengthen) every run")
    p.add_argument("--workers", type=_positive_int, nargs="+", help="worker counts to run")
    p.add_argument("--data-dir", help="the data set's folder (CIFAR-10: required)")
    p.add_argument("--out", help="output folder (runs/reproduce-EXPERIMENT)")
    from terngrad.train import data, models
    from terngrad.train.optimal_quantization import METHODS, VARIANTS

    g = p.add_argument_group("orq only (the optimal-quantization paper's comparison)")
    g.add_argument("--model", choices=models.names(), help="lenet (default) or cifarnet, ...")
    g.add_argument("--dataset", choices=data.names(), help="lenet: mnist, cifarnet: fashion")
    g.add_argument("--seeds", type=_positive_int, help="seeds of the main methods (3)")
    g.add_argument("--methods", nargs="+", metavar="METHOD",
                   help=f"a subset (all): {', '.join(METHODS)}")  # fmt: skip
    g.add_argument("--variants", nargs="+", choices=VARIANTS, help="noclip, clip (both)")
    g.add_argument(
        "--warmup-steps", type=_non_negative_int,
        help="warm-up of the clip variant, from lr/10 (default: a tenth of --steps)",
    )  # fmt: skip
    g.add_argument("--eval-every", type=_positive_int, help="(a tenth of --steps)")
    g.add_argument(
        "--no-algorithm2", action="store_const", const=True,
        help="skip the parameter-server rows (ORQ-5, BinGrad-b with both broadcasts)",
    )  # fmt: skip
    from terngrad.train.transformer import METHODS as TRANSFORMER_METHODS

    g = p.add_argument_group(
        "transformer (also --seeds: 1, --methods, --eval-every)",
        f"methods: {', '.join(TRANSFORMER_METHODS)}",
    )
    g.add_argument(
        "--full-precision-steps", type=_positive_int, metavar="K",
        help="the full-precision steps of terngrad-fp and terngrad-b512-fp before TernGrad (a "
        "fifth of --steps)",
    )  # fmt: skip
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
        "--sizes", type=_positive_int, nargs="+", default=[1_000_000, 25_000_000],
        help="tensor sizes (1000000 25000000)",
    )  # fmt: skip
    b.add_argument("--repeats", type=_positive_int, default=5, help="timed calls (median)")
    b.add_argument("--workers", type=_positive_int, default=4, help="N for the owner's sum")
    b.add_argument(
        "--kernels", nargs="+", choices=("numba", "torch"), default=["numba", "torch"],
        help="kernel backends to time (numba: fused; torch: the reference)",
    )  # fmt: skip
    b.add_argument(
        "--quantizers", nargs="*", default=quantize.names(), metavar="NAME",
        help="quantizers whose public encode/decode are timed (all; none: give the flag alone)",
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
    b.add_argument(
        "--input-shape", type=_positive_int, nargs=3, metavar=("C", "H", "W"),
        help="the synthetic images' shape (the model's own: 3 224 224 for alexnet, 3 32 32 for "
        "cifarnet; Fashion-MNIST's is 1 28 28)",
    )  # fmt: skip
    b.add_argument("--steps", type=_positive_int, default=5, help="timed steps per method")
    b.add_argument("--warmup", type=_positive_int, default=3, help="untimed steps first")
    b.add_argument("--timeout", type=_positive_float, default=1800.0, help="seconds for it all")
    b.add_argument("--out", default="runs/network", help="folder for results.json, speedup.png")
    b.add_argument("--cleanup", action="store_true", help="remove a killed run's namespaces")
    b.set_defaults(func=bench_network)

    from terngrad.bench.accuracy import DEFAULT_METHODS as ACCURACY_METHODS
    from terngrad.comm import MIN_NUMEL

    b = bench.add_parser(
        "accuracy",
        help="time to a target accuracy on a bandwidth-limited cluster, every method in turn",
    )
    _add_model_arguments(b)
    _add_optimisation_arguments(b, eval_every=100)
    g = b.add_argument_group("comparison")
    g.add_argument(
        "--bandwidth", default="100mbit",
        help=f"link rate: {', '.join(BANDWIDTHS)} or any NNmbit/NNgbit (100mbit)",
    )  # fmt: skip
    g.add_argument(
        "--methods", nargs="+", default=list(ACCURACY_METHODS), metavar="METHOD",
        help=f"in this order ({' '.join(ACCURACY_METHODS)}); any of: {', '.join(METHODS)}",
    )  # fmt: skip
    g.add_argument("--target", type=float, required=True, help="test accuracy to reach, in percent")
    g.add_argument(
        "--quantize-last", action="store_true", help="terngrad's methods: the last layer too"
    )
    g.add_argument(
        "--min-numel", type=_non_negative_int, default=MIN_NUMEL,
        help=f"terngrad's methods: smaller tensors stay fp32 ({MIN_NUMEL})",
    )  # fmt: skip
    g.add_argument("--seed", type=int, default=0, help="seed of the run (0)")
    g.add_argument(
        "--predict-with", nargs=2, metavar=("UNSHAPED", "SHAPED"),
        help="results.json of terngrad bench network runs (--bandwidth unlimited, and this "
        "bandwidth; same model, ranks, --batch-size): the model's time to target beside the "
        "measurement",
    )  # fmt: skip
    g.add_argument(
        "--timeout", type=_positive_float, default=3600.0, help="seconds per method (3600)"
    )
    g.add_argument("--out", default="runs/accuracy", help="output folder (runs/accuracy)")
    g.add_argument(
        "--report-only", action="store_true",
        help="train nothing: write the report of the methods already trained in --out again "
        "(another --target, say; no root needed)",
    )  # fmt: skip
    b.set_defaults(func=bench_accuracy)

    from terngrad.bench.model import METHODS as MODELLED
    from terngrad.bench.model import NETWORKS
    from terngrad.bench.study import METHODS as STUDIED
    from terngrad.train import data

    p = sub.add_parser("study", help="every quantizer on a model's real gradients: a report")
    p.add_argument("--model", choices=models.names(), help="(lenet; with --from-checkpoint: its)")
    p.add_argument(
        "--dataset", choices=data.names(), help="(mnist, gpt: pydoc; with --from-checkpoint: its)"
    )
    p.add_argument("--data-dir", help="the data set's folder (CIFAR-10: required)")
    p.add_argument("--from-checkpoint", help="start from a terngrad train checkpoint file")
    p.add_argument("--steps", type=_non_negative_int, default=200, help="training steps (200)")
    p.add_argument(
        "--capture-at",
        type=_non_negative_int,
        nargs="+",
        help="steps whose gradients are studied (five from 0 to --steps)",
    )
    p.add_argument(
        "--methods",
        nargs="+",
        default=list(STUDIED),
        metavar="METHOD",
        help=f"quantizers to compare (all): {', '.join(STUDIED)}",
    )
    p.add_argument(
        "--draws",
        type=_number(int, 2, False, "an integer >= 2"),
        default=16,
        help="random draws per stochastic quantizer (16)",
    )
    p.add_argument("--batch-size", type=_positive_int, default=64)
    p.add_argument(
        "--lr", type=_positive_float,
        help="learning rate of SGD with momentum 0.9 (0.01); with --from-checkpoint the run's "
        "own optimizer goes on from its saved state and learning rate, unless --lr is given",
    )  # fmt: skip
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="runs/study", help="folder of the report (runs/study)")
    p.set_defaults(func=study)

    p = sub.add_parser("model", help="the performance model: validate it, extrapolate with it")
    model = p.add_subparsers(dest="model", required=True)
    b = model.add_parser("validate", help="calibrate on an unshaped run, predict shaped runs")
    b.add_argument("--calibrate", required=True, help="results.json of a --bandwidth unlimited run")
    b.add_argument("--runs", nargs="+", required=True, help="results.json of shaped runs")
    b.add_argument("--out", help="folder for validation.json and validation.md")
    b.set_defaults(func=model_validate)
    b = model.add_parser("scale", help="images/s against workers (the paper's Figure 5)")
    b.add_argument(
        "--models", nargs="+", default=["alexnet", "googlenet", "vgg-a"], choices=models.names()
    )
    b.add_argument(
        "--workers", nargs="+", type=_positive_int, default=[8, 16, 32, 64, 128, 256, 512]
    )
    b.add_argument("--networks", nargs="+", default=list(NETWORKS), choices=list(NETWORKS))
    b.add_argument(
        "--methods", nargs="+", default=["fp32", "fp16", "terngrad"], choices=list(MODELLED)
    )
    b.add_argument(
        "--gpu-tflops",
        type=_positive_float,
        default=10.0,
        help="sustained training FLOP/s of one worker, in TFLOP/s (10)",
    )
    b.add_argument("--batch-size", type=_positive_int, default=64, help="per worker (64)")
    b.add_argument(
        "--codec-rate",
        type=_positive_float,
        default=1e11,
        help="elements/s the worker's fused codec encodes+decodes (1e11)",
    )
    b.add_argument("--out", default="runs/scaling", help="folder for scaling.json, scaling.png")
    b.set_defaults(func=model_scale)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
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
        if "Timed out" in last and "another rank" not in last:  # the trainer's own collectives
            last = f"another rank has died or is stuck; a collective waited --timeout ({last})"
        parser.exit(1, f"terngrad: a worker failed: {last}\n")
    except torch.multiprocessing.ProcessExitedException as exc:  # killed, or crashed hard
        parser.exit(
            1,
            f"terngrad: a worker died ({exc}); the others were stopped. Run the same command "
            "again to resume from the newest checkpoint\n",
        )


if __name__ == "__main__":
    sys.exit(main())
