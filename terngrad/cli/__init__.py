"""The ``terngrad`` command line, a module per command group:

* ``terngrad demo`` / ``terngrad train`` (:mod:`terngrad.cli.train`) — LeNet on MNIST, fp32
  against TernGrad; one training run with N workers, its flags made from the configs;
* ``terngrad reproduce lenet|cifar|fashion|orq|transformer`` (:mod:`terngrad.cli.reproduce`) —
  the papers' experiments;
* ``terngrad bench quantizers|codec|network|accuracy`` (:mod:`terngrad.cli.bench`);
* ``terngrad perf-model validate|scale`` (:mod:`terngrad.cli.perf_model`) — the performance
  model against the testbed, and extrapolated to many workers;
* ``terngrad study`` (:mod:`terngrad.cli.study`) — every quantizer on a model's real gradients.

Bad arguments print one line and exit with status 2; a failed worker exits with status 1; a
signal stops every worker and exits with 128 + its number (130 for Ctrl-C, 143 for SIGTERM).
"""

from __future__ import annotations

import re
import sys
import warnings

import torch

from terngrad import __version__
from terngrad.cli import bench, perf_model, reproduce, study, train
from terngrad.cli.flags import Parser, deprecated


def build_parser() -> Parser:
    parser = Parser(
        prog="terngrad",
        description="Communication-efficient data-parallel training with quantized gradients.",
    )
    parser.add_argument("--version", action="version", version=f"terngrad {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for group in (train, reproduce, bench, study, perf_model):
        group.add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    from terngrad.bench.testbed import BenchFailed, TestbedUnavailable
    from terngrad.train.launch import Stopped
    from terngrad.train.missing import DataMissing

    try:
        with warnings.catch_warnings():
            warnings.showwarning = _one_line  # an old name still works, said in one line
            return args.func(args)
    except (ValueError, DataMissing) as exc:  # what the user asked for: one line, status 2
        parser.exit(2, f"terngrad: error: {exc}\n")
    except (TestbedUnavailable, BenchFailed) as exc:  # the machine could not: status 1
        parser.exit(1, f"terngrad: {exc}\n")
    except KeyboardInterrupt as exc:  # Ctrl-C: what was being built is already torn down
        parser.exit(130, f"terngrad: interrupted{f' ({exc})' if str(exc) else ''}\n")
    except Stopped as exc:  # SIGTERM or SIGHUP: the workers are gone, the folder is free
        parser.exit(
            128 + exc.signum,
            f"terngrad: stopped by {exc}; every worker was stopped. Run the same command "
            "again to resume from the newest checkpoint\n",
        )
    except torch.multiprocessing.ProcessRaisedException as exc:
        last = re.sub(r"^terngrad(\.\w+)+: ", "", str(exc).strip().splitlines()[-1])
        if "Timed out" in last and "another rank" not in last:  # the trainer's own collectives
            last = f"another rank has died or is stuck; a collective waited --timeout ({last})"
        parser.exit(1, f"terngrad: a worker failed: {last}\n")
    except torch.multiprocessing.ProcessExitedException as exc:  # killed, or crashed hard
        parser.exit(
            1,
            f"terngrad: a worker died ({exc}); the others were stopped. Run the same command "
            "again to resume from the newest checkpoint\n",
        )


def _one_line(message, category, filename, lineno, file=None, line=None) -> None:
    """A library's ``FutureWarning`` (an older name that still works) as the command line says
    it: one line on stderr; other warnings as Python shows them."""
    if issubclass(category, FutureWarning):
        deprecated(str(message))
    else:
        sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


__all__ = ["build_parser", "main"]
