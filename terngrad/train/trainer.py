"""Training with N workers: the run's configuration, one worker's loop, and the launcher.

``launch(config)`` starts ``config.workers`` processes on this machine (``torch.multiprocessing``,
gloo over loopback) or, with ``nnodes``/``rdzv_endpoint``, hands them to ``torchrun``'s elastic
agent for a real cluster. Each worker trains the same model under DDP with the terngrad hook
(or one of PyTorch's own ways, ``baseline``: :mod:`terngrad.train.baselines`), reads its own
disjoint shard of the training set, and rank 0 writes into ``config.out``:

* ``metrics.jsonl`` — one JSON object per evaluation: step, loss and accuracy on the test set
  (for a language model: on the validation windows, with ``bits_per_char``),
  train_loss (mean since the last evaluation), bytes_sent (the hook's count, this rank,
  cumulative), seconds (wall clock), train_seconds (the steps alone), wire_bytes (inside the
  testbed of :mod:`terngrad.bench.accuracy`: what the ranks' interfaces sent during the steps);
* ``summary.json`` — final accuracy, bytes per rank, wall time, the full config;
* ``checkpoint-<step>.pt`` — model, optimizer, schedule, every rank's hook state and random
  generator, written atomically with a checksum (:mod:`terngrad.train.checkpoints`) every
  ``checkpoint_every`` steps, the newest ``keep_checkpoints`` kept; a run started again with the
  same ``out`` resumes from the newest (or from ``resume``);
* ``curves.png`` — test accuracy and loss against step.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import math
import multiprocessing
import os
import socket
import sys
import tempfile
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

import terngrad.ddp
from terngrad import kernels
from terngrad.comm import CollectiveFailed, Options, rank_seed
from terngrad.comm.agreement import differing_ranks
from terngrad.comm.consistency import check_replicas
from terngrad.quantize.levels import LevelQuantizer
from terngrad.train import baselines, checkpoints, models, run_folder, schedule, text
from terngrad.train import data as datasets
from terngrad.train.progress import Progress
from terngrad.util import netdev
from terngrad.util.differences import differences
from terngrad.util.files import atomic_write_text

CHECKPOINT_FORMAT = 2
DEFAULT_TIMEOUT = 300.0  # seconds any collective of a training run may wait
OPTIMIZERS = ("sgd", "momentum", "adam", "adamw")
SCHEDULES = schedule.SCHEDULES
#: fields that may change when a run is resumed (extending it, evaluating more often, moving it)
RESUMABLE_CHANGES = (
    "out", "steps", "eval_every", "workers_threads", "progress", "kernels", "checkpoint_every",
    "keep_checkpoints", "max_skipped_steps", "check_replicas_every", "timeout",
)  # fmt: skip


#: the optimiser's numbers: each finite and inside its range (the test, and the words for it)
_RANGES = {
    "lr": (lambda v: v > 0, "a positive finite number"),
    "momentum": (lambda v: 0 <= v < 1, "a number from 0 up to (not including) 1"),
    "weight_decay": (lambda v: v >= 0, "a finite number >= 0"),
    "lr_power": (lambda v: v > 0, "a positive finite number"),
    "dropout": (lambda v: 0 <= v < 1, "a number from 0 up to (not including) 1, or None"),
    "warmup_epochs": (lambda v: v >= 0, "a finite number >= 0"),
}


def check_pairing(model: str, dataset: str) -> None:
    """``ValueError`` unless a language model reads a text data set and an image model images."""
    if models.is_language_model(model) == datasets.is_text(dataset):
        return
    if models.is_language_model(model):
        raise ValueError(
            f"{model} is a language model: give it a text data set ({', '.join(datasets.TEXT)}), "
            f"not {dataset}"
        )
    raise ValueError(f"{dataset} is text: train a language model on it (gpt), not {model}")


@dataclass(frozen=True)
class TrainConfig:
    """Everything that defines a training run (JSON-serialisable, stored in every output)."""

    out: str
    model: str = "lenet"
    dataset: str = "mnist"
    data_dir: str | None = None
    workers: int = 4
    #: how gradients are exchanged; its ``seed`` seeds the whole run (data order,
    #: initialisation, rounding), its ``timeout`` bounds every collective
    exchange: Options = field(default_factory=lambda: Options(timeout=DEFAULT_TIMEOUT))
    #: PyTorch's own gradient averaging instead of terngrad's hook (``fp32``, ``fp16``,
    #: ``powersgd``: :mod:`terngrad.train.baselines`); the exchange's seed and timeout still hold
    baseline: str | None = None
    optimizer: str = "momentum"
    lr: float = 0.01
    momentum: float = 0.9
    weight_decay: float = 0.0
    lr_schedule: str = "constant"
    lr_power: float = 0.5
    #: a linear warm-up from lr/10 over this many first steps, or epochs (give one; 0: none)
    warmup_steps: int = 0
    warmup_epochs: float = 0.0
    batch_size: int | None = 64
    total_batch_size: int | None = None
    steps: int = 1000
    eval_every: int = 500
    dropout: float | None = None
    workers_threads: int | None = None
    progress: bool = True
    checkpoint_every: int | None = None  # None: at every evaluation
    keep_checkpoints: int = 3
    max_skipped_steps: int = 10  # consecutive steps with a NaN/Inf gradient before stopping
    check_replicas_every: int = 100  # 0: never

    def __post_init__(self) -> None:
        def fail(message: str) -> None:
            raise ValueError(message)

        models.default_input_shape(self.model)  # raises for an unknown model
        if self.dataset not in datasets.names():
            fail(f"unknown dataset {self.dataset!r}; choose one of: {', '.join(datasets.names())}")
        check_pairing(self.model, self.dataset)
        if not isinstance(self.exchange, Options):
            fail(f"exchange must be a terngrad.ddp.Options, got {type(self.exchange).__name__}")
        if self.baseline is not None and self.baseline not in baselines.BASELINES:
            fail(
                f"unknown baseline {self.baseline!r}; choose one of: "
                f"{', '.join(baselines.BASELINES)}"
            )
        if self.exchange.timeout is None:  # a run's collectives always wait a bounded time
            object.__setattr__(self, "exchange", self.exchange.replace(timeout=DEFAULT_TIMEOUT))
        if self.optimizer not in OPTIMIZERS:
            fail(f"unknown optimizer {self.optimizer!r}; choose one of: {', '.join(OPTIMIZERS)}")
        if self.lr_schedule not in SCHEDULES:
            fail(f"unknown lr schedule {self.lr_schedule!r}; choose one of: {', '.join(SCHEDULES)}")
        for name in ("workers", "steps", "eval_every", "keep_checkpoints", "max_skipped_steps"):
            if getattr(self, name) < 1:
                fail(f"{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        if (
            isinstance(self.warmup_steps, bool)
            or not isinstance(self.warmup_steps, int)
            or (self.warmup_steps < 0)
        ):
            fail(f"warmup-steps must be an integer >= 0, got {self.warmup_steps!r}")
        if self.warmup_steps and self.warmup_epochs:
            fail("give warmup-steps or warmup-epochs, not both")
        if self.checkpoint_every is not None and self.checkpoint_every < 1:
            fail(f"checkpoint-every must be at least 1, got {self.checkpoint_every}")
        if self.check_replicas_every < 0:
            fail(f"check-replicas-every must be >= 0 (0: never), got {self.check_replicas_every}")
        for name, (inside, what) in _RANGES.items():
            value = getattr(self, name)
            if name == "dropout" and value is None:
                continue
            number = isinstance(value, int | float) and not isinstance(value, bool)
            if not (number and math.isfinite(value) and inside(value)):
                fail(f"{name.replace('_', '-')} must be {what}, got {value!r}")
        if (self.batch_size is None) == (self.total_batch_size is None):
            fail("give exactly one of batch-size (per worker) and total-batch-size")
        if self.total_batch_size is not None and (
            self.total_batch_size < self.workers or self.total_batch_size % self.workers
        ):
            fail(
                f"total-batch-size {self.total_batch_size} does not split evenly over "
                f"{self.workers} workers"
            )
        if self.batch_size is not None and self.batch_size < 1:
            fail(f"batch-size must be at least 1, got {self.batch_size}")
        if not isinstance(self.out, str) or not self.out.strip():
            fail(f"out must name a folder, got {self.out!r}")

    @property
    def method(self) -> str:
        """How gradients are averaged, in a word: the baseline's name or the quantizer's."""
        return self.baseline or self.exchange.quantizer

    @property
    def worker_batch(self) -> int:
        """Examples per worker per step."""
        if self.batch_size is not None:
            return self.batch_size
        assert self.total_batch_size is not None
        return self.total_batch_size // self.workers

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable: the exchange's options nested under ``exchange``."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {**values, "exchange": self.exchange.to_dict()}

    def settings(self) -> dict[str, Any]:
        """Every setting by its one name (the exchange's beside the run's: no name is both)."""
        own = {k: v for k, v in self.to_dict().items() if k != "exchange"}
        return {**own, **self.exchange.to_dict()}

    def diff(self, other: TrainConfig, ignore: Collection[str] = ()) -> list[str]:
        """How ``other`` differs from this run: ``name=<other> instead of <this>``."""
        return differences(self.settings(), other.settings(), ignore)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainConfig:
        """The config :meth:`to_dict` wrote (also the flat layout of terngrad 0.1's files)."""
        values = dict(values)
        exchange = dict(values.pop("exchange", {}))
        for name in _LEGACY_EXCHANGE_FIELDS:
            if name in values:
                exchange[name] = values.pop(name)
        if "keep_last_fp32" in values:
            exchange["quantize_last"] = not values.pop("keep_last_fp32")
        exchange.setdefault("timeout", DEFAULT_TIMEOUT)
        return cls(**values, exchange=Options(**exchange))


#: options that were fields of TrainConfig itself before the exchange's options object
_LEGACY_EXCHANGE_FIELDS = (
    "quantizer", "quantizer_options", "topology", "kernels", "policy", "error_feedback",
    "min_numel", "seed", "timeout",
)  # fmt: skip


# --------------------------------------------------------------------------- one worker


def make_optimizer(cfg: TrainConfig, model: nn.Module) -> torch.optim.Optimizer:
    """SGD (plain or with momentum), Adam (L2 weight decay in the gradient), or AdamW
    (decoupled weight decay, Loshchilov & Hutter 2019, on the weight matrices and embeddings
    only: biases and layer-norm gains keep theirs, as GPT-2 and BERT train)."""
    params = list(model.parameters())
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    if cfg.optimizer == "adamw":
        groups = [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]
        return torch.optim.AdamW(groups, lr=cfg.lr)
    momentum = cfg.momentum if cfg.optimizer == "momentum" else 0.0
    return torch.optim.SGD(params, lr=cfg.lr, momentum=momentum, weight_decay=cfg.weight_decay)


def _schedule(cfg: TrainConfig, optimizer, train_examples: int):
    """``LambdaLR`` over :func:`terngrad.train.schedule.lr_factor`: ``constant``, ``poly`` or
    ``cosine``, after a linear warm-up from lr/10 where one is asked for."""
    epoch = schedule.steps_per_epoch(train_examples, cfg.workers, cfg.worker_batch)
    warmup = schedule.warmup_length(cfg.warmup_steps, cfg.warmup_epochs, epoch)
    factor = schedule.lr_factor(cfg.lr_schedule, cfg.steps, cfg.lr_power, warmup)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def load_data(cfg: TrainConfig, **options: Any) -> datasets.DataSet | text.TextSet:
    """The run's data set, shaped for its model (an image size, or a language model's context)."""
    shape = models.default_input_shape(cfg.model)
    return datasets.load(
        cfg.dataset, cfg.data_dir, synthetic_shape=shape, synthetic_classes=10,
        context=shape[0], **options,
    )  # fmt: skip


def _evaluate(model: nn.Module, data: datasets.DataSet | text.TextSet, rank: int, world: int):
    """Test loss (nats per prediction) and accuracy over the whole test set (a language model:
    every position of the validation windows, next-character accuracy), each rank scoring its
    share."""
    model.eval()
    index = torch.arange(rank, data.test_size, world)
    totals = torch.zeros(3, dtype=torch.float64)  # loss sum, correct, count
    chunk_size = 64 if isinstance(data, text.TextSet) else 512
    with torch.no_grad():
        for chunk in index.split(chunk_size):
            x, y = data.test_batch(chunk)
            logits = model(x)
            totals[0] += float(models.loss(logits, y, reduction="sum"))
            totals[1] += float((logits.argmax(-1) == y).sum())
            totals[2] += y.numel()
    model.train()
    dist.all_reduce(totals)
    return float(totals[0] / totals[2]), float(totals[1] / totals[2])


class TrainingFailed(RuntimeError):
    """Training cannot go on (too many non-finite steps); the checkpoints are intact."""


#: what a training checkpoint holds besides its format and config, and of which type
_CONTENTS = {
    "step": int, "seconds": float, "model": dict, "optimizer": dict, "schedule": dict,
    "hook_states": list, "rng_states": list,
}  # fmt: skip


def load_checkpoint(path: Path, cfg: TrainConfig) -> dict[str, Any]:
    """A checkpoint of the same run (fields other than ``RESUMABLE_CHANGES`` must match), with
    everything a worker reads from it."""
    ckpt = checkpoints.load(path)
    if ckpt.get("format") != CHECKPOINT_FORMAT or not isinstance(ckpt.get("config"), dict):
        raise ValueError(f"{path} is not a terngrad training checkpoint of this version")
    for key, kind in _CONTENTS.items():
        value = ckpt.get(key)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise ValueError(
                f"{path} is not a whole terngrad training checkpoint: its {key!r} is "
                f"{'missing' if key not in ckpt else type(value).__name__}"
            )
    try:
        saved = TrainConfig.from_dict(ckpt["config"])
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{path} holds a configuration this version cannot read: {exc}") from None
    differing = saved.diff(cfg, RESUMABLE_CHANGES)
    if differing:
        raise ValueError(
            f"{path} belongs to a different run (this run's settings instead of the "
            f"checkpoint's: {'; '.join(differing)}): resume with the same settings or choose "
            "another --out"
        )
    ranks = (len(ckpt["hook_states"]), len(ckpt["rng_states"]))
    if ranks != (saved.workers, saved.workers) or not 0 <= ckpt["step"] <= 2**62:
        raise ValueError(
            f"{path} is not a whole terngrad training checkpoint: it holds {ranks[0]} hook "
            f"states and {ranks[1]} generators for {saved.workers} workers, at step "
            f"{ckpt['step']}"
        )
    return ckpt


def resume_point(cfg: TrainConfig, resume: str | None = None) -> Path | None:
    """The checkpoint a run starts from: ``resume`` if given, else the newest in ``cfg.out``."""
    if resume is not None:
        return Path(resume)
    return checkpoints.latest(Path(cfg.out))


#: settings that may differ between the nodes of one run (paths, threads, what is printed)
PER_NODE = ("out", "data_dir", "workers_threads", "progress", "kernels")


def check_same_run(cfg: TrainConfig) -> None:
    """Fail on every rank, naming the differences, unless all ranks run the same settings
    (a collective; it runs before anything else, so misconfigured nodes stop at once)."""
    problems = differing_ranks(cfg.settings(), ignore=PER_NODE)
    if problems:
        raise ValueError(
            "the ranks were started with different settings (compared with rank 0): "
            + "; ".join(problems)
        )


def train_worker(cfg: TrainConfig, resume: str | None = None) -> dict[str, Any] | None:
    """One worker's training loop; the process group must be initialised. Returns the summary
    on rank 0, ``None`` elsewhere."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if world != cfg.workers:
        raise RuntimeError(f"the run asks for {cfg.workers} workers but {world} joined")
    check_same_run(cfg)
    out = Path(cfg.out)
    data = load_data(cfg, seed=cfg.exchange.seed)
    torch.manual_seed(
        cfg.exchange.seed
    )  # identical initial replicas (DDP also broadcasts rank 0's)
    model = models.build(cfg.model, data.input_shape, data.num_classes, cfg.dropout)
    if cfg.baseline is None:
        ddp = nn.parallel.DistributedDataParallel(model)
        state = terngrad.ddp.register(ddp, options=cfg.exchange)
    else:  # PyTorch's own averaging: no hook state, nothing skipped, no bytes counted by us
        ddp, state = baselines.wrap(model, cfg.baseline, cfg.exchange.seed), None
    optimizer = make_optimizer(cfg, model)
    lr_schedule = _schedule(cfg, optimizer, data.train_size)
    sampler = datasets.ShardSampler(
        data.train_size, rank, world, cfg.worker_batch, cfg.exchange.seed
    )

    start, elapsed = 0, 0.0
    clock = _StepClock(netdev.interface_from_env())
    checkpoint_path = resume_point(cfg, resume)
    if checkpoint_path is not None:
        ckpt = load_checkpoint(checkpoint_path, cfg)
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        lr_schedule.load_state_dict(ckpt["schedule"])
        if state is not None:
            state.load_state_dict(ckpt["hook_states"][rank])
        torch.set_rng_state(ckpt["rng_states"][rank])  # dropout draws continue where they were
        start, elapsed = ckpt["step"], ckpt["seconds"]
        clock.train_seconds = ckpt.get("train_seconds", elapsed)
        clock.wire_bytes = (ckpt.get("wire_bytes") or [0] * world)[rank]
    if state is not None and start < cfg.steps:  # every step, resumed or not, in one layout
        state.settle_buckets(ddp, data.train_batch(sampler.batch(start), torch.Generator())[0])
    every = cfg.checkpoint_every or cfg.eval_every

    progress = Progress(cfg.steps, start, enabled=cfg.progress and rank == 0)
    metrics_path = out / "metrics.jsonl"
    if rank == 0:
        _truncate_metrics(metrics_path, start)
    began = time.perf_counter() - elapsed
    losses: list[float] = []
    accuracy = math.nan
    skipped_in_a_row = 0
    for step in range(start, cfg.steps):
        clock.start()
        x, y = data.train_batch(
            sampler.batch(step),
            torch.Generator().manual_seed(rank_seed(cfg.exchange.seed + step, rank)),
        )
        optimizer.zero_grad(set_to_none=True)
        loss = models.loss(ddp(x), y)
        try:
            loss.backward()
        except RuntimeError as exc:  # DDP wraps the hook's error in its own text
            raise _hook_error(exc) from None
        if state is None or not state.last_step_skipped:
            optimizer.step()
            skipped_in_a_row = 0
        else:
            skipped_in_a_row += 1
            if skipped_in_a_row >= cfg.max_skipped_steps:  # every rank: same skip flags
                last = checkpoints.latest(out)
                raise TrainingFailed(
                    f"{skipped_in_a_row} consecutive steps (up to step {step + 1}) had a NaN or "
                    "Inf gradient on some rank and were skipped; stopping. The last good "
                    f"checkpoint is {last or 'none (none was written yet)'}; check the data "
                    "and the learning rate (a new learning rate needs a new --out)"
                )
        lr = optimizer.param_groups[0]["lr"]  # this step's, before the schedule moves it
        lr_schedule.step()
        losses.append(loss.item())
        clock.stop()
        done = step + 1
        if cfg.check_replicas_every and done % cfg.check_replicas_every == 0:
            check_replicas(model, step=done)
        if done % cfg.eval_every == 0 or done == cfg.steps:
            test_loss, accuracy = _evaluate(model, data, rank, world)
            seconds = time.perf_counter() - began
            record = {
                "step": done,
                "loss": test_loss,
                "accuracy": accuracy,
                "train_loss": sum(losses) / len(losses),
                "lr": lr,
                "bytes_sent": state.stats.bytes_sent if state is not None else None,
                "seconds": seconds,
                "train_seconds": clock.train_seconds,
                "wire_bytes": clock.mean_wire_bytes(),
            }
            if isinstance(data, text.TextSet):
                record["bits_per_char"] = text.bits_per_character(test_loss)
            losses = []
            if rank == 0:  # first the record, then the checkpoint: a crash between the two
                with metrics_path.open("a") as f:  # leaves a record that resuming drops again
                    f.write(json.dumps(record) + "\n")
                progress.note(f"step {done}: {_scores(record)}")
        if (done % every == 0 or done == cfg.steps) and not skipped_in_a_row:
            seconds = time.perf_counter() - began  # (no checkpoints while steps are skipped)
            _save_checkpoint(cfg, out, model, optimizer, lr_schedule, state, done, seconds, clock)
        progress.update(done, loss.item(), accuracy, _bytes_so_far(state, clock))
    progress.close()
    if cfg.steps <= start:  # nothing left to train: evaluate what the checkpoint holds
        _, accuracy = _evaluate(model, data, rank, world)
        began = time.perf_counter() - elapsed  # (that evaluation is not the run's time)
    wire = clock.mean_wire_bytes()  # a collective: every rank
    if rank != 0:
        return None
    return _finish(cfg, out, state, accuracy, time.perf_counter() - began, clock, wire)


def _scores(record: dict[str, Any]) -> str:
    """An evaluation in words: bits per character for a language model, else test accuracy."""
    if "bits_per_char" in record:
        return (
            f"validation loss {record['loss']:.4f} ({record['bits_per_char']:.3f} bits/char), "
            f"next-char accuracy {100 * record['accuracy']:.2f}%"
        )
    return f"test accuracy {100 * record['accuracy']:.2f}%, test loss {record['loss']:.4f}"


class _StepClock:
    """Seconds spent in training steps (evaluations and checkpoints left out) and, inside the
    testbed, the bytes this rank's interface sent during them."""

    def __init__(self, interface: str | None) -> None:
        self.interface = interface
        self.train_seconds = 0.0
        self.wire_bytes = 0
        self._began, self._sent = 0.0, 0

    def start(self) -> None:
        self._began = time.perf_counter()
        if self.interface:
            self._sent = netdev.tx_bytes(self.interface)

    def stop(self) -> None:
        self.train_seconds += time.perf_counter() - self._began
        if self.interface:
            self.wire_bytes += netdev.tx_bytes(self.interface) - self._sent

    def all_wire_bytes(self) -> list[int] | None:
        """Every rank's count (a collective), ``None`` outside the testbed."""
        if not self.interface:
            return None
        counts = torch.tensor([0] * dist.get_world_size(), dtype=torch.int64)
        counts[dist.get_rank()] = self.wire_bytes
        dist.all_reduce(counts)
        return counts.tolist()

    def mean_wire_bytes(self) -> float | None:
        """Bytes per rank sent on the wire during the steps so far (a collective)."""
        counts = self.all_wire_bytes()
        return sum(counts) / len(counts) if counts else None


def _bytes_so_far(state, clock: _StepClock) -> int:
    """What the progress line shows: the hook's count, else this rank's wire bytes."""
    return state.stats.bytes_sent if state is not None else clock.wire_bytes


def _hook_error(exc: RuntimeError) -> RuntimeError:
    """The terngrad error inside DDP's wrapping, as one line (else ``exc`` itself)."""
    text = str(exc)
    start = text.find("terngrad: rank ")
    if start < 0:
        return exc
    return CollectiveFailed(text[start:].splitlines()[0])


def _save_checkpoint(cfg, out, model, optimizer, schedule, state, step, seconds, clock) -> None:
    """All ranks' hook states and generators go to rank 0, which writes one checkpoint
    atomically and keeps the newest ``cfg.keep_checkpoints``. (PyTorch's PowerSGD keeps its
    error feedback in its own state, which is not saved: a resumed run starts it afresh.)"""
    hook_states: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(hook_states, state.state_dict() if state is not None else None)
    wire = clock.all_wire_bytes()
    rng_states: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(rng_states, torch.get_rng_state())
    if dist.get_rank() == 0:
        checkpoint = {
            "format": CHECKPOINT_FORMAT,
            "config": cfg.to_dict(),
            "step": step,
            "seconds": seconds,
            "train_seconds": clock.train_seconds,
            "wire_bytes": wire,
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "schedule": schedule.state_dict(),
            "hook_states": hook_states,
            "rng_states": rng_states,
        }
        checkpoints.save(checkpoints.path_for(out, step), checkpoint)
        checkpoints.prune(out, cfg.keep_checkpoints)
    dist.barrier()


def _truncate_metrics(path: Path, step: int) -> None:
    """Keep the evaluations up to ``step`` (the checkpoint we resume from), drop the rest."""
    if not path.exists():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            if json.loads(line)["step"] <= step:
                kept.append(line)
        except (json.JSONDecodeError, KeyError, TypeError):
            continue  # a record cut short by a crash
    atomic_write_text(path, "".join(line + "\n" for line in kept))


def _finish(cfg, out: Path, state, accuracy: float, seconds: float, clock, wire) -> dict:
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    stats = state.stats if state is not None else None
    summary = {
        "method": cfg.method,
        "accuracy": accuracy,
        "best_accuracy": max((m["accuracy"] for m in metrics), default=accuracy),
        # the last evaluation's test loss (nats per prediction) and the lowest one
        "loss": metrics[-1]["loss"] if metrics else None,
        "best_loss": min((m["loss"] for m in metrics), default=None),
        "steps": cfg.steps,
        # what terngrad's hook handed to the collectives (None for PyTorch's baselines)
        "bytes_sent_per_rank": stats.bytes_sent if stats else None,
        "bytes_received_per_rank": stats.bytes_received if stats else None,
        "bytes_sent_per_step": stats.bytes_sent_per_step if stats else None,
        "skipped_steps": stats.skipped_steps if stats else 0,
        # inside the testbed: what the interfaces sent during the steps, mean over ranks
        "wire_bytes_per_rank": wire,
        "wire_bytes_per_step": wire / cfg.steps if wire is not None else None,
        "seconds": seconds,
        "train_seconds": clock.train_seconds,
        "config": cfg.to_dict(),
    }
    if metrics and "bits_per_char" in metrics[-1]:
        summary["bits_per_char"] = metrics[-1]["bits_per_char"]
        summary["best_bits_per_char"] = min(m["bits_per_char"] for m in metrics)
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    from terngrad.train.report import write_curves  # matplotlib: rank 0 only, at the end

    write_curves({cfg.method: metrics}, out / "curves.png", title=_title(cfg))
    return summary


def _title(cfg: TrainConfig) -> str:
    x = cfg.exchange
    how = f"PyTorch {cfg.baseline}" if cfg.baseline else f"{x.quantizer}/{x.topology}"
    return (
        f"{cfg.model} on {cfg.dataset}, {cfg.workers} workers, {how}, "
        f"batch {cfg.worker_batch}/worker"
    )


# --------------------------------------------------------------------------- launching


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _threads(cfg: TrainConfig, local_workers: int) -> int:
    return cfg.workers_threads or max(1, (os.cpu_count() or 1) // local_workers)


def _spawned_worker(
    rank: int, cfg: TrainConfig, port: int, folder: str, resume: str | None
) -> None:
    torch.set_num_threads(_threads(cfg, cfg.workers))
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",  # loopback: nothing outside this machine joins
        rank=rank,
        world_size=cfg.workers,
        timeout=datetime.timedelta(seconds=cfg.exchange.timeout),
    )
    try:
        summary = train_worker(cfg, resume)
    finally:
        dist.destroy_process_group()
    if summary is not None:
        Path(folder, "summary.json").write_text(json.dumps(summary))


def prepare_out(cfg: TrainConfig, resume: str | None = None) -> Path:
    """Every check of ``cfg.out`` that writes nothing (:func:`launch` makes them again once it
    holds the folder): a folder, or none yet, that can be written; the checkpoint the run would
    resume from is whole and of this run; no history is mixed with another; no other run's
    outputs are overwritten. ``ValueError`` with one line otherwise."""
    out = Path(cfg.out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} exists and is not a folder")
    parent = next(p for p in (out.absolute(), *out.absolute().parents) if p.exists())
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"cannot write into --out {out}: {parent} is not a writable folder")
    start = resume_point(cfg, resume)
    if start is None:
        if run_folder.foreign_outputs(out) and not _same_run(out, cfg):
            names = ", ".join(run_folder.foreign_outputs(out))
            raise ValueError(
                f"--out {out} holds another run's outputs ({names}) and no checkpoint to "
                "resume from: choose another --out, or delete them"
            )
        return out
    try:
        ckpt = load_checkpoint(start, cfg)  # fail now, not in every worker
    except ValueError as exc:
        if resume is not None or "is damaged" not in str(exc):
            raise
        older = [s for s in checkpoints.steps(out) if s < checkpoints.steps(out)[-1]]
        then = f"resume from the one before it (step {older[-1]})" if older else "start afresh"
        raise ValueError(
            f"{exc}: move it out of --out {out} (or delete it) and run the same command again "
            f"to {then}"
        ) from None
    if start.absolute().parent != out.absolute():
        held = [checkpoints.path_for(out, s).name for s in checkpoints.steps(out)]
        held += run_folder.foreign_outputs(out)
        if held:
            raise ValueError(
                f"--out {out} already holds a run ({', '.join(held[:3])}): resuming into it "
                f"from {start}, a checkpoint of another folder, would mix the two; give an "
                "empty --out"
            )
        return out
    newer = [s for s in checkpoints.steps(out) if s > ckpt["step"]]
    if newer:
        raise ValueError(
            f"--out {out} holds checkpoints newer than {start} (step {newer[-1]} > "
            f"{ckpt['step']}): resuming from the older one would mix two histories; choose "
            "another --out, or delete the newer checkpoints first"
        )
    return out


