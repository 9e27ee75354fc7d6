"""Saved states held against live objects, each misfit one ``ValueError`` line in the same
words wherever a state is checked (the launcher's check of a checkpoint, ``DiLoCo``'s own load):
a tensor's kind and shape, a value of another's kind, an optimizer's state as torch loads it
(each hyperparameter of the live one's kind, each buffer of its parameter's shape).
:func:`on_meta` makes an optimizer's twin on the meta device to load a state into without
touching the live one or allocating.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["check_count", "check_generator", "check_like", "check_optimizer", "check_tensor",
           "check_tensors", "describe", "is_number", "on_meta", "shape_words"]  # fmt: skip


def describe(value: Any) -> str:
    """``value`` in a few words: a tensor's layout, shape, dtype and device, else its type."""
    if isinstance(value, torch.Tensor):
        layout = "" if value.layout == torch.strided else f"{str(value.layout)[6:]} "
        device = "" if value.device.type == "cpu" else f" on {value.device.type}"
        return f"a {layout}{shape_words(value.shape)} {str(value.dtype)[6:]} tensor{device}"
    return f"a {type(value).__name__}"


def shape_words(shape: torch.Size) -> str:
    return f"[{', '.join(str(n) for n in shape)}]"


def check_tensor(what: str, value: Any, shape: torch.Size | None, floating: bool = True,
                 numel: int | None = None, any_device: bool = False) -> None:  # fmt: skip
    """``value`` is a dense tensor of ``shape`` (or of ``numel`` elements), of a floating dtype
    if ``floating`` (else an integer one), on the CPU unless ``any_device`` (a checkpoint the
    launcher read is on the CPU; a state loaded into a live object is moved as it loads)."""
    fits = (
        isinstance(value, torch.Tensor)
        and value.layout == torch.strided
        and (any_device or value.device.type == "cpu")
        and not value.is_complex()
        and value.is_floating_point() == floating
        and (shape is None or value.shape == shape)
        and (numel is None or value.numel() == numel)
    )
    if not fits:
        size = shape_words(shape) if shape is not None else f"{numel}-element"
        kind = "floating-point" if floating else "integer"
        size = f"{size} {kind}" if shape is not None or numel is not None else kind
        raise ValueError(
            f"its {what} is {describe(value)}, where the run has a dense {size} tensor"
        )


def check_tensors(what: str, saved: Any, expected: Mapping[str, torch.Tensor]) -> None:
    """``saved`` holds a tensor of each of ``expected``'s shapes and kinds, and nothing else."""
    if not isinstance(saved, dict):
        raise ValueError(f"its {what} is {describe(saved)}, not a state dict")
    missing = [k for k in expected if k not in saved]
    extra = [str(k) for k in saved if k not in expected]
    if missing or extra:
        raise ValueError(
            f"its {what} "
            + (f"lacks {', '.join(missing[:3])}" if missing else f"has {', '.join(extra[:3])}")
            + f", which the run's {what} "
            + ("has" if missing else "does not have")
        )
    for name, ref in expected.items():
        check_tensor(f"{what}'s {name}", saved[name], ref.shape, ref.is_floating_point())


def check_like(what: str, saved: Any, ref: Any) -> None:
    """``saved`` is of ``ref``'s kind: a number for a number, a bool for a bool, a list or
    tuple of as many such for one, a dict with ``ref``'s keys; ``None`` in ``ref`` takes any
    plain value (``foreach``, ``fused``: either is fine)."""
    plain = (type(None), bool, int, float, str)
    if ref is None:
        ok = isinstance(saved, plain)
    elif isinstance(ref, bool):
        ok = isinstance(saved, bool)
    elif isinstance(ref, int | float):
        ok = isinstance(saved, int | float) and not isinstance(saved, bool)
        ok = ok and math.isfinite(saved)
    elif isinstance(ref, list | tuple):
        ok = isinstance(saved, list | tuple) and len(saved) == len(ref)
        if ok:
            for i, (s, r) in enumerate(zip(saved, ref, strict=True)):
                check_like(f"{what}[{i}]", s, r)
    elif isinstance(ref, dict):
        ok = isinstance(saved, dict)
        if ok:
            for key, r in ref.items():
                if key not in saved:
                    raise ValueError(f"its {what} lacks {key!r}")
                check_like(f"{what}'s {key}", saved[key], r)
    else:
        ok = isinstance(saved, type(ref))
    if not ok:
        raise ValueError(f"its {what} is {describe(saved)}, where the run has {describe(ref)}")


def check_count(what: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"its {what} is {value!r}, not a count")


def check_generator(what: str, state: Any, size: torch.Size) -> None:
    if not (isinstance(state, torch.Tensor) and state.dtype == torch.uint8):
        raise ValueError(f"its {what} is {describe(state)}, not a generator state (uint8)")
    check_tensor(what, state, size, floating=False)


def check_optimizer(what: str, saved: Any, optimizer: torch.optim.Optimizer,
                    any_device: bool = False) -> None:  # fmt: skip
    """``saved`` loads into ``optimizer`` (built on meta parameters) as torch loads it, each
    hyperparameter of the run's kind, each buffer of its parameter's shape (on the CPU unless
    ``any_device``)."""
    groups = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    if not isinstance(saved, dict) or not isinstance(saved.get("state"), dict):
        raise ValueError(f"its {what} is not an optimizer's state dict")
    try:
        optimizer.load_state_dict(saved)
    except Exception as exc:  # torch's own checks (groups, sizes) and ours (settings)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"its {what} does not load into the run's: {first}") from None
    ids = [i for g in saved["param_groups"] for i in g["params"]]
    params = [p for g in optimizer.param_groups for p in g["params"]]
    extra = [str(i) for i in saved["state"] if i not in ids]
    if extra:
        listed = ", ".join(extra[:3])
        raise ValueError(f"its {what} holds state for parameters {listed} of no group")
    for i, (group, ref) in enumerate(zip(optimizer.param_groups, groups, strict=True)):
        values = {k: v for k, v in group.items() if k in ref}
        check_like(f"{what}'s parameter group {i}", values, ref)
    for n, (i, param) in enumerate(zip(ids, params, strict=True)):
        state = saved["state"].get(i, {})
        if not isinstance(state, dict):
            raise ValueError(f"its {what}'s state of parameter {n} is {describe(state)}")
        for key, value in state.items():
            where = f"{what}'s {key} of parameter {n}"
            if key == "step":
                if not (is_number(value) or (isinstance(value, torch.Tensor) and value.numel() == 1
                                           and not value.is_complex())):  # fmt: skip
                    raise ValueError(f"its {where} is {describe(value)}, not a step count")
            elif value is not None or key != "momentum_buffer":
                check_tensor(where, value, param.shape, any_device=any_device)


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def on_meta(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """A copy of ``optimizer`` whose parameters and state tensors are on the meta device: a
    state loaded into it is checked as torch loads it, and nothing of the live one changes."""
    memo: dict[int, Any] = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            memo[id(p)] = torch.empty_like(p, device="meta").requires_grad_(p.requires_grad)
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                memo[id(value)] = torch.empty_like(value, device="meta")
    return copy.deepcopy(optimizer, memo)
