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
from terngrad.comm.spec.local import LocalSteps
from terngrad.comm.spec.method_spec import FrozenVariance, LocalVariance, Method
from terngrad.comm.spec.methods import get as get_method
from terngrad.comm.spec.options import MAX_TIMEOUT
from terngrad.kernels import KERNELS
from terngrad.local_steps import AUTO_PROBE_STEPS
from terngrad.train import data as datasets
from terngrad.train import models, schedule
from terngrad.util.differences import differences
from terngrad.util.settings import (
    FRACTION,
    INT64,
    NON_NEGATIVE,
    NON_NEGATIVE_INT,
    POSITIVE,
    POSITIVE_INT,
    Range,
    check_settings,
    setting,
)

DEFAULT_TIMEOUT = 300.0  # seconds any collective of a training run may wait
DEFAULT_BATCH = 64  # examples per worker unless a batch size is given
OPTIMIZERS = ("sgd", "momentum", "adam", "adamw")
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
RUN_LEVEL = ("seed", "timeout", "kernels", "full_precision_steps")

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
    #: the cluster's layout: nodes of this many consecutive ranks (``bench``'s testbed: a
    #: namespace per node, nodes joined at the shaped rate); a method whose local steps run
    #: across nodes (``-nodes``) trains DDP inside each (:mod:`terngrad.comm.front.nodes`)
    ranks_per_node: int | None = setting(
        None, "ranks per node: in bench's testbed, the ranks of a node share its link; with "
        "a method of local steps across nodes (-nodes, --across-nodes), DDP inside a node and "
        "the outer exchange across nodes", _WORKERS, POSITIVE_INT,
        default_words="one rank a node",
    )  # fmt: skip
    #: how the run averages (:mod:`terngrad.comm.spec.methods`): PyTorch's baseline, or
    #: terngrad's exchange with its optimizer recipe, warm-up share and local steps; a name is
    #: read into the method (its seed, timeout and kernels are the run's: :attr:`hook_options`)
    method: Method = field(default_factory=lambda: Method(exchange=Options()))
    kernels: str = setting(
        "auto", "encode/decode kernels: auto, numba, triton or torch (the reference)",
        "exchange", choices=lambda: KERNELS, metavar="NAME",
    )  # fmt: skip
    #: the method's full-precision warm-up in steps (``None``: its share of ``steps``, at
    #: least 1, where it has one; 0 without); resolved where the config is made
    full_precision_steps: int | None = setting(
        None, "average in full precision for the first K steps, then quantize", "exchange",
        NON_NEGATIVE_INT, metavar="K", default_words="the method's warm-up share of --steps",
    )  # fmt: skip
    optimizer: str = setting("momentum", "(an optimizer recipe of the method runs over adamw)",
                             _OPT, choices=lambda: OPTIMIZERS)  # fmt: skip
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
    #: the method's recipe :class:`FrozenVariance`: the steps of plain AdamW before its
    #: variance freezes (``None``: its share of ``steps``, at least 1); resolved where made
    freeze_after: int | None = setting(
        None, "steps of AdamW before the variance freezes", _OPT, NON_NEGATIVE_INT, flag=""
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
        if isinstance(self.method, str):
            object.__setattr__(self, "method", get_method(self.method))
        if not isinstance(self.method, Method):
            fail(f"method must be a name or a Method, got {type(self.method).__name__}")
        check_settings(self)
        check_pairing(self.model, self.dataset)
        m = self.method
        if self.warmup_steps and self.warmup_epochs:
            fail("give warmup-steps or warmup-epochs, not both")
        if m.recipe is not None and self.optimizer != "adamw":
            fail(
                f"method {m.name} exchanges AdamW's momentum ({m.recipe.words}): give optimizer "
                f"adamw, not {self.optimizer!r}"
            )
        if isinstance(m.recipe, FrozenVariance):
            if self.freeze_after is None:
                object.__setattr__(self, "freeze_after", max(1, int(self.steps * m.recipe.share)))
        elif self.freeze_after is not None:
            fail(f"freeze_after is the steps before a frozen variance; method {m.name} has none")
        if self.full_precision_steps is None:
            share = m.warmup
            object.__setattr__(self, "full_precision_steps",
                               max(1, int(self.steps * share)) if share else 0)  # fmt: skip
        elif self.full_precision_steps and not m.warmup:
            fail(
                f"full-precision-steps {self.full_precision_steps} is a warm-up, and method "
                f"{m.name} has none: a warm-up is a share of the steps in the method's name "
                f"({m.name}-warmup0.1, say), which this count then replaces"
            )
        if self.batch_size is not None and self.total_batch_size is not None:
            fail("give one of batch-size (per worker) and total-batch-size, not both")
        if self.batch_size is None and self.total_batch_size is None:
            object.__setattr__(self, "batch_size", DEFAULT_BATCH)
        if self.total_batch_size is not None and self.total_batch_size % self.workers:
            fail(
                f"total-batch-size {self.total_batch_size} does not split evenly over "
                f"{self.workers} workers"
            )
        if self.ranks_per_node is not None and (
            self.workers % self.ranks_per_node or self.ranks_per_node >= self.workers
        ):
            fail(
                f"ranks-per-node {self.ranks_per_node} must divide workers {self.workers} "
                "into at least 2 nodes"
            )
        if m.local is not None and m.local.across_nodes and self.ranks_per_node is None:
            fail(
                f"method {m.name} runs its local steps across nodes: give --ranks-per-node "
                "(the ranks of one node)"
            )
        if not isinstance(self.out, str) or not self.out.strip():
            fail(f"out must name a folder, got {self.out!r}")
        h = m.local_steps
        for name in ("steps", "eval_every", "checkpoint_every") if h != 1 else ():
            value, flag = getattr(self, name), name.replace("_", "-")
            if not value:
                continue
            if h == "auto":
                if value < AUTO_PROBE_STEPS:  # (fewer steps: none would be kept)
                    fail(
                        f"local-steps auto chooses H at inner step {AUTO_PROBE_STEPS}: "
                        f"{flag} must be at least {AUTO_PROBE_STEPS}, got {value}"
                    )
            elif value % h:
                fail(
                    f"{flag} {value} is not a multiple of local-steps {h}: the replicas are "
                    "one model only after an outer step"
                )

    @property
    def node_size(self) -> int | None:
        """The ranks of a node where each node is one replica of local steps (a method with
        ``-nodes``), else ``None``: every rank a replica."""
        local = self.method.local
        return self.ranks_per_node if local is not None and local.across_nodes else None

    @property
    def worker_batch(self) -> int:
        """Examples per worker per step."""
        if self.batch_size is not None:
            return self.batch_size
        assert self.total_batch_size is not None
        return self.total_batch_size // self.workers

    @property
    def hook_options(self) -> Options:
        """The options the hook runs with: the method's exchange with the run's seed, timeout,
        kernels and full-precision steps (``ValueError`` for a PyTorch baseline)."""
        return self.method.options(seed=self.seed, timeout=self.timeout, kernels=self.kernels,
                                   full_precision_steps=self.full_precision_steps)  # fmt: skip

    @property
    def optimizer_recipe(self) -> str:
        """The optimizer the run makes: the method's recipe's (``frozen-adamw``,
        ``local-adamw``: :mod:`terngrad.optim`), else :attr:`optimizer`."""
        recipe = self.method.recipe
        return recipe.optimizer if recipe is not None else self.optimizer

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable: the method by its name (the name is the spec), its settings
        under ``method_settings`` (for a reader; :meth:`from_dict` reads the name)."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {**values, "method": self.method.name, "method_settings": self.method.settings()}

    def settings(self) -> dict[str, Any]:
        """Every setting by its one name, the method by its name."""
        own = self.to_dict()
        del own["method_settings"]
        return own

    def diff(self, other: TrainConfig, ignore: Collection[str] = ()) -> list[str]:
        """How ``other`` differs from this run: ``name=<other> instead of <this>``."""
        return differences(self.settings(), other.settings(), ignore)

    def replace(self, **changes: Any) -> TrainConfig:
        """A copy with ``changes``, checked like a new one (a method's warm-up and freeze
        resolved again from the new one where the method changes)."""
        if "method" in changes:
            changes.setdefault("full_precision_steps", None)
            changes.setdefault("freeze_after", None)
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainConfig:
        """The config :meth:`to_dict` wrote, or an older version's (:func:`_legacy`: the
        exchange's options and the method's parts as fields of their own)."""
        values = dict(values)
        values.pop("method_settings", None)
        if "method" not in values:
            values = _legacy(values)
        return cls(**values)


def _legacy(values: dict[str, Any]) -> dict[str, Any]:
    """An older version's config as today's: the exchange's options (nested under
    ``exchange``, or flat as in terngrad 0.1; the seed and timeout once among them), PyTorch's
    ``baseline`` and ``powersgd_rank``, the recipes as optimizers (``frozen-adamw`` with
    ``freeze_after``, ``local-adamw`` with ``variance_sync``) and the local steps as fields,
    made into the run's method."""
    exchange = dict(values.pop("exchange", {}))
    for name in {f.name for f in dataclasses.fields(Options)} & set(values):
        exchange[name] = values.pop(name)  # (flat: terngrad 0.1, and a settings() dict)
    if "keep_last_fp32" in values:
        exchange["quantize_last"] = not values.pop("keep_last_fp32")
    for name in ("seed", "timeout"):
        moved = exchange.pop(name, None)
        if moved is not None:
            values.setdefault(name, moved)
    options = Options.from_dict(exchange)
    values["kernels"] = options.kernels
    baseline, rank = values.pop("baseline", None), values.pop("powersgd_rank", None)
    h, overlap = values.pop("local_steps", 1), values.pop("outer_overlap", False)
    outer = {k: values.pop(k) for k in ("outer_lr", "outer_momentum", "max_comm_share")
             if k in values}  # fmt: skip
    if h != "auto":
        outer.pop("max_comm_share", None)
    local = LocalSteps(h, overlap, **outer) if h != 1 else None
    freeze, every = values.pop("freeze_after", 0), values.pop("variance_sync", None)
    recipe: FrozenVariance | LocalVariance | None = None
    if values.get("optimizer") == FrozenVariance.optimizer:
        recipe, values["freeze_after"] = FrozenVariance(freeze / values.get("steps", 1000)), freeze
    elif values.get("optimizer") == LocalVariance.optimizer:
        recipe = LocalVariance(every or 100)
    if recipe is not None:
        values["optimizer"] = "adamw"
    if baseline is not None:
        values["method"] = Method(baseline=baseline, **({"powersgd_rank": rank} if rank else {}))
        return values
    warmup = options.full_precision_steps / values.get("steps", 1000)
    values["full_precision_steps"] = options.full_precision_steps
    own = options.replace(kernels="auto", full_precision_steps=0)
    values["method"] = Method(exchange=own, recipe=recipe, warmup=warmup, local=local)
    return values
