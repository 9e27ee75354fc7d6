"""Whether a checkpoint's contents fit the run that would resume from it: every field a worker
reads (:func:`terngrad.train.loop.train_worker`) is checked here, in the launcher, before any
worker starts and before anything in the folder is rewritten
(:func:`terngrad.train.run_folder.prepare_out` calls :func:`check_fit`).

The run's model, optimizer and schedule are built as the workers build them, on the meta
device (shapes and dtypes, no memory, no data), and the checkpoint's states are held against
them: every weight and buffer of the model's shape; the optimizer's state loaded by torch into
the run's optimizer, each buffer of its parameter's shape, each hyperparameter of its kind;
the schedule's fields those of the run's schedule, at the checkpoint's step; one generator
state of torch's size per rank; each rank's hook state made for this exchange (its saved
configuration the one the hook will compare, its generator, residuals and counters) or, with
local steps, the DiLoCo state of this run (anchor, outer and inner optimizers, exchange); the
clocks, wire bytes and evaluation record of their kinds. No collective is needed: each state is
judged on its own. A misfit is :class:`~terngrad.train.checkpoints.Unusable`, one line.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from terngrad.comm.rank.agreement import exchange_config
from terngrad.comm.rank.momentum import VarianceSource
from terngrad.comm.rank.plans import full_precision_names, last_layer_names
from terngrad.comm.rank.reducer import check_hook_state
from terngrad.diloco.state import REPLICATED_STATE, check_state
from terngrad.kernels import resolve
from terngrad.local_steps import outer_sgd
from terngrad.train import models
from terngrad.train.checkpoints import Unusable
from terngrad.train.config import TrainConfig
from terngrad.train.setup import load_data, make_optimizer, make_schedule


class _Misfit(Exception):
    """What does not fit, in words; :func:`check_fit` puts the file's name before it."""


def check_fit(path: Path | str, ckpt: dict[str, Any], cfg: TrainConfig) -> None:
    """``ckpt`` (read from ``path`` by :func:`~terngrad.train.checkpoints.load_run`) holds
    what every worker of ``cfg`` reads from it, of the shapes and kinds it will use;
    :class:`~terngrad.train.checkpoints.Unusable` naming the first field that does not."""
    try:
        _check(ckpt, cfg)
    except _Misfit as exc:
        raise Unusable(f"{path} does not fit this run: {exc}") from None


def _check(ckpt: dict[str, Any], cfg: TrainConfig) -> None:
    model = _meta_model(cfg)
    _check_tensors("model", ckpt["model"], model.state_dict())
    optimizer = make_optimizer(cfg, model)
    schedule = make_schedule(cfg, optimizer, 1)  # (the epoch's length changes no state field)
    _check_optimizer("optimizer", ckpt["optimizer"], optimizer)
    _check_schedule(ckpt["schedule"], schedule, ckpt["step"])
    generator_size = torch.get_rng_state().shape
    for rank, state in enumerate(ckpt["rng_states"]):
        _check_generator(f"generator of rank {rank}", state, generator_size)
    if cfg.baseline is None and cfg.local_steps != 1:
        for rank, state in enumerate(ckpt["hook_states"]):
            _check_diloco_state(rank, state, cfg, model, ckpt["step"])
        _check_alike(ckpt["hook_states"])
    elif cfg.baseline is None:  # (PyTorch's baselines keep no hook state)
        for rank, state in enumerate(ckpt["hook_states"]):
            _check_hook_state(rank, state, cfg, model)
    _check_records(ckpt, cfg.workers)


#: the input shape and classes of each (model, data set, folder) read so far
_INPUTS: dict[tuple[str, str, str | None], tuple[tuple[int, ...], int]] = {}