def _same_run(out: Path, cfg: TrainConfig) -> bool:
    """Whether ``out/config.json`` (written when a run starts) is this run's: the outputs of a
    run killed before its first checkpoint are its own, and are started afresh."""
    try:
        saved = TrainConfig.from_dict(json.loads((out / "config.json").read_text())["config"])
    except (OSError, ValueError, TypeError, KeyError):
        return False
    return not saved.diff(cfg, RESUMABLE_CHANGES)


def write_run_config(cfg: TrainConfig, resume: str | None = None) -> Path:
    """``cfg.out/config.json``: the run's settings (what marks the folder as this run's, and
    what torchrun's workers read)."""
    path = Path(cfg.out) / "config.json"
    atomic_write_text(path, json.dumps({"config": cfg.to_dict(), "resume": resume}))
    return path


def seed_metrics(cfg: TrainConfig, resume: str | None) -> None:
    """A run resumed into an empty folder from another folder's checkpoint starts its
    ``metrics.jsonl`` with that folder's evaluations up to the checkpoint's step."""
    if resume is None or Path(resume).absolute().parent == Path(cfg.out).absolute():
        return
    source = Path(resume).parent / "metrics.jsonl"
    if source.exists() and not (Path(cfg.out) / "metrics.jsonl").exists():
        step = checkpoints.load(Path(resume))["step"]
        atomic_write_text(Path(cfg.out) / "metrics.jsonl", source.read_text())
        _truncate_metrics(Path(cfg.out) / "metrics.jsonl", step)


