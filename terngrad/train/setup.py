"""A run's objects from its config: the data set, the model, the optimizer and the learning-rate
schedule — what the training loop builds on every rank, and what ``terngrad study
--from-checkpoint`` builds again from a checkpoint (:func:`restore`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from terngrad.comm.spec.method_spec import FrozenVariance, LocalVariance
from terngrad.optim import FrozenVarianceAdamW, LocalVarianceAdamW
from terngrad.train import checkpoints, models, schedule, text
from terngrad.train import data as datasets
from terngrad.train.config import TrainConfig


def load_data(cfg: TrainConfig, **options: Any) -> datasets.DataSet | text.TextSet:
    """The run's data set, shaped for its model (an image size, or a language model's context)."""
    shape = models.default_input_shape(cfg.model)
    return datasets.load(
        cfg.dataset, cfg.data_dir, synthetic_shape=shape, synthetic_classes=10,
        context=shape[0], **options,
    )  # fmt: skip


def build_model(cfg: TrainConfig, data: datasets.DataSet | text.TextSet) -> nn.Module:
    """The run's model, initialised from its seed (identical on every rank)."""
    torch.manual_seed(cfg.seed)
    return models.build(cfg.model, data.input_shape, data.num_classes, cfg.dropout)


def make_optimizer(cfg: TrainConfig, model: nn.Module) -> torch.optim.Optimizer:
    """SGD (plain or with momentum), Adam (L2 weight decay in the gradient), or AdamW
    (decoupled weight decay, Loshchilov & Hutter 2019, on the weight matrices and embeddings
    only: biases and layer-norm gains keep theirs, as GPT-2 and BERT train), plain or with its
    variance frozen after ``freeze_after`` steps where the method's recipe says so
    (:class:`terngrad.optim.FrozenVarianceAdamW`, whose momentum the hook then exchanges) or
    measured on each rank and averaged every ``LocalVariance.every`` steps
    (:class:`terngrad.optim.LocalVarianceAdamW`, its momentum exchanged from the first
    step)."""
    params = list(model.parameters())
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    if cfg.optimizer == "adamw":
        groups = [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]
        recipe = cfg.method.recipe
        if isinstance(recipe, FrozenVariance):
            return FrozenVarianceAdamW(groups, lr=cfg.lr, warmup_steps=cfg.freeze_after)
        if isinstance(recipe, LocalVariance):
            return LocalVarianceAdamW(groups, lr=cfg.lr, sync_every=recipe.every)
        return torch.optim.AdamW(groups, lr=cfg.lr)
    momentum = cfg.momentum if cfg.optimizer == "momentum" else 0.0
    return torch.optim.SGD(params, lr=cfg.lr, momentum=momentum, weight_decay=cfg.weight_decay)


def make_schedule(
    cfg: TrainConfig, optimizer: torch.optim.Optimizer, train_examples: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """``LambdaLR`` over :func:`terngrad.train.schedule.lr_factor`: ``constant``, ``poly`` or
    ``cosine``, after a linear warm-up from lr/10 where one is asked for."""
    epoch = schedule.steps_per_epoch(train_examples, cfg.workers, cfg.worker_batch)
    warmup = schedule.warmup_length(cfg.warmup_steps, cfg.warmup_epochs, epoch)
    factor = schedule.lr_factor(cfg.lr_schedule, cfg.steps, cfg.lr_power, warmup)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


@dataclass
class Restored:
    """A run's model and optimizer as a checkpoint left them (the optimizer fresh if the
    checkpoint holds none), in one process."""

    config: TrainConfig
    model: nn.Module
    optimizer: torch.optim.Optimizer
    data: datasets.DataSet | text.TextSet


def restore(path: Path | str, data_dir: str | None = None, dataset: str | None = None,
            seed: int = 0) -> Restored:  # fmt: skip
    """The model of the checkpoint at ``path`` with its weights, and the run's own optimizer
    with its saved state (AdamW's moments, the scheduled learning rate), on the run's data set
    (or ``dataset``; ``data_dir`` if given, else the run's). ``ValueError`` with one line for a
    file that is not such a checkpoint or a data set the model does not fit."""
    ckpt = checkpoints.read_training_checkpoint(path)
    cfg = checkpoints.saved_config(path, ckpt)
    cfg = cfg.replace(dataset=dataset or cfg.dataset, data_dir=data_dir or cfg.data_dir)
    data = load_data(cfg, seed=seed)
    torch.manual_seed(seed)  # the weights come from the checkpoint; the generator is reseeded
    model = models.build(cfg.model, data.input_shape, data.num_classes)
    try:
        model.load_state_dict(ckpt["model"])
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()[-1].strip()
        raise ValueError(f"{path} does not fit {cfg.model} on {cfg.dataset}: {first}") from None
    optimizer = make_optimizer(cfg, model)
    if isinstance(ckpt.get("optimizer"), dict):
        optimizer.load_state_dict(ckpt["optimizer"])
    return Restored(cfg, model, optimizer, data)
