"""Command-line flags made from the configs' settings (:mod:`terngrad.util.settings`): a flag's
name, help, default and range come from its field of :class:`~terngrad.train.config.TrainConfig`
or :class:`~terngrad.comm.Options`, so they are written once, in the config.

A generated flag's value is ``None`` when it is not given: the config's default stands
(:func:`given`). A range is checked while parsing, with the flag's name in the message, and
again by the config for Python callers — by the same :class:`~terngrad.util.settings.Range`.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Collection, Mapping
from dataclasses import MISSING
from typing import Any

from terngrad.util.settings import Range, flag_name, settings_of


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (what was wrong, and where the help is)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def number(kind: type, minimum: float, strict: bool, what: str, below: float = math.inf):
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


positive_int = number(int, 1, False, "a positive integer")
non_negative_int = number(int, 0, False, "an integer >= 0")
positive_float = number(float, 0.0, True, "a positive finite number")


def in_range(r: Range):
    """An argparse type that parses ``r.kind`` and accepts what ``r`` accepts."""

    def parse(text: str):
        try:
            value = r.kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {r.words}, got {text!r}") from None
        if not r.accepts(value):
            raise argparse.ArgumentTypeError(f"expected {r.words}, got {value}")
        return value

    return parse


def add_settings(
    parser: argparse.ArgumentParser,
    config: type,
    *,
    only: Collection[str] | None = None,
    exclude: Collection[str] = (),
    defaults: Mapping[str, Any] | None = None,
    groups: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A flag for every setting of the dataclass ``config`` (those in ``only`` if given, none
    of ``exclude``), in an option group per setting group; ``defaults`` replaces a field's
    default in this command (it is passed to the config by :func:`given`). Returns the groups
    by name, so a command can add its own flags to them."""
    groups = {} if groups is None else groups
    shown = dict(defaults or {})
    for f, s in settings_of(config):
        if s.flag == "" or f.name in exclude or (only is not None and f.name not in only):
            continue
        if s.group not in groups:
            groups[s.group] = parser.add_argument_group(s.group)
        default = shown.get(f.name, f.default)
        switch = f.type in (bool, "bool")
        text = s.help if switch else " ".join(filter(None, (s.help, _default_text(default))))
        options: dict[str, Any] = {"dest": f.name, "default": shown.get(f.name), "help": text}
        if switch:
            options.update(action="store_const", const=not default)
        else:
            if s.range is not None:
                options["type"] = in_range(s.range)
            if s.choices is not None:
                options["choices"] = list(s.choices())
            if s.metavar:
                options["metavar"] = s.metavar
        groups[s.group].add_argument(flag_name(f, s), **options)
    return groups


def _default_text(default: Any) -> str:
    return "" if default is MISSING or default is None else f"(default {default})"


def given(args: argparse.Namespace, config: type, exclude: Collection[str] = ()) -> dict:
    """The settings of ``config`` given on the command line (a flag left out is ``None``: the
    config's default stands), by field name."""
    out = {}
    for f, s in settings_of(config):
        if f.name in exclude or s.flag == "":
            continue
        value = getattr(args, f.name, None)
        if value is not None:
            out[f.name] = value
    return out


class Deprecated(argparse.Action):
    """An old spelling of a flag: it still works, with a warning naming the new one."""

    def __init__(self, option_strings, dest, new: str, **kwargs) -> None:
        self.new = new
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        deprecated(f"{option_string} is deprecated: use {self.new}")
        setattr(namespace, self.dest, values)


def add_time_limit(group, default: float, what: str) -> None:
    """``--time-limit`` (seconds, ``what``), and ``--timeout``, its older spelling."""
    group.add_argument(
        "--time-limit", type=positive_float, default=default, help=f"{what} ({default:g})"
    )
    group.add_argument(
        "--timeout", type=positive_float, dest="time_limit", action=Deprecated,
        new="--time-limit", help=argparse.SUPPRESS,
    )  # fmt: skip


def add_methods(group, default: Collection[str], choices: Collection[str] | None = None) -> None:
    """``--methods``: names of :data:`terngrad.comm.methods.METHODS` (``default`` in this
    order; any of ``choices``, by default the defaults), checked by the experiment (one line
    naming the choices)."""
    group.add_argument(
        "--methods", nargs="+", metavar="METHOD", default=list(default),
        help=f"in this order ({' '.join(default)}); any of: {', '.join(choices or default)}",
    )  # fmt: skip


def deprecated(message: str) -> None:
    """Say on stderr, in one line, that an old spelling was used (it still works)."""
    print(f"terngrad: warning: {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- the exchange

#: the quantizer options that have flags of their own (any quantizer that takes them)
QUANTIZER_FLAGS = ("clip", "bucket_size", "levels", "packing")


def add_exchange_flags(parser: argparse.ArgumentParser, groups: dict[str, Any]) -> None:
    """The "exchange" option group: ``--method``, every field of
    :class:`~terngrad.comm.Options` but the run's seed and timeout (``--quantize-last`` is
    ``quantize_last``) and the quantizer options; :func:`exchange_settings` reads them."""
    from terngrad.comm import Options

    g = groups.setdefault("exchange", parser.add_argument_group("exchange"))
    g.add_argument(
        "--method", metavar="NAME",
        help="train the way of this method (docs/methods.md: its exchange, optimizer recipe "
        "and warm-up, or PyTorch's baseline); the flags below are put over it",
    )  # fmt: skip
    g.add_argument(
        "--preset", dest="method", action=Deprecated, new="--method (transformer is "
        "terngrad-b512)", help=argparse.SUPPRESS,
    )  # fmt: skip
    add_settings(parser, Options, exclude=("seed", "timeout"), groups=groups)
    g.add_argument("--clip", type=positive_float, help="clip at CLIP sigma (TernGrad: 2.5)")
    g.add_argument("--no-clip", action="store_true", help="no clipping")
    g.add_argument("--bucket-size", type=positive_int, help="elements per scale")
    g.add_argument("--levels", type=positive_int, help="qsgd/linear/orq: distinct values")
    g.add_argument("--packing", help="TernGrad's wire packing: base3 or 2bit")


def exchange_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The exchange settings given on the command line: fields of
    :class:`~terngrad.comm.Options` by name, the quantizer's options under
    ``quantizer_options`` (a flag left out is not there)."""
    from terngrad.comm import Options

    if args.no_clip and args.clip is not None:
        raise ValueError("give --clip or --no-clip, not both")
    q_options: dict[str, Any] = {"clip": None} if args.no_clip else {}
    for name in QUANTIZER_FLAGS:
        if getattr(args, name) is not None:
            q_options[name] = getattr(args, name)
    return {**given(args, Options, exclude=("seed", "timeout")), "quantizer_options": q_options}