#: processes one machine may run per core: beyond, the ranks mostly wait on each other
MAX_WORKERS_PER_CORE = 8


def check_launch(
    cfg: TrainConfig, nnodes: int = 1, node_rank: int | None = None,
    rdzv_endpoint: str | None = None, max_restarts: int = 0,
) -> None:  # fmt: skip
    """The checks of a launch that need neither the data nor the folder."""
    if max_restarts and nnodes == 1 and rdzv_endpoint is None:
        raise ValueError(
            "--max-restarts needs torchrun's agent (--nnodes or --rdzv-endpoint); on one "
            "machine, run the same command again to resume"
        )
    if cfg.workers % nnodes:
        raise ValueError(f"--workers {cfg.workers} does not split evenly over {nnodes} nodes")
    if node_rank is not None and not 0 <= node_rank < nnodes:
        raise ValueError(
            f"--node-rank {node_rank} is not a node of a {nnodes}-node run: give 0 to {nnodes - 1}"
        )
    local, cores = cfg.workers // nnodes, os.cpu_count() or 1
    if local > MAX_WORKERS_PER_CORE * cores:
        raise ValueError(
            f"--workers {cfg.workers} would start {local} processes on this machine's {cores} "
            f"cores (at most {MAX_WORKERS_PER_CORE * cores}: {MAX_WORKERS_PER_CORE} a core); "
            "spread them over machines with --nnodes"
        )
    if rdzv_endpoint is not None:
        host, _, port = rdzv_endpoint.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(
                f"--rdzv-endpoint {rdzv_endpoint!r} is not HOST:PORT (a port from 1 to 65535)"
            )
    if cfg.exchange.kernels == "triton" and cfg.baseline is None:
        raise ValueError(
            "--kernels triton runs on CUDA tensors, and terngrad train trains on the CPU: "
            "use --kernels auto, numba or torch"
        )


