"""A training run's settings: :class:`TrainConfig`, checked once where it is made, written into
every output (:meth:`~TrainConfig.to_dict`) and read back from this version's files and older
ones' (:meth:`~TrainConfig.from_dict`).

Each field is a :func:`~terngrad.util.settings.setting`: its default, help, group and range are
written here once, and ``terngrad train``'s flags are made from them (:mod:`terngrad.cli.flags`).
The run's ``seed`` (initial weights, data order, every random draw of the exchange) and
``timeout`` (every collective's wait) are the run's own, so a PyTorch baseline takes its data
order from the run, not from the hook's options; :attr:`TrainConfig.hook_options` hands them to
the hook.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from terngrad.comm import Options
from terngrad.comm.spec.method_spec import FrozenVariance, LocalVariance, Method
from terngrad.comm.spec.options import MAX_TIMEOUT
from terngrad.local_steps import AUTO_PROBE_STEPS, MAX_COMM_SHARE, OUTER_LR, OUTER_MOMENTUM
from terngrad.train import baselines, models, schedule
from terngrad.train import data as datasets
from terngrad.util.differences import differences
from terngrad.util.settings import (
    FRACTION,
    INT64,
    NON_NEGATIVE,
    NON_NEGATIVE_INT,
    POSITIVE,
    POSITIVE_INT,
    POSITIVE_INT_OR_AUTO,
    SHARE,
    Range,
    check_settings,
    setting,
)

DEFAULT_TIMEOUT = 300.0  # seconds any collective of a training run may wait
DEFAULT_BATCH = 64  # examples per worker unless a batch size is given
OPTIMIZERS = ("sgd", "momentum", "adam", "adamw", "frozen-adamw", "local-adamw")
SCHEDULES = schedule.SCHEDULES
#: fields that may change when a run is resumed (extending it, evaluating more often, moving it)
RESUMABLE_CHANGES = (
    "out", "steps", "eval_every", "workers_threads", "progress", "kernels", "checkpoint_every",
    "keep_checkpoints", "max_skipped_steps", "check_replicas_every", "timeout", "stop_at_accuracy",
    "stop_at_loss",
)  # fmt: skip
#: settings that may differ between the nodes of one run (paths, threads, what is printed)
PER_NODE = ("out", "data_dir", "workers_threads", "progress", "kernels")
#: the exchange's options that a training run sets itself (:attr:`TrainConfig.hook_options`)
RUN_LEVEL = ("seed", "timeout")

_SECONDS = Range(float, lambda v: 0 < v <= MAX_TIMEOUT, "a positive number of seconds, at most "
                 f"{MAX_TIMEOUT:.0f} (a year)")  # fmt: skip


def default_dataset(model: str) -> str:
    """The data set a model trains on unless told: pydoc for a language model, else MNIST."""
    return "pydoc" if models.is_language_model(model) else "mnist"


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


_MODEL, _WORKERS, _OPT, _OUT, _RELY, _RUN = (
    "model and data", "workers", "optimisation", "output", "reliability", "run",
)  # fmt: skip


@dataclass(frozen=True)
class TrainConfig:
    """Everything that defines a training run (JSON-serialisable, stored in every output)."""

    out: str = setting(help="output folder (resumes from its checkpoint)", group=_OUT)
    model: str = setting("lenet", "the network", _MODEL, choices=models.names)
    #: ``None``: the model's own (:func:`default_dataset`)
    dataset: str | None = setting(None, "the data set", _MODEL, choices=datasets.names,
                                  default_words="the model's own: mnist; gpt: pydoc")  # fmt: skip
    data_dir: str | None = setting(None, "folder of the data set's files (CIFAR-10: required)",
                                   _MODEL)  # fmt: skip
    workers: int = setting(4, "processes (total)", _WORKERS, POSITIVE_INT)
    #: how gradients are exchanged (its seed and timeout are the run's: :attr:`hook_options`)
    exchange: Options = field(default_factory=Options)
    baseline: str | None = setting(
        None,
        "PyTorch's own averaging instead of terngrad's hook: DDP's fp32 all-reduce, "
        "fp16_compress_hook, or powerSGD_hook (one bucket); the exchange flags are then unused",
        "baseline",
        choices=lambda: baselines.BASELINES,
    )
    #: PowerSGD's ``matrix_approximation_rank`` (the method ``powersgd-r8``: 8)
    powersgd_rank: int = setting(
        baselines.POWERSGD_RANK, "with --baseline powersgd: the rank of its low-rank factors",
        "baseline", POSITIVE_INT, metavar="R",
    )  # fmt: skip
    optimizer: str = setting("momentum", "", _OPT, choices=lambda: OPTIMIZERS)
    lr: float = setting(0.01, "learning rate", _OPT, POSITIVE)
    momentum: float = setting(0.9, "[0, 1)", _OPT, FRACTION)
    weight_decay: float = setting(0.0, "", _OPT, NON_NEGATIVE)
    lr_schedule: str = setting("constant", "", _OPT, choices=lambda: SCHEDULES)
    lr_power: float = setting(0.5, "poly schedule power", _OPT, POSITIVE)
    #: a linear warm-up from lr/10 over this many first steps, or epochs (give one; 0: none)
    warmup_steps: int = setting(0, "linear warm-up from lr/10 over the first N steps", _OPT,
                                NON_NEGATIVE_INT)  # fmt: skip
    warmup_epochs: float = setting(
        0.0, "the same warm-up, in epochs of the training set (the ORQ paper: 5)", _OPT,
        NON_NEGATIVE,
    )  # fmt: skip
    #: frozen-adamw: the steps of plain AdamW before its variance freezes and the hook
    #: exchanges its momentum (terngrad.optim.FrozenVarianceAdamW)
    freeze_after: int = setting(
        0, "frozen-adamw: AdamW for the first N steps, then the variance frozen and the "
        "momentum exchanged", _OPT, NON_NEGATIVE_INT, metavar="N",
    )  # fmt: skip
    #: local-adamw: the ranks average their variances at steps 1, 2, 4, ... below N and every
    #: N-th step (terngrad.optim.LocalVarianceAdamW); None: 100
    variance_sync: int | None = setting(
        None, "local-adamw: the ranks average the variances of their own gradients at steps "
        "1, 2, 4, ... below N and every N-th step", _OPT, POSITIVE_INT, metavar="N",
        default_words="100",
    )  # fmt: skip
    #: local steps (DiLoCo, :class:`terngrad.diloco.DiLoCo`): the inner steps between two
    #: averages of what the replicas moved; 1: the exchange every step (the DDP hook)
    local_steps: int | str = setting(
        1, "inner steps between outer steps: each rank trains its own replica H steps, then the "
        "ranks average what it moved through the exchange (DiLoCo); 1: every step; auto: H "
        "measured so that the exchange takes at most --max-comm-share of the time", _OPT,
        POSITIVE_INT_OR_AUTO, metavar="H",
    )  # fmt: skip
    #: the outer exchange behind the next inner steps, its update one outer step late
    outer_overlap: bool = setting(
        False, "with --local-steps: the outer exchange runs while the next H inner steps "
        "compute, its update applied one outer step late", _OPT,
    )  # fmt: skip
    max_comm_share: float = setting(
        MAX_COMM_SHARE, "with --local-steps auto: the largest share of the time the outer "
        "exchange may take", _OPT, SHARE,
    )  # fmt: skip
    outer_lr: float = setting(OUTER_LR, "with --local-steps: the outer SGD's learning rate", _OPT,
                              POSITIVE)  # fmt: skip
    outer_momentum: float = setting(
        OUTER_MOMENTUM,
        "with --local-steps: the outer SGD's Nesterov momentum, [0, 1) (0: plain SGD, "
        "with --outer-lr 1 the replicas' average)",
        _OPT,
        FRACTION,
    )
    #: examples per worker; ``None`` with no total either: :data:`DEFAULT_BATCH`
    batch_size: int | None = setting(None, "examples per worker", _OPT, POSITIVE_INT,
                                     default_words=str(DEFAULT_BATCH))  # fmt: skip
    total_batch_size: int | None = setting(None, "split over the workers", _OPT, POSITIVE_INT)
    steps: int = setting(1000, "training steps", _OPT, POSITIVE_INT)
    eval_every: int = setting(500, "steps between evaluations", _OPT, POSITIVE_INT)
    #: a time-to-accuracy run: stop after the first evaluation that reaches this test accuracy
    stop_at_accuracy: float | None = setting(
        None, "stop after the first evaluation whose test accuracy reaches this fraction "
        "(0.98: 98%%)", _OPT, Range(float, lambda v: 0 < v <= 1, "a fraction above 0, at most 1"),
    )  # fmt: skip
    #: the same with a test loss (a language model's validation loss): stop after the first
    #: evaluation whose test loss is at most this
    stop_at_loss: float | None = setting(
        None, "stop after the first evaluation whose test loss is at most this (nats per "
        "prediction)", _OPT, Range(float, lambda v: 0 < v < math.inf, "a positive number"),
    )  # fmt: skip
    dropout: float | None = setting(
        None, "dropout ratio of the model's dropout layers, [0, 1)", _MODEL, FRACTION
    )
    workers_threads: int | None = setting(
        None, "torch threads per worker", _WORKERS, POSITIVE_INT,
        default_words="cores / workers on this machine",
    )  # fmt: skip
    progress: bool = setting(True, "a progress line", _OUT, flag="")  # the CLI's --quiet
    checkpoint_every: int | None = setting(
        None, "steps between checkpoints", _RELY, POSITIVE_INT, default_words="--eval-every"
    )
    keep_checkpoints: int = setting(3, "newest checkpoints kept", _RELY, POSITIVE_INT)
    max_skipped_steps: int = setting(
        10, "consecutive NaN/Inf steps before training stops", _RELY, POSITIVE_INT
    )
    check_replicas_every: int = setting(
        100, "steps between replica checksum checks, 0 never", _RELY, NON_NEGATIVE_INT
    )
    seed: int = setting(
        0, "seed of the run: initial weights, data order, every random draw", _RUN, INT64
    )
    timeout: float = setting(
        DEFAULT_TIMEOUT, "seconds a collective may wait for a dead or stuck rank", _RUN, _SECONDS
    )

    def __post_init__(self) -> None:
        def fail(message: str) -> None:
            raise ValueError(message)

        models.default_input_shape(self.model)  # raises for an unknown model
        if self.dataset is None:
            object.__setattr__(self, "dataset", default_dataset(self.model))
        check_settings(self)
        check_pairing(self.model, self.dataset)
        if not isinstance(self.exchange, Options):
            fail(f"exchange must be a terngrad.ddp.Options, got {type(self.exchange).__name__}")
        if self.exchange.seed != 0 or self.exchange.timeout is not None:
            fail(
                "a run's seed and timeout are its own: give TrainConfig(seed=..., timeout=...), "
                "not the exchange's"
            )
        if self.warmup_steps and self.warmup_epochs:
            fail("give warmup-steps or warmup-epochs, not both")
        if (self.optimizer == "frozen-adamw") != (self.freeze_after > 0):
            fail(
                "optimizer frozen-adamw needs freeze-after N >= 1 (the steps of AdamW that "
                "measure the variance)"
                if self.optimizer == "frozen-adamw"
                else f"freeze-after is frozen-adamw's; optimizer {self.optimizer!r} takes none"
            )
        if self.variance_sync is not None and self.optimizer != "local-adamw":
            fail(f"variance-sync is local-adamw's; optimizer {self.optimizer!r} takes none")
        if self.batch_size is not None and self.total_batch_size is not None:
            fail("give one of batch-size (per worker) and total-batch-size, not both")
        if self.batch_size is None and self.total_batch_size is None:
            object.__setattr__(self, "batch_size", DEFAULT_BATCH)
        if self.total_batch_size is not None and self.total_batch_size % self.workers:
            fail(
                f"total-batch-size {self.total_batch_size} does not split evenly over "
                f"{self.workers} workers"
            )
        if not isinstance(self.out, str) or not self.out.strip():
            fail(f"out must name a folder, got {self.out!r}")
        if self.powersgd_rank != baselines.POWERSGD_RANK and self.baseline != "powersgd":
            other = self.baseline or "terngrad's hook"
            fail(
                f"powersgd-rank is PowerSGD's rank: give --baseline powersgd (the method "
                f"powersgd-r{self.powersgd_rank}), not {other}"
            )
        if self.local_steps != 1:
            if self.baseline is not None or self.optimizer in ("frozen-adamw", "local-adamw"):
                fail(
                    "local-steps averages what each replica moved through terngrad's exchange, "
                    f"with the run's own optimizer: not with {self.baseline or self.optimizer}"
                )
            for name in ("steps", "eval_every", "checkpoint_every"):
                value, flag = getattr(self, name), name.replace("_", "-")
                if not value:
                    continue
                if self.local_steps == "auto":
                    if value < AUTO_PROBE_STEPS:  # (fewer steps: none would be kept)
                        fail(
                            f"local-steps auto chooses H at inner step {AUTO_PROBE_STEPS}: "
                            f"{flag} must be at least {AUTO_PROBE_STEPS}, got {value}"
                        )
                elif value % self.local_steps:
                    fail(
                        f"{flag} {value} is not a multiple of local-steps "
                        f"{self.local_steps}: the replicas are one model only after an outer step"
                    )
        elif self.outer_overlap:
            fail("outer-overlap overlaps the outer exchange of local steps: give --local-steps")

    @property
    def method(self) -> str:
        """The method this run trains with, by the one naming rule (``terngrad-ef-local8``,
        ``powersgd-r4``, ``terngrad-b512-ef-localvar100``): PyTorch's baseline, or the hook's
        exchange with its optimizer recipe, full-precision warm-up (as its share of the steps)
        and local steps — the name a run made by ``--method`` was given, and what one made
        from flags alone amounts to (the quantizer's name where no method can say it)."""
        if self.baseline is not None:
            return Method(baseline=self.baseline, powersgd_rank=self.powersgd_rank).name
        x = self.exchange
        recipe: FrozenVariance | LocalVariance | None = None
        if self.optimizer == FrozenVariance.optimizer:
            recipe = FrozenVariance(self.freeze_after / self.steps)
        elif self.optimizer == LocalVariance.optimizer and self.variance_sync is not None:
            recipe = LocalVariance(self.variance_sync)
        own = x.replace(seed=0, timeout=None, kernels="auto", full_precision_steps=0)
        try:
            warmup = x.full_precision_steps / self.steps
            return Method(exchange=own, recipe=recipe, warmup=warmup, local_steps=self.local_steps,
                          outer_overlap=self.outer_overlap).name  # fmt: skip
        except ValueError:
            return x.quantizer

    @property
    def worker_batch(self) -> int:
        """Examples per worker per step."""
        if self.batch_size is not None:
            return self.batch_size
        assert self.total_batch_size is not None
        return self.total_batch_size // self.workers

    @property
    def hook_options(self) -> Options:
        """The options the hook runs with: the exchange's, with the run's seed and timeout."""
        return self.exchange.replace(seed=self.seed, timeout=self.timeout)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable: the exchange's options nested under ``exchange``."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        exchange = {k: v for k, v in self.exchange.to_dict().items() if k not in RUN_LEVEL}
        return {**values, "exchange": exchange}

    def settings(self) -> dict[str, Any]:
        """Every setting by its one name (the exchange's beside the run's: no name is both)."""
        own = self.to_dict()
        return {**own.pop("exchange"), **own}

    def diff(self, other: TrainConfig, ignore: Collection[str] = ()) -> list[str]:
        """How ``other`` differs from this run: ``name=<other> instead of <this>``."""
        return differences(self.settings(), other.settings(), ignore)

    def replace(self, **changes: Any) -> TrainConfig:
        """A copy with ``changes``, checked like a new one."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainConfig:
        """The config :meth:`to_dict` wrote, or an older version's: the flat layout of terngrad
        0.1 (the exchange's options beside the run's) and the seed and timeout kept in the
        exchange's options before they became the run's."""
        values = dict(values)
        exchange = dict(values.pop("exchange", {}))
        for name in _LEGACY_EXCHANGE_FIELDS:
            if name in values:
                exchange[name] = values.pop(name)
        if "keep_last_fp32" in values:
            exchange["quantize_last"] = not values.pop("keep_last_fp32")
        for name in RUN_LEVEL:
            if name in exchange:
                moved = exchange.pop(name)
                if moved is not None:
                    values.setdefault(name, moved)
        return cls(**values, exchange=Options.from_dict(exchange))


#: options that were fields of TrainConfig itself before the exchange's options object
_LEGACY_EXCHANGE_FIELDS = (
    "quantizer", "quantizer_options", "topology", "kernels", "policy", "error_feedback",
    "min_numel",
)  # fmt: skip
