"""Settings given over a method: the one rule of every consumer that takes ``method=`` and
keywords (the hook, :class:`terngrad.diloco.DiLoCo`, both framework callbacks) or ``--method``
and flags (``terngrad train``).

A setting the method leaves at its default may be given: what runs is the method with it, and
its name says so (``--method terngrad-ef --local-steps 8`` runs ``terngrad-ef-local8``). A
setting the method sets otherwise is refused in one line naming both, and the method that runs
what was asked where there is one: nothing given is dropped, and no part of a named method is
overridden unsaid.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from terngrad import quantize
from terngrad.comm.spec.local import LocalSteps
from terngrad.comm.spec.method_spec import Method
from terngrad.comm.spec.options import Options

_OPTIONS = Options()
_LOCAL = {f.name: f.default for f in dataclasses.fields(LocalSteps)}


def _plain(name: str) -> str:
    return name


def over(
    method: Method,
    exchange: Mapping[str, Any] | None = None,
    local: Mapping[str, Any] | None = None,
    spell: Callable[[str], str] = _plain,
) -> Method:
    """``method`` with the settings given: ``exchange``, :class:`Options` fields by name (the
    quantizer's options by name under ``quantizer_options``), and ``local``,
    :class:`LocalSteps` fields by name (``every``: ``H``; 1, alone, is no local steps).
    ``spell``: a setting's name as the caller's user writes it (``--local-steps``).
    ``ValueError`` in one line for a setting the method sets otherwise (the rule above)."""
    x_given = dict(exchange or {})
    q_given = dict(x_given.pop("quantizer_options", None) or {})
    l_given = dict(local or {})
    if not (x_given or q_given or l_given):
        return method
    if method.baseline is not None:
        names = ", ".join(spell(n) for n in (*x_given, *q_given, *l_given))
        raise ValueError(
            f"{method.name} is PyTorch's own averaging: it takes no {names}; name a method of "
            "terngrad's exchange (docs/methods.md)"
        )
    x = method.exchange
    assert x is not None
    wrong: list[tuple[str, Any, Any]] = []
    x_set = _settable(x_given, lambda n: getattr(x, n), lambda n: getattr(_OPTIONS, n), wrong)
    named = dict(x.quantizer_options)
    q_defaults = quantize.get(x.quantizer).options
    # (a quantizer option the name holds is the method's; any other is at its default)
    q_set = _settable(q_given, lambda n: named.get(n, q_defaults.get(n)),
                      lambda n: _NAMED if n in named else q_defaults.get(n), wrong)  # fmt: skip
    new_local = method.local
    if method.local is None:
        if l_given.get("every", 1) == 1:
            extra = {k: v for k, v in l_given.items() if k != "every" and v != _LOCAL[k]}
            if extra:
                name, value = next(iter(extra.items()))
                raise ValueError(
                    f"{_shown(name, value, spell)} is a setting of local steps, and "
                    f"{method.name} has none: give {spell('every')} too, or a method with local "
                    f"steps ({method.name}-local16), or leave it out"
                )
        else:
            new_local = LocalSteps(**l_given)
    elif l_given:
        own = method.local
        # (its H is in its name: never a default; Nesterov's is where there is momentum)
        defaults = {**_LOCAL, "every": _NAMED, "nesterov": own.outer_momentum > 0}
        l_set = _settable(l_given, lambda n: getattr(own, n), defaults.__getitem__, wrong)
        new_local = own.replace(**l_set) if l_set else own
    if wrong:
        raise ValueError(_refusal(method, wrong, x_given, q_given, l_given, spell))
    changed = x.replace(**x_set, quantizer_options={**named, **q_set})
    return dataclasses.replace(method, exchange=changed, local=new_local)


#: a value no setting has: a quantizer option that the method's name holds is never settable
_NAMED = object()


def _settable(
    given: Mapping[str, Any],
    have: Callable[[str], Any],
    default: Callable[[str], Any],
    wrong: list[tuple[str, Any, Any]],
) -> dict[str, Any]:
    """The settings of ``given`` that change what the method has at its default; those that
    change what it sets otherwise are added to ``wrong`` as ``(name, given, the method's)``."""
    settable = {}
    for name, value in given.items():
        own = have(name)
        if value == own:
            continue
        if own == default(name):
            settable[name] = value
        else:
            wrong.append((name, value, own))
    return settable


def _shown(name: str, value: Any, spell: Callable[[str], str]) -> str:
    """A setting as given, in words: ``--bucket-size 64``, ``--outer-overlap``, ``without
    --outer-overlap``."""
    if isinstance(value, bool):
        return spell(name) if value else f"without {spell(name)}"
    return f"{spell(name)} {value}"


def _refusal(
    method: Method,
    wrong: list[tuple[str, Any, Any]],
    x_given: Mapping[str, Any],
    q_given: Mapping[str, Any],
    l_given: Mapping[str, Any],
    spell: Callable[[str], str],
) -> str:
    """One line: what was given, what ``method`` runs, and the method that runs what was given
    (every setting put over ``method``), where there is one."""

    asked = ", ".join(_shown(n, v, spell) for n, v, _ in wrong)
    runs = ", ".join(_shown(n, r, spell) for n, _, r in wrong)
    flags = ", ".join(spell(n) for n, _, _ in wrong)
    try:
        x = method.options(**x_given, quantizer_options=q_given)
        local = (method.local or LocalSteps()).replace(**l_given) if l_given else method.local
        better: str | None = dataclasses.replace(method, exchange=x, local=local).name
    except (TypeError, ValueError):
        better = None
    fix = (
        f"the method that does is {better}: name it, or leave out {flags}"
        if better is not None
        else f"no method does (docs/methods.md): leave out {flags}"
    )
    return f"{asked} is not what {method.name} runs ({runs}); {fix}"
