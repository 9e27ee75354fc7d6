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
from pathlib import Path
from typing import Any

import torch
from torch import nn

from terngrad.comm.front.nodes import share
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
from terngrad.util.differences import same
from terngrad.util.state_kinds import (
    check_count,
    check_generator,
    check_like,
    check_optimizer,
    check_tensors,
    describe,
    is_number,
)


class _Misfit(ValueError):
    """What does not fit, in words; :func:`check_fit` puts the file's name before it."""


class _FlagsMisfit(ValueError):
    """A sound checkpoint that this command's flags cannot go on from, as no checkpoint of
    the run could (a setting every one of them holds): the flags are what to change."""


def check_fit(path: Path | str, ckpt: dict[str, Any], cfg: TrainConfig) -> None:
    """``ckpt`` (read from ``path`` by :func:`~terngrad.train.checkpoints.load_run`) holds
    what every worker of ``cfg`` reads from it, of the shapes and kinds it will use;
    :class:`~terngrad.train.checkpoints.Unusable` naming the first field that does not."""
    try:
        _check(ckpt, cfg)
    except _FlagsMisfit as exc:  # (not Unusable: an older checkpoint holds the same)
        raise ValueError(f"{path}: {exc}") from None
    except ValueError as exc:  # (_Misfit, and the state checks of terngrad.util.state_kinds)
        raise Unusable(f"{path} does not fit this run: {exc}") from None


def _check(ckpt: dict[str, Any], cfg: TrainConfig) -> None:
    model = _meta_model(cfg)
    check_tensors("model", ckpt["model"], model.state_dict())
    optimizer = make_optimizer(cfg, model)
    schedule = make_schedule(cfg, optimizer, 1)  # (the epoch's length changes no state field)
    check_optimizer("optimizer", ckpt["optimizer"], optimizer)
    _check_schedule(ckpt["schedule"], schedule, ckpt["step"])
    generator_size = torch.get_rng_state().shape
    for rank, state in enumerate(ckpt["rng_states"]):
        check_generator(f"generator of rank {rank}", state, generator_size)
    if cfg.method.local is not None:
        for rank, state in enumerate(ckpt["hook_states"]):
            _check_diloco_state(rank, state, cfg, model, ckpt["step"])
        _check_alike(ckpt["hook_states"])
    elif cfg.method.baseline is None:  # (PyTorch's baselines keep no hook state)
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


def _check_schedule(saved: Any, schedule: Any, step: int) -> None:
    """The schedule's fields those of the run's, of their kinds, at ``step``."""
    ref = schedule.state_dict()
    if not isinstance(saved, dict):
        raise _Misfit(f"its schedule is {describe(saved)}, not a schedule's state dict")
    missing, extra = sorted(set(ref) - set(saved)), sorted(set(saved) - set(ref), key=str)
    if missing or extra:
        raise _Misfit(
            "its schedule "
            + (f"lacks {', '.join(missing)}" if missing else f"has {', '.join(map(str, extra))}")
            + ", unlike the run's (LambdaLR)"
        )
    check_like("schedule", saved, ref)
    if saved["last_epoch"] != step:
        raise _Misfit(f"its schedule is at step {saved['last_epoch']!r}, the checkpoint at {step}")


# --------------------------------------------------------------------------- hook states