def _meta_model(cfg: TrainConfig) -> nn.Module:
    """The run's model on the meta device (its data set read once, for the input's shape)."""
    key = (cfg.model, cfg.dataset, cfg.data_dir)
    if key not in _INPUTS:
        data = load_data(cfg, synthetic_size=1)
        _INPUTS[key] = (tuple(data.input_shape), data.num_classes)
    shape, classes = _INPUTS[key]
    with torch.device("meta"):
        return models.build(cfg.model, shape, classes, cfg.dropout)


# --------------------------------------------------------------------------- tensors, kinds


def _kind(value: Any) -> str:
    """``value`` in a few words: a tensor's layout, shape, dtype and device, else its type."""
    if isinstance(value, torch.Tensor):
        layout = "" if value.layout == torch.strided else f"{str(value.layout)[6:]} "
        device = "" if value.device.type == "cpu" else f" on {value.device.type}"
        return f"a {layout}{_shape(value.shape)} {str(value.dtype)[6:]} tensor{device}"
    return f"a {type(value).__name__}"


def _shape(shape: torch.Size) -> str:
    return f"[{', '.join(str(n) for n in shape)}]"


def _tensor(what: str, value: Any, shape: torch.Size | None, floating: bool = True,
            numel: int | None = None) -> None:  # fmt: skip
    """``value`` is a dense CPU tensor of ``shape`` (or of ``numel`` elements), of a floating
    dtype if ``floating`` (else an integer one)."""
    fits = (
        isinstance(value, torch.Tensor)
        and value.layout == torch.strided
        and value.device.type == "cpu"
        and not value.is_complex()
        and value.is_floating_point() == floating
        and (shape is None or value.shape == shape)
        and (numel is None or value.numel() == numel)
    )
    if not fits:
        size = _shape(shape) if shape is not None else f"{numel}-element"
        kind = "floating-point" if floating else "integer"
        size = f"{size} {kind}" if shape is not None or numel is not None else kind
        raise _Misfit(f"its {what} is {_kind(value)}, where the run has a dense {size} tensor")


def _check_tensors(what: str, saved: Any, expected: Mapping[str, torch.Tensor]) -> None:
    """``saved`` holds a tensor of each of ``expected``'s shapes and kinds, and nothing else."""
    if not isinstance(saved, dict):
        raise _Misfit(f"its {what} is {_kind(saved)}, not a state dict")
    missing = [k for k in expected if k not in saved]
    extra = [str(k) for k in saved if k not in expected]
    if missing or extra:
        raise _Misfit(
            f"its {what} "
            + (f"lacks {', '.join(missing[:3])}" if missing else f"has {', '.join(extra[:3])}")
            + f", which the run's {what} "
            + ("has" if missing else "does not have")
        )
    for name, ref in expected.items():
        _tensor(f"{what}'s {name}", saved[name], ref.shape, ref.is_floating_point())


def _like(what: str, saved: Any, ref: Any) -> None:
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
                _like(f"{what}[{i}]", s, r)
    elif isinstance(ref, dict):
        ok = isinstance(saved, dict)
        if ok:
            for key, r in ref.items():
                if key not in saved:
                    raise _Misfit(f"its {what} lacks {key!r}")
                _like(f"{what}'s {key}", saved[key], r)
    else:
        ok = isinstance(saved, type(ref))
    if not ok:
        raise _Misfit(f"its {what} is {_kind(saved)}, where the run has {_kind(ref)}")


