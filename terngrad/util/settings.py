"""Settings that carry their own help and range: a dataclass field made with :func:`setting`
holds its default, a line of help, the group it belongs to and the numbers it accepts, so a
config checks itself (:func:`check_settings`) and the command line builds its flags from the
same fields (:mod:`terngrad.cli.flags`): a default or a range is written once.

>>> @dataclass(frozen=True)
... class Run:
...     lr: float = setting(0.01, "learning rate", "optimisation", POSITIVE)
...     def __post_init__(self):
...         check_settings(self)
>>> Run(lr=-1)
Traceback (most recent call last):
ValueError: lr must be a positive finite number, got -1
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import MISSING, dataclass
from typing import Any


@dataclass(frozen=True)
class Range:
    """The numbers a setting accepts: of ``kind`` (``int``: no bools, no floats; ``float``:
    any finite int or float; another: a parser of the command line's text, whose values
    ``test`` alone judges) for which ``test`` holds, described by ``words``."""

    kind: Callable[[str], Any]
    test: Callable[[Any], bool]
    words: str

    def accepts(self, value: Any) -> bool:
        if isinstance(value, bool):
            return False
        if self.kind not in (int, float):  # a kind of its own: ``test`` says it all
            return self.test(value)
        if self.kind is int:
            return isinstance(value, int) and self.test(value)
        return isinstance(value, int | float) and math.isfinite(value) and self.test(value)


#: counts (steps, workers, sizes) are int64 wherever torch keeps them
POSITIVE_INT = Range(int, lambda v: 1 <= v < 2**63, "a positive integer below 2**63")
NON_NEGATIVE_INT = Range(int, lambda v: 0 <= v < 2**63, "an integer >= 0, below 2**63")
INT64 = Range(int, lambda v: -(2**63) <= v < 2**63, "an integer from -2**63 to 2**63 - 1")
POSITIVE = Range(float, lambda v: v > 0, "a positive finite number")
NON_NEGATIVE = Range(float, lambda v: v >= 0, "a finite number >= 0")
FRACTION = Range(float, lambda v: 0 <= v < 1, "a number from 0 up to (not including) 1")
SHARE = Range(float, lambda v: 0 < v < 1, "a share in (0, 1)")


def int_or_auto(text: str) -> int | str:
    """The command line's ``auto`` or an integer."""
    return text if text == "auto" else int(text)


POSITIVE_INT_OR_AUTO = Range(
    int_or_auto,
    lambda v: v == "auto" or (isinstance(v, int) and not isinstance(v, bool) and 1 <= v < 2**63),
    "a positive integer below 2**63, or auto",
)


@dataclass(frozen=True)
class Setting:
    """What a field says about itself (its ``metadata["setting"]``)."""

    help: str
    group: str
    range: Range | None = None
    #: the valid names, where there is a fixed list (a function: the list may be registered
    #: later, as models and quantizers are)
    choices: Callable[[], Sequence[str]] | None = None
    #: ``None`` is a valid value (a "not set" that the config resolves)
    optional: bool = False
    #: the command line's flag, if not ``--<name with dashes>``; "" for no flag
    flag: str | None = None
    metavar: str | None = None
    #: the default in words, where the config works it out from other settings (``None``)
    default_words: str | None = None
    #: how a method's name writes it (:mod:`terngrad.comm.spec.tokens`), where it does
    named: Any = None


def setting(
    default: Any = MISSING,
    help: str = "",
    group: str = "",
    range: Range | None = None,
    *,
    choices: Callable[[], Sequence[str]] | None = None,
    optional: bool | None = None,
    flag: str | None = None,
    metavar: str | None = None,
    default_words: str | None = None,
    named: Any = None,
    default_factory: Callable[[], Any] | Any = MISSING,
    hash: bool | None = None,
) -> Any:
    """A dataclass field with its :class:`Setting`; ``optional`` defaults to whether the
    default is ``None``."""
    meta = Setting(
        help=help,
        group=group,
        range=range,
        choices=choices,
        optional=(default is None) if optional is None else optional,
        flag=flag,
        metavar=metavar,
        default_words=default_words,
        named=named,
    )
    return dataclasses.field(
        default=default, default_factory=default_factory, hash=hash, metadata={"setting": meta}
    )


def settings_of(cls_or_obj: Any) -> list[tuple[dataclasses.Field, Setting]]:
    """The fields of a dataclass that were made with :func:`setting`, in order."""
    return [
        (f, f.metadata["setting"])
        for f in dataclasses.fields(cls_or_obj)
        if "setting" in f.metadata
    ]


def flag_name(f: dataclasses.Field, s: Setting) -> str:
    """The command line's name of a setting: ``--weight-decay`` for ``weight_decay``."""
    return s.flag if s.flag is not None else "--" + f.name.replace("_", "-")


def check_settings(obj: Any) -> None:
    """``ValueError`` with one line for the first setting of ``obj`` outside its range or its
    choices: ``lr must be a positive finite number, got -1``."""
    for f, s in settings_of(obj):
        value = getattr(obj, f.name)
        if value is None and s.optional:
            continue
        name = f.name.replace("_", "-")
        if s.range is not None and not s.range.accepts(value):
            also = ", or None" if s.optional else ""
            raise ValueError(f"{name} must be {s.range.words}{also}, got {value!r}")
        if s.choices is not None and value not in s.choices():
            raise ValueError(
                f"unknown {name.replace('-', ' ')} {value!r}; choose one of: "
                + ", ".join(s.choices())
            )