def _exchanged(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def _check_exchange(what: str, rank: int, state: Any, cfg: TrainConfig, model: nn.Module,
                    variance: bool = False) -> None:  # fmt: skip
    """One rank's exchange state, by the hook's own check (one wording:
    :func:`~terngrad.comm.rank.reducer.check_hook_state`) against the configuration the run's
    hook (or DiLoCo's exchange: across nodes, this rank's share among the ranks at its place)
    will compare it with."""
    options, params, world = cfg.hook_options, _exchanged(model), cfg.workers
    if cfg.node_size is not None:
        k = cfg.node_size
        rank, place = divmod(rank, k)
        owners, options = share(params, options, k, place)
        params = [p for p, o in zip(params, owners, strict=True) if o == place]
        world //= k
    excluded = full_precision_names(params, last_layer_names(model), options)
    kernels = resolve(options.kernels, torch.device("cpu"))  # (kernels are never compared)
    config = exchange_config(options, options.make_quantizer(), kernels, excluded, world, params)
    sizes = {n: p.numel() for n, p in params}
    try:
        check_hook_state(state, config, rank, sizes, excluded, variance)
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
    _check_chosen_h(state, cfg)
    params = [p for _, p in _exchanged(model)]
    with torch.device("meta"):
        anchor = [torch.empty_like(p, requires_grad=True) for p in params]
    local = cfg.method.local
    assert local is not None
    outer = outer_sgd(anchor, local)
    fixed = {k: outer.param_groups[0][k] for k in ("lr", "momentum", "nesterov")}
    try:  # (DiLoCo.load_state_dict's own check: one wording)
        check_state(state, [tuple(p.shape) for p in params], local.every, local.overlap,
                    local_step_choices(cfg) or [], fixed)  # fmt: skip
    except ValueError as exc:
        raise _Misfit(f"its {what}: {exc}") from None
    if state["inner_steps"] != step:
        raise _Misfit(
            f"its {what} counts {state['inner_steps']} inner steps, the checkpoint {step}"
        )
    _check_exchange(f"{what}'s exchange", rank, state["exchange"], cfg, model)
    check_optimizer(f"{what}'s outer optimizer", state["outer_optimizer"], outer)
    inner = make_optimizer(cfg, model)
    make_schedule(cfg, inner, 1)  # (the schedule's initial_lr in the groups)
    check_optimizer(f"{what}'s inner optimizer", state["inner_optimizer"], inner)


def _check_chosen_h(state: Any, cfg: TrainConfig) -> None:
    """``--local-steps auto``: the ``H`` the run chose (every checkpoint of it holds the same)
    divides the steps and periods this command gives, as the choice required."""
    from terngrad.train.loop import local_step_choices

    h = state.get("local_steps") if isinstance(state, dict) else None
    if not isinstance(h, int) or isinstance(h, bool):  # ("auto" still to choose, or checked
        return  # by check_state)
    choices = local_step_choices(cfg)
    if choices is None or h in choices:
        return
    given = {"--steps": cfg.steps, "--eval-every": cfg.eval_every,
             "--checkpoint-every": cfg.checkpoint_every}  # fmt: skip
    named = ", ".join(f"{flag} {v}" for flag, v in given.items() if v and v % h)
    raise _FlagsMisfit(
        f"--local-steps auto chose H = {h} for this run (every checkpoint of it holds that H), "
        f"and {h} does not divide {named}: give multiples of {h} (the outer steps fall every "
        f"{h} steps), or start afresh in another --out"
    )


def _check_alike(states: list[dict[str, Any]]) -> None:
    """What local steps keep alike on every rank, alike in every rank's state: the step
    counts, and bit for bit the anchor and the outer optimizer (rank 0's, in every state of a
    checkpoint this trainer wrote)."""
    for key in ("inner_steps", "outer_steps", "skipped_outer_steps"):
        counts = [s[key] for s in states]
        if len(set(counts)) > 1:
            raise _Misfit(f"its local-steps states count {key} {counts} on ranks 0.., not alike")
    for key in REPLICATED_STATE:
        differ = [rank for rank, s in enumerate(states) if not same(s[key], states[0][key])]
        if differ:
            raise _Misfit(
                f"its local-steps state of rank {differ[0]} holds another {key} than rank 0's: "
                "every rank's is the same, bit for bit"
            )


# --------------------------------------------------------------------------- the records


def _check_records(ckpt: dict[str, Any], workers: int) -> None:
    """The clocks, the wire bytes and the evaluation record."""
    for key in ("seconds", "train_seconds"):
        if key in ckpt and not (is_number(ckpt[key]) and ckpt[key] >= 0):
            raise _Misfit(f"its {key} is {ckpt[key]!r}, not a number of seconds")
    wire = ckpt.get("wire_bytes")
    if wire is not None:
        if not isinstance(wire, list) or len(wire) != workers:
            raise _Misfit(f"its wire bytes are {describe(wire)}, not one count per worker")
        for rank, n in enumerate(wire):
            check_count(f"wire bytes of rank {rank}", n)
    evaluation = ckpt.get("evaluation")
    if evaluation is not None:
        for key in ("loss", "accuracy"):
            if not is_number(evaluation.get(key)):
                raise _Misfit(f"its evaluation record's {key} is {evaluation.get(key)!r}")
        try:
            json.dumps(evaluation)
        except (TypeError, ValueError) as exc:
            raise _Misfit(f"its evaluation record is not a metrics record ({exc})") from None
