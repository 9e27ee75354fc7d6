"""The checks a saved state passes before any of it is taken: every entry present and of its
type, every tensor of its shape and dtype — what is wrong named in one ``ValueError`` line
(``not a <kind>: ...``), never a bare ``KeyError``, Python's own message or a failure at the
first backward pass.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

#: the counters a hook state carries (``messages_sent``: not counted before 0.3, optional)
COUNTERS = ("steps", "skipped_steps", "bytes_sent", "bytes_received")


def _name(value: Any) -> str:
    return type(value).__name__


def entry(state: Mapping[str, Any], key: str, types: type | tuple[type, ...], what: str,
          kind: str) -> Any:  # fmt: skip
    """``state[key]``, refused unless present and of ``types`` (described as ``what``)."""
    if key not in state:
        raise ValueError(f"not a {kind}: it has no {key!r} ({what})")
    value = state[key]
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in _tuple(types)):
        raise ValueError(f"not a {kind}: its {key!r} is a {_name(value)}, not {what}")
    return value


def _tuple(types: type | tuple[type, ...]) -> tuple[type, ...]:
    return types if isinstance(types, tuple) else (types,)


def count(state: Mapping[str, Any], key: str, kind: str, optional: bool = False) -> int:
    """``state[key]``, a whole number >= 0 (absent and ``optional``: 0)."""
    if optional and key not in state:
        return 0
    value = entry(state, key, int, "a whole number", kind)
    if value < 0:
        raise ValueError(f"not a {kind}: its {key!r} is {value}, not a whole number >= 0")
    return value


def counters(state: Mapping[str, Any], kind: str) -> None:
    """A :meth:`~terngrad.comm.rank.stats.Counters.state_dict`, saved as ``state['counters']``."""
    saved = entry(state, "counters", dict, "a dict of counts", kind)
    for key in COUNTERS:
        count(saved, key, f"{kind} (counters)")
    count(saved, "messages_sent", f"{kind} (counters)", optional=True)


def tensors(
    value: Any,
    key: str,
    kind: str,
    sizes: Mapping[str, int] | None = None,
    dtype: torch.dtype | None = None,
) -> dict[str, torch.Tensor]:
    """``value`` (``state[key]``): a dict of floating-point tensors by name; with ``sizes``, each
    name one of them and its tensor flat of that many elements; with ``dtype``, of it."""
    if not isinstance(value, dict):
        raise ValueError(f"not a {kind}: its {key!r} is a {_name(value)}, not a dict of tensors")
    for name, t in value.items():
        where = f"{kind}: {key}[{name!r}]"
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{where} is a {_name(t)}, not a tensor")
        if not t.is_floating_point() or (dtype is not None and t.dtype != dtype):
            wanted = dtype or "a floating-point dtype"
            raise ValueError(f"{where} is {t.dtype}, not {wanted}")
        if sizes is None:
            continue
        if name not in sizes:
            known = ", ".join(sorted(sizes)[:5]) + (", ..." if len(sizes) > 5 else "")
            raise ValueError(f"{where}: no such parameter here (this model's: {known})")
        if tuple(t.shape) != (sizes[name],):
            raise ValueError(
                f"{where} has shape {tuple(t.shape)}, not ({sizes[name]},) as this model's: "
                "saved from another model"
            )
    return value


def rank_state(state: Any, kind: str, state_format: int, sizes: Mapping[str, int]) -> None:
    """What every :class:`~terngrad.comm.rank.rank_state.RankState` saves: ``format``, ``config``,
    ``rank`` and the error-feedback ``residuals`` (float32, flat, by parameter ``sizes``)."""
    if not isinstance(state, dict):
        raise ValueError(f"not a {kind}: a {_name(state)}, not a dict")
    if state.get("format") != state_format:
        raise ValueError(f"not a {kind} (or one of another format version)")
    entry(state, "config", dict, "the configuration it was saved with", kind)
    entry(state, "rank", int, "the rank that saved it", kind)
    tensors(entry(state, "residuals", dict, "a dict of tensors", kind), "residuals", kind, sizes,
            torch.float32)  # fmt: skip


def generator(state: Mapping[str, Any], kind: str, mine: torch.Tensor) -> None:
    """``state['generator']``, a generator's state of the same form as ``mine`` (this
    generator's)."""
    value = entry(state, "generator", object, "a random generator's state", kind)
    if not isinstance(value, torch.Tensor) or value.dtype != mine.dtype:
        found = value.dtype if isinstance(value, torch.Tensor) else _name(value)
        raise ValueError(f"not a {kind}: its 'generator' is {found}, not a {mine.dtype} tensor")
    if value.shape != mine.shape:
        raise ValueError(
            f"not a {kind}: its 'generator' has shape {tuple(value.shape)}, this rank's "
            f"generator {tuple(mine.shape)} (saved on another device?)"
        )
