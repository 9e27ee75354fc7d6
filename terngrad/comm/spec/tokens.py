"""How an exchange setting is written in a method's name: declared with its field of
:class:`~terngrad.comm.spec.options.Options` (``setting(..., named=Switch(...))``), beside its
flag, help and range, and read by the naming rule (:mod:`terngrad.comm.spec.naming`), which
writes the named fields in the order of the fields. A setting at its default is not written.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Switch:
    """An option that is off by default; on, the name holds ``-token`` and the words
    ``words``. ``what``: the setting in a refusal (``error feedback (ef) comes before ...``)."""

    what: str
    token: str
    words: str


@dataclass(frozen=True)
class Number:
    """An integer option, written ``-<prefix><N>`` where it is not its default; ``words(N)``
    says it."""

    what: str
    prefix: str
    words: Callable[[int], str]


@dataclass(frozen=True)
class Choice:
    """An option of a few values, each but the default written as its token (``tokens``:
    value → token); ``words(value)`` says it."""

    what: str
    tokens: Mapping[str, str]
    words: Callable[[str], str]


Token = Switch | Number | Choice