def _count(what: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise _Misfit(f"its {what} is {value!r}, not a count")


def _check_generator(what: str, state: Any, size: torch.Size) -> None:
    if not (isinstance(state, torch.Tensor) and state.dtype == torch.uint8):
        raise _Misfit(f"its {what} is {_kind(state)}, not a generator state (uint8)")
    _tensor(what, state, size, floating=False)


# --------------------------------------------------------------------------- optimizer, schedule


def _check_optimizer(what: str, saved: Any, optimizer: torch.optim.Optimizer) -> None:
    """``saved`` loads into ``optimizer`` (built on meta parameters) as torch loads it, each
    hyperparameter of the run's kind, each buffer of its parameter's shape."""
    groups = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    if not isinstance(saved, dict) or not isinstance(saved.get("state"), dict):
        raise _Misfit(f"its {what} is not an optimizer's state dict")
    try:
        optimizer.load_state_dict(saved)
    except Exception as exc:  # torch's own checks (groups, sizes) and ours (settings)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise _Misfit(f"its {what} does not load into the run's: {first}") from None
    ids = [i for g in saved["param_groups"] for i in g["params"]]
    params = [p for g in optimizer.param_groups for p in g["params"]]
    extra = [str(i) for i in saved["state"] if i not in ids]
    if extra:
        raise _Misfit(f"its {what} holds state for parameters {', '.join(extra[:3])} of no group")
    for i, (group, ref) in enumerate(zip(optimizer.param_groups, groups, strict=True)):
        _like(f"{what}'s parameter group {i}", {k: v for k, v in group.items() if k in ref}, ref)
    for n, (i, param) in enumerate(zip(ids, params, strict=True)):
        state = saved["state"].get(i, {})
        if not isinstance(state, dict):
            raise _Misfit(f"its {what}'s state of parameter {n} is {_kind(state)}")
        for key, value in state.items():
            where = f"{what}'s {key} of parameter {n}"
            if key == "step":
                if not (_number(value) or (isinstance(value, torch.Tensor) and value.numel() == 1
                                           and not value.is_complex())):  # fmt: skip
                    raise _Misfit(f"its {where} is {_kind(value)}, not a step count")
            elif value is not None or key != "momentum_buffer":
                _tensor(where, value, param.shape)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _check_schedule(saved: Any, schedule: Any, step: int) -> None:
    """The schedule's fields those of the run's, of their kinds, at ``step``."""
    ref = schedule.state_dict()
    if not isinstance(saved, dict):
        raise _Misfit(f"its schedule is {_kind(saved)}, not a schedule's state dict")
    missing, extra = sorted(set(ref) - set(saved)), sorted(set(saved) - set(ref), key=str)
    if missing or extra:
        raise _Misfit(
            "its schedule "
            + (f"lacks {', '.join(missing)}" if missing else f"has {', '.join(map(str, extra))}")
            + ", unlike the run's (LambdaLR)"
        )
    _like("schedule", saved, ref)
    if saved["last_epoch"] != step:
        raise _Misfit(f"its schedule is at step {saved['last_epoch']!r}, the checkpoint at {step}")


# --------------------------------------------------------------------------- hook states


def _exchanged(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def _exchange_config(cfg: TrainConfig, model: nn.Module) -> dict[str, Any]:
    """The configuration the run's hook (or DiLoCo's exchange) will compare a saved one with."""
    options = cfg.hook_options
    params = _exchanged(model)
    excluded = full_precision_names(params, last_layer_names(model), options)
    kernels = resolve(options.kernels, torch.device("cpu"))  # (kernels are never compared)
    return exchange_config(options, options.make_quantizer(), kernels, excluded, cfg.workers,
                           params)  # fmt: skip


def _check_exchange(what: str, rank: int, state: Any, cfg: TrainConfig, model: nn.Module,
                    variance: bool = False) -> None:  # fmt: skip
    """One rank's exchange state, by the hook's own check (one wording:
    :func:`~terngrad.comm.rank.reducer.check_hook_state`) against the run's configuration."""
    params = _exchanged(model)
    excluded = full_precision_names(params, last_layer_names(model), cfg.hook_options)
    sizes = {n: p.numel() for n, p in params}
    try:
        check_hook_state(state, _exchange_config(cfg, model), rank, sizes, excluded, variance)
    except ValueError as exc:
        raise _Misfit(f"its {what}: {exc}") from None


def _check_hook_state(rank: int, state: Any, cfg: TrainConfig, model: nn.Module) -> None:
    variance = isinstance(make_optimizer(cfg, model), VarianceSource)
    _check_exchange(f"hook state of rank {rank}", rank, state, cfg, model, variance)


def _check_diloco_state(rank: int, state: Any, cfg: TrainConfig, model: nn.Module,
                        step: int) -> None:  # fmt: skip
    """One rank's :meth:`terngrad.diloco.DiLoCo.state_dict`, as ``load_state_dict`` reads it."""
    from terngrad.train.loop import local_step_choices

    what = f"local-steps state of rank {rank}"
    params = [p for _, p in _exchanged(model)]
    with torch.device("meta"):
        anchor = [torch.empty_like(p, requires_grad=True) for p in params]
    outer = outer_sgd(anchor, cfg.outer_lr, cfg.outer_momentum)
    fixed = {k: outer.param_groups[0][k] for k in ("lr", "momentum", "nesterov")}
    try:  # (DiLoCo.load_state_dict's own check: one wording)
        check_state(state, [tuple(p.shape) for p in params], cfg.local_steps, cfg.outer_overlap,
                    local_step_choices(cfg) or [], fixed)  # fmt: skip
    except ValueError as exc:
        raise _Misfit(f"its {what}: {exc}") from None
    if state["inner_steps"] != step:
        raise _Misfit(
            f"its {what} counts {state['inner_steps']} inner steps, the checkpoint {step}"
        )
    _check_exchange(f"{what}'s exchange", rank, state["exchange"], cfg, model)
    _check_optimizer(f"{what}'s outer optimizer", state["outer_optimizer"], outer)
    inner = make_optimizer(cfg, model)
    make_schedule(cfg, inner, 1)  # (the schedule's initial_lr in the groups)
    _check_optimizer(f"{what}'s inner optimizer", state["inner_optimizer"], inner)


def _check_alike(states: list[dict[str, Any]]) -> None:
    """What local steps keep alike on every rank, alike in every rank's state: the step
    counts, and bit for bit the anchor and the outer optimizer (rank 0's, in every state of a
    checkpoint this trainer wrote)."""
    for key in ("inner_steps", "outer_steps", "skipped_outer_steps"):
        counts = [s[key] for s in states]
        if len(set(counts)) > 1:
            raise _Misfit(f"its local-steps states count {key} {counts} on ranks 0.., not alike")
    for key in REPLICATED_STATE:
        differ = [rank for rank, s in enumerate(states) if not _bitwise(s[key], states[0][key])]
        if differ:
            raise _Misfit(
                f"its local-steps state of rank {differ[0]} holds another {key} than rank 0's: "
                "every rank's is the same, bit for bit"
            )


def _bitwise(a: Any, b: Any) -> bool:
    """Nested dicts, lists and tensors equal, tensors bit for bit."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_bitwise(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return (isinstance(b, list | tuple) and len(a) == len(b)
                and all(_bitwise(x, y) for x, y in zip(a, b, strict=True)))  # fmt: skip
    return a == b


# --------------------------------------------------------------------------- the records


def _check_records(ckpt: dict[str, Any], workers: int) -> None:
    """The clocks, the wire bytes and the evaluation record."""
    for key in ("seconds", "train_seconds"):
        if key in ckpt and not (_number(ckpt[key]) and ckpt[key] >= 0):
            raise _Misfit(f"its {key} is {ckpt[key]!r}, not a number of seconds")
    wire = ckpt.get("wire_bytes")
    if wire is not None:
        if not isinstance(wire, list) or len(wire) != workers:
            raise _Misfit(f"its wire bytes are {_kind(wire)}, not one count per worker")
        for rank, n in enumerate(wire):
            _count(f"wire bytes of rank {rank}", n)
    evaluation = ckpt.get("evaluation")
    if evaluation is not None:
        for key in ("loss", "accuracy"):
            if not _number(evaluation.get(key)):
                raise _Misfit(f"its evaluation record's {key} is {evaluation.get(key)!r}")
        try:
            json.dumps(evaluation)
        except (TypeError, ValueError) as exc:
            raise _Misfit(f"its evaluation record is not a metrics record ({exc})") from None
