"""A saved :class:`terngrad.diloco.DiLoCo` state (:meth:`~terngrad.diloco.DiLoCo.state_dict`,
one per rank): what it holds, the parts that are the same on every rank, and its one check
(:func:`check_state`), run by :meth:`~terngrad.diloco.DiLoCo.load_state_dict` as it loads and,
before any worker starts, by the trainer's check of a checkpoint
(:mod:`terngrad.train.checkpoint_fit`): the same refusals, in the same words.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from terngrad.comm.rank import saved_state

__all__ = ["KIND", "REPLICATED_STATE", "STATE_FORMAT", "STATE_KEYS", "check_state"]

#: what a saved state is, and what it holds
STATE_FORMAT = 2
STATE_KEYS = ("local_steps", "inner_steps", "outer_steps", "skipped_outer_steps", "anchor",
              "outer_optimizer", "exchange", "inner_optimizer", "overlap", "pending")  # fmt: skip
#: the parts of a saved state that are the same on every rank, bit for bit: every replica
#: starts an outer step from one anchor, and every rank's outer optimizer steps on the same
#: exact average. A checkpoint may take them from one rank (``terngrad train``'s does: rank
#: 0's, the most of a state's bytes left off the network)
REPLICATED_STATE = ("anchor", "outer_optimizer")
#: how a refusal names it
KIND = "terngrad.diloco state"


def check_state(
    state: Any,
    shapes: Sequence[tuple[int, ...]],
    local_steps: int | str,
    overlap: bool,
    auto_choices: Sequence[int] = (),
    outer: Mapping[str, Any] | None = None,
) -> None:
    """``ValueError`` in one line unless ``state`` is a saved DiLoCo of these settings: of this
    format, every entry there; saved with ``local_steps`` (a run with ``"auto"`` takes a state
    still to choose, or one that chose any of ``auto_choices``) and ``overlap``; its step
    counts whole numbers; its anchor, and an exchange in flight (``pending``), one dense
    floating-point tensor per parameter, of ``shapes``, ``pending`` only where ``overlap`` is
    on; its step counts consistent (no more skipped outer steps than outer steps; with a fixed
    ``H``, ``inner_steps // H`` outer steps); its ``auto`` record a dict or ``None`` (before
    ``"auto"`` chose: the seconds of the steps timed so far, ``probe_gaps``); with
    ``outer`` (the outer SGD's ``lr``, ``momentum`` and ``nesterov`` the run fixes), every
    group of its outer optimizer at those. The exchange's state and the optimizers' per-parameter
    states are their owners' to check."""
    if not isinstance(state, dict):
        raise ValueError(f"not a {KIND}: a {type(state).__name__}, not a dict")
    if state.get("format") != STATE_FORMAT:
        raise ValueError(f"not a {KIND} (or one of another format version)")
    missing = [k for k in STATE_KEYS if k not in state]
    if missing:
        raise ValueError(f"this {KIND} lacks {', '.join(missing)}")
    saved_h = state["local_steps"]
    auto = local_steps == "auto" and (saved_h == "auto" or saved_h in auto_choices)
    if saved_h != local_steps and not auto:
        raise ValueError(f"this {KIND} was saved with local_steps={saved_h!r}, not {local_steps!r}")
    if state["overlap"] is not overlap:
        raise ValueError(f"this {KIND} was saved with overlap={state['overlap']!r}, not {overlap}")
    counted = ("inner_steps", "outer_steps", "skipped_outer_steps")
    inner, outer_steps, skipped = (saved_state.count(state, key, KIND) for key in counted)
    if skipped > outer_steps:
        raise ValueError(
            f"this {KIND} counts {skipped} skipped outer steps in {outer_steps} outer steps"
        )
    if isinstance(saved_h, int) and state.get("auto") is None and outer_steps != inner // saved_h:
        raise ValueError(
            f"this {KIND} counts {outer_steps} outer steps in {inner} inner steps, where H = "
            f"{saved_h} makes {inner // saved_h}"
        )
    if state["pending"] is not None and not overlap:
        raise ValueError(
            f"this {KIND} holds an outer exchange in flight (pending), which only a run with "
            "overlap keeps"
        )
    if outer is not None:
        _check_outer(state["outer_optimizer"], outer)
    for key in ("anchor", "pending"):
        tensors = state[key]
        if key == "pending" and tensors is None:
            continue
        if not isinstance(tensors, list) or len(tensors) != len(shapes):
            raise ValueError(f"this {KIND}'s {key} is not one tensor per parameter")
        for i, (t, shape) in enumerate(zip(tensors, shapes, strict=True)):
            if not isinstance(t, torch.Tensor) or t.layout != torch.strided:
                raise ValueError(f"this {KIND}'s {key} {i} is a {type(t).__name__}, not a tensor")
            if not t.is_floating_point():
                raise ValueError(f"this {KIND}'s {key} {i} is {t.dtype}, not floating-point")
            if tuple(t.shape) != tuple(shape):
                raise ValueError(
                    f"this {KIND}'s {key} {i} has shape {tuple(t.shape)}, the parameter's "
                    f"{tuple(shape)}: saved from another model"
                )
    record = state.get("auto")
    if record is not None and not isinstance(record, dict):
        raise ValueError(f"this {KIND}'s auto record is a {type(record).__name__}")
    gaps = record.get("probe_gaps", []) if saved_h == "auto" and record is not None else []
    if not isinstance(gaps, list) or not all(
        isinstance(g, float | int) and not isinstance(g, bool) and g >= 0 for g in gaps
    ):
        raise ValueError(f"this {KIND}'s auto record's probe_gaps is not a list of seconds")


def _check_outer(saved: Any, outer: Mapping[str, Any]) -> None:
    """Every group of a saved outer optimizer at the ``lr``, ``momentum`` and ``nesterov`` the
    run fixes (a resumed run takes the run's, not the file's)."""
    groups = saved.get("param_groups") if isinstance(saved, dict) else None
    if not isinstance(groups, list) or not all(isinstance(g, dict) for g in groups):
        raise ValueError(f"this {KIND}'s outer optimizer is not an optimizer's state")
    for key, value in outer.items():
        found = {repr(g.get(key)) for g in groups}
        if found != {repr(value)}:
            raise ValueError(
                f"this {KIND}'s outer optimizer has {key}={', '.join(sorted(found))}, this run "
                f"{key}={value!r}: resume with the outer settings it was saved with"
            )
