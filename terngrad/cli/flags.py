"""Command-line flags made from the configs' settings (:mod:`terngrad.util.settings`): a flag's
name, help, default and range come from its field of :class:`~terngrad.train.config.TrainConfig`
or :class:`~terngrad.comm.Options`, so they are written once, in the config. Every command that
takes a training setting (``--steps``, ``--workers``, ``--batch-size``, ``--model``, ...) makes
its flag here (:func:`add_settings`), with its own default where it differs.

A generated flag's value is ``None`` when it is not given: the config's default stands
(:func:`given`). A range is checked while parsing, with the flag's name in the message, and
again by the config for Python callers — by the same :class:`~terngrad.util.settings.Range`.

One name, one meaning, in every command (``tests/unit/cli/test_flag_meanings.py``):

* ``--workers N``: one number of processes (of each run). A list of worker counts is
  ``--worker-counts`` (``reproduce lenet|cifar|fashion``: a run per count; ``perf-model scale``:
  the cluster sizes extrapolated to); ``bench codec``'s exchange, simulated in one process, is
  ``--simulated-workers``. The old spellings still work, with a warning: ``--workers 2 4``
  (:class:`OneValue`), ``perf-model scale --workers``, ``bench codec --workers``
  (:class:`Deprecated`).
* One value where the flag names one thing, another name for a list: ``--bandwidth RATE`` and
  ``bench accuracy --bandwidths`` (a sweep), ``--kernels NAME`` and ``bench codec
  --kernel-backends`` (the backends timed); ``--bandwidth A B`` and ``--kernels A B`` still work,
  with a warning.
* ``--timeout``: the seconds a collective may wait for a dead or stuck rank (``TrainConfig``'s
  ``timeout``). A run's wall-clock limit is ``--time-limit``. ``bench network|accuracy
  --timeout``, once an older spelling of ``--time-limit``, is refused with one line naming
  ``--time-limit`` (:class:`Retired`): mapping it to ``--time-limit`` would keep its second
  meaning, and mapping it to the collective timeout would quietly turn an old command's limit
  on the whole run into a wait on each collective, the run left at the default limit; refused,
  an old script stops at once and says what to write.
* ``--steps``: training steps (``bench network|overhead``: the timed ones; the untimed steps
  before them are ``--untimed-steps``, once ``--warmup``, which is not ``--warmup-steps``, the
  learning rate's warm-up). ``study --steps`` alone takes 0 (the gradients of the model as it
  is).
* ``--seed``: the first seed; ``--seeds``: how many (``--seed``, ``--seed`` + 1, ...).
* ``--model``/``--models``, ``--methods``: one name/a list of names; ``--out``: a folder.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Collection, Mapping
from dataclasses import MISSING, dataclass
from typing import Any

from terngrad.util.settings import Range, Setting, flag_name, settings_of


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (what was wrong, and where the help is), and a
    :class:`OneValue` flag is shown taking one value."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class _Formatter(argparse.HelpFormatter):
    def _format_args(self, action, default_metavar) -> str:
        if isinstance(action, OneValue):  # several values: its older spelling
            return self._metavar_formatter(action, default_metavar)(1)[0]
        return super()._format_args(action, default_metavar)


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


positive_int = number(int, 1, False, "a positive integer below 2**63", 2**63)
non_negative_int = number(int, 0, False, "an integer >= 0, below 2**63", 2**63)
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


@dataclass(frozen=True)
class Described:
    """A command's default that it works out itself (the flag's value is ``None`` when left
    out), in words for the help: ``Described("a tenth of --steps")``."""

    words: str


def add_settings(
    parser: argparse.ArgumentParser,
    config: type,
    *,
    only: Collection[str] | None = None,
    exclude: Collection[str] = (),
    defaults: Mapping[str, Any] | None = None,
    groups: dict[str, Any] | None = None,
    actions: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """A flag for every setting of the dataclass ``config`` (those in ``only`` if given, none
    of ``exclude``), in an option group per setting group; ``defaults`` replaces a field's
    default in this command (a value, or :class:`Described`; :func:`given` passes a value to
    the config); ``actions`` adds argparse options to a flag (an older spelling's action).
    Returns the groups by name, so a command can add its own flags to them."""
    groups = {} if groups is None else groups
    shown = dict(defaults or {})
    for f, s in settings_of(config):
        if s.flag == "" or f.name in exclude or (only is not None and f.name not in only):
            continue
        if s.group not in groups:
            groups[s.group] = parser.add_argument_group(s.group)
        default = shown.get(f.name, f.default)
        value = None if isinstance(default, Described) else shown.get(f.name)
        switch = f.type in (bool, "bool")
        text = s.help if switch else " ".join(filter(None, (s.help, _default_text(default, s))))
        options: dict[str, Any] = {"dest": f.name, "default": value, "help": text}
        if switch:
            options.update(action="store_const", const=not default)
        else:
            if s.range is not None:
                options["type"] = in_range(s.range)
            if s.choices is not None:
                options["choices"] = list(s.choices())
            if s.metavar:
                options["metavar"] = s.metavar
        options.update((actions or {}).get(f.name, {}))
        groups[s.group].add_argument(flag_name(f, s), **options)
    return groups


def _default_text(default: Any, s: Setting) -> str:
    if isinstance(default, Described):
        return f"(default: {default.words})"
    if default is MISSING or default is None:
        return f"(default: {s.default_words})" if s.default_words else ""
    return f"(default {default})"


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


def spelling(*configs: type) -> Callable[[str], str]:
    """A setting's name as the command line writes it (``local_steps``: ``--local-steps``),
    a field of ``configs`` by its flag, any other name (a quantizer's option) by its dashes."""
    flags = {f.name: flag_name(f, s) for c in configs for f, s in settings_of(c)}
    return lambda name: flags.get(name) or "--" + name.replace("_", "-")


class Deprecated(argparse.Action):
    """An old spelling of a flag: it still works, with a warning naming the new one."""

    def __init__(self, option_strings, dest, new: str, **kwargs) -> None:
        self.new = new
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        deprecated(f"{option_string} is deprecated: use {self.new}")
        setattr(namespace, self.dest, values)


class OneValue(argparse.Action):
    """A flag of one value whose older spelling took several: one value is stored in ``dest``;
    several still work, with a warning, as the list flag ``new`` (stored in ``new_dest``)."""

    def __init__(self, option_strings, dest, new: str, new_dest: str, **kwargs) -> None:
        self.new, self.new_dest = new, new_dest
        super().__init__(option_strings, dest, nargs="+", **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        if len(values) == 1:
            setattr(namespace, self.dest, values[0])
            return
        shown = " ".join(map(str, values))
        deprecated(f"{option_string} {shown} is deprecated: {option_string} takes one value; "
                   f"use {self.new} {shown}")  # fmt: skip
        setattr(namespace, self.new_dest, values)


class Retired(argparse.Action):
    """A spelling whose old meaning is gone: refused (status 2) with one line, ``message``."""

    def __init__(self, option_strings, dest, message: str, **kwargs) -> None:
        self.message = message
        kwargs.setdefault("help", argparse.SUPPRESS)
        super().__init__(option_strings, argparse.SUPPRESS, nargs="?", **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        parser.error(self.message)


def one_or_list(args: argparse.Namespace, one: str, many: str, default: list) -> list:
    """The values of a pair of flags: ``one`` (a value, :class:`OneValue`) or ``many`` (a
    list); ``default`` when neither is given. ``ValueError`` if both are."""
    value, values = getattr(args, one), getattr(args, many)
    flag = "--" + one.replace("_", "-")
    if value is not None and values is not None:
        raise ValueError(f"give {flag} or {'--' + many.replace('_', '-')}, not both")
    return [value] if value is not None else list(default if values is None else values)


def add_time_limit(group, default: float, what: str) -> None:
    """``--time-limit`` (wall-clock seconds, ``what``); ``--timeout``, its older spelling, is
    refused (:class:`Retired`): ``--timeout`` is the seconds a collective waits."""
    group.add_argument(
        "--time-limit", type=positive_float, default=default,
        help=f"wall-clock seconds {what} ({default:g})",
    )  # fmt: skip
    group.add_argument(
        "--timeout", action=Retired,
        message="--timeout is no longer a benchmark's limit: give its wall-clock limit as "
        "--time-limit SECONDS (--timeout is the seconds a collective waits, terngrad train's)",
    )  # fmt: skip


def add_methods(group, default: Collection[str], choices: Collection[str] | None = None) -> None:
    """``--methods``: names of :data:`terngrad.comm.spec.methods.METHODS` (``default`` in this
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

#: the exchange's options that are a training run's own settings (TrainConfig's flags)
RUN_OWN = ("seed", "timeout", "kernels", "full_precision_steps")
#: the quantizer options that have flags of their own (any quantizer that takes them)
QUANTIZER_FLAGS = ("clip", "bucket_size", "levels", "packing")


def add_exchange_flags(parser: argparse.ArgumentParser, groups: dict[str, Any]) -> None:
    """The "exchange" option group: ``--method``, every field of
    :class:`~terngrad.comm.Options` but the run's own (seed, timeout, kernels, full-precision
    steps: :class:`~terngrad.train.config.TrainConfig`'s flags) (``--quantize-last`` is
    ``quantize_last``) and the quantizer options; :func:`exchange_settings` reads them."""
    from terngrad.comm import Options

    g = groups.setdefault("exchange", parser.add_argument_group("exchange"))
    g.add_argument(
        "--method", metavar="NAME",
        help="train the way of this method (docs/methods.md: its exchange, optimizer recipe, "
        "warm-up and local steps, or PyTorch's baseline; default terngrad); a flag below or of "
        "local steps adds what the method leaves at its default, and one that contradicts it "
        "is refused",
    )  # fmt: skip
    g.add_argument(
        "--preset", dest="method", action=Deprecated, new="--method", help=argparse.SUPPRESS,
    )  # fmt: skip
    add_settings(parser, Options, exclude=RUN_OWN, groups=groups)
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
    return {**given(args, Options, exclude=RUN_OWN), "quantizer_options": q_options}