def check_data(cfg: TrainConfig) -> None:
    """The data set is there, and each worker's shard holds at least one batch."""
    data = load_data(cfg, synthetic_size=1)
    size = datasets.SYNTHETIC_SIZE if cfg.dataset == "synthetic" else data.train_size
    shard = size // cfg.workers
    if cfg.worker_batch > shard:
        raise ValueError(
            f"a batch of {cfg.worker_batch} per worker is larger than each worker's shard of "
            f"{cfg.dataset} ({shard} of its {size} training examples, over {cfg.workers} "
            f"workers): give a batch of at most {shard}, or fewer workers"
        )


def launch(
    cfg: TrainConfig,
    *,
    nnodes: int = 1,
    node_rank: int | None = None,
    rdzv_endpoint: str | None = None,
    resume: str | None = None,
    max_restarts: int = 0,
) -> dict[str, Any] | None:
    """Train with ``cfg.workers`` processes on this machine, or hand them to torchrun's agent
    when ``nnodes > 1`` or a rendezvous endpoint is given (it restarts the workers up to
    ``max_restarts`` times when one fails; they resume from the newest checkpoint). Starts from
    checkpoint ``resume`` if given, else from the newest in ``cfg.out``. Every check runs
    before anything is written; the run holds ``cfg.out`` (:func:`run_folder.claim`) until it
    ends. Returns rank 0's summary (``None`` on the other nodes of a cluster)."""
    check_launch(cfg, nnodes, node_rank, rdzv_endpoint, max_restarts)
    check_data(cfg)  # a missing data set fails here, once, with its one-line message
    prepare_out(cfg, resume)
    lock = run_folder.LOCK if nnodes == 1 else f".terngrad.{socket.gethostname()}.lock"
    with run_folder.claim(Path(cfg.out), lock=lock):
        prepare_out(cfg, resume)  # again, now that no other run can change the folder
        run_folder.remove_leftovers(Path(cfg.out))
        seed_metrics(cfg, resume)
        config_file = write_run_config(cfg, resume)
        if cfg.exchange.kernels in ("auto", "numba"):
            quantizer = cfg.exchange.make_quantizer()
            # compile once here, not in every worker
            kernels.warm_up(levels=isinstance(quantizer, LevelQuantizer))
        if nnodes == 1 and rdzv_endpoint is None:
            with tempfile.TemporaryDirectory() as folder:
                _spawn(cfg, folder, resume)
                return json.loads(Path(folder, "summary.json").read_text())
        from torch.distributed import run as torchrun

        args = [
            f"--nnodes={nnodes}",
            f"--nproc-per-node={cfg.workers // nnodes}",
            f"--max-restarts={max_restarts}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={rdzv_endpoint or '127.0.0.1:29400'}",
        ]
        if node_rank is not None:
            args.append(f"--node-rank={node_rank}")
        torchrun.main([*args, "-m", "terngrad.train.trainer", str(config_file)])
        summary = Path(cfg.out) / "summary.json"
        return json.loads(summary.read_text()) if summary.exists() else None


#: seconds the other workers get to stop after one failed, before SIGTERM, then as many
#: before SIGKILL (a stopped or stuck process takes no SIGTERM; torch waits 30 s by default)
STOP_GRACE = 2.0


def _spawn(cfg: TrainConfig, folder: str, resume: str | None) -> None:
    """``torch.multiprocessing.spawn``, but workers that do not stop are killed within
    ``2 * STOP_GRACE`` seconds once one has failed (and torch's warnings about it are kept
    quiet: the CLI says it in one line)."""
    log = logging.getLogger("torch.multiprocessing.spawn")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        # a fork server that has imported torch, terngrad and the plots (rank 0 draws the
        # curves) once, for every launch of this process: each worker is forked from it at
        # once instead of importing torch anew (seconds a worker); the server is a fresh
        # interpreter, so no thread of this process is ever forked
        multiprocessing.set_forkserver_preload([__name__, "terngrad.train.report"])
        context = torch.multiprocessing.start_processes(
            _spawned_worker, args=(cfg, _free_port(), folder, resume), nprocs=cfg.workers,
            join=False, start_method="forkserver",
        )  # fmt: skip
        while not context.join(grace_period=STOP_GRACE):
            pass
    finally:
        log.setLevel(level)


def _torchrun_worker(config_file: str) -> None:
    """Entry point of a worker that torchrun started (environment rendezvous)."""
    saved = json.loads(Path(config_file).read_text())
    cfg = TrainConfig.from_dict(saved["config"])
    # a restarted worker (torchrun --max-restarts) goes on from the newest checkpoint
    restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0
    restarted = restarted and checkpoints.latest(Path(cfg.out)) is not None
    local = int(os.environ.get("LOCAL_WORLD_SIZE", cfg.workers))
    torch.set_num_threads(_threads(cfg, local))
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=cfg.exchange.timeout))
    try:
        train_worker(cfg, None if restarted else saved["resume"])
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    _torchrun_worker(sys.argv[1])
