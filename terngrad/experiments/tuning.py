"""Every method at its own best learning rate: ``--tune-lr`` of ``terngrad bench accuracy`` and
``terngrad reproduce transformer``.

A race of methods at one shared learning rate measures the rate as much as the methods: at
LeNet's protocol rate (0.01) local steps reached 98% in half of fp32's steps, and at each
method's own best rate in 1.4x them. So a fair race tunes first (:class:`LrTuning`):

* for each method, one run at every rate of the grid (a method with local steps: at every pair
  of rate and outer rate), on the **tuning seed**, which is kept out of the race;
* on an unlimited link: a link changes the seconds a step takes, not the steps, so one tuning
  serves every link of a sweep (``--local-steps auto`` is the exception: it chooses H from the
  link; it is tuned as it runs unlimited);
* the rate chosen (:func:`choose`): for an accuracy target, the one that reaches it in the fewest
  steps (a tie: the higher final accuracy, then the smaller rate); none reaching it, the highest
  best accuracy, said so. For a loss target, the lowest final loss (tuning runs train every
  step, so a loss target may be set from the tuning itself: ``--target-loss-above-fp32 1``).
  A rate at which training diverged (the trainer stopped on NaN/Inf gradients) is a point of
  the curve, not a failure of the tuning.

The race then runs at each method's rate, on the race seeds. In ``<out>/tuning/``: a run per
point (``<method>-lr<lr>`` or ``<method>-lr<lr>-olr<outer>``), ``tuning.json`` (what the tuning
was made for, every point, each method's choice), ``tuning.md`` and ``tuning.png`` (a method's
steps to target, or final loss, against the rate: :mod:`terngrad.experiments.tuning_record`).
A resumed tuning reads finished points back and refuses a record made for another model,
recipe, target or seed.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from terngrad.comm.spec import methods
from terngrad.experiments import comparison
from terngrad.experiments.comparison import (
    Comparison,
    Echo,
    Observe,
    Run,
    RunStopped,
    Train,
    at_rates,
)
from terngrad.experiments.time_to_accuracy_report import target_words
from terngrad.experiments.tuning_record import (
    RECORD,
    chosen_settings,
    markdown,
    plot,
    point,
    summarise,
    with_earlier,
)
from terngrad.train import outputs
from terngrad.train.config import RESUMABLE_CHANGES, TrainConfig
from terngrad.train.loop import DIVERGED
from terngrad.util.differences import differences
from terngrad.util.files import atomic_write_text, read_json

#: the tuning seed unless one is given: far from the race's (0, 1, 2, ...)
DEFAULT_SEED = 1000
#: the folder under a comparison's ``out`` that holds its tuning
FOLDER = "tuning"
#: what a diverged point's folder holds instead of a summary
DIVERGED_FILE = "diverged.json"
#: ... and a point stopped once it could no longer be chosen
STOPPED_FILE = "stopped.json"


def check_rates(rates: Sequence[float], flag: str) -> tuple[float, ...]:
    """``rates`` as a tuple, or ``ValueError`` in one line naming ``flag``: an empty list, a
    rate that is not a positive finite number, a rate given twice."""
    if not rates:
        raise ValueError(f"{flag} needs at least one learning rate (for example {flag} 0.01 0.03)")
    for r in rates:
        if isinstance(r, bool) or not isinstance(r, int | float) or not 0 < r < math.inf:
            raise ValueError(f"{flag}: {r!r} is not a learning rate; give positive finite numbers")
    if len(set(rates)) != len(rates):
        raise ValueError(f"{flag}: each rate may be given once")
    return tuple(float(r) for r in rates)


@dataclass(frozen=True)
class LrGrid:
    """The rates tuned over: ``lrs`` for every method, ``outer_lrs`` too for a method with local
    steps (empty: the run's ``outer_lr`` only), on the run ``seed`` kept out of the race."""

    lrs: tuple[float, ...]
    seed: int
    outer_lrs: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "lrs", check_rates(self.lrs, "--tune-lr"))
        if self.outer_lrs:
            object.__setattr__(self, "outer_lrs", check_rates(self.outer_lrs, "--tune-outer-lr"))

    def points(self, method: methods.Method) -> list[tuple[float, float | None]]:
        """``(lr, outer_lr)`` of each run of ``method`` (``outer_lr`` ``None``: the run's), in
        the order they train: from the middle of the grid outwards (the larger first), so that
        a good rate is found early and the runs that cannot beat it stop early."""
        outer = self.outer_lrs if method.local_steps != 1 and self.outer_lrs else (None,)
        return [(lr, o) for lr in _middle_out(self.lrs) for o in _middle_out(outer)]


def _middle_out(values: Sequence[Any]) -> list[Any]:
    """``values`` sorted, from the middle outwards, the larger first at each distance."""
    ordered = sorted(values, key=lambda v: -math.inf if v is None else v)
    middle = (len(ordered) - 1) / 2
    return sorted(ordered, key=lambda v: (abs(ordered.index(v) - middle), -ordered.index(v)))


def _recipe(cfg: TrainConfig) -> dict[str, Any]:
    """What a tuning was made for, of its race's base: every setting but the rates, the seed,
    the folder and what a resumed run may change."""
    ignore = {"out", "lr", "seed", *RESUMABLE_CHANGES}
    return {k: v for k, v in cfg.settings().items() if k not in ignore}


def folder_name(method: str, lr: float, outer_lr: float | None) -> str:
    """A point's folder: ``<method>-lr<lr>``, ``-olr<outer>`` added for an outer rate."""
    return f"{method}-lr{lr:g}" + ("" if outer_lr is None else f"-olr{outer_lr:g}")


class Tunable(Protocol):
    """A comparison whose methods can be tuned (:class:`AccuracyComparison`, the transformer's):
    its recipe, its race seeds (``base.seed`` and on), what it races to, and the two shapes it
    takes: the tuning's (:meth:`for_tuning`) and the race's at each method's rates
    (:meth:`at_rates`)."""

    base: TrainConfig
    methods: Sequence[str]
    seeds: int

    @property
    def target_metric(self) -> str: ...  # "accuracy" (steps to target) or "loss" (final loss)

    @property
    def target(self) -> float | None: ...

    def for_tuning(self, seed: int, out: str) -> Comparison:
        """The same comparison, one run a method on ``seed`` into ``out``, every step trained
        (an accuracy target: each run stopped there), on an unlimited link."""

    def at_rates(self, per_method: Mapping[str, Mapping[str, float]], seed: int) -> Comparison:
        """The race with each method's settings of ``per_method``, tuned on ``seed``."""


@dataclass(frozen=True)
class LrTuning(Comparison):
    """The tuning of a race (:meth:`of`): each run of ``inner`` (the race as a tuning: one seed,
    into ``<race out>/tuning``) at every point of ``grid``; a point whose training diverged is
    recorded and the tuning goes on."""

    inner: Comparison
    #: ``inner``'s settings (its ``base``): the recipe, and the tuning's folder
    base: TrainConfig
    grid: LrGrid
    #: what chooses a rate: ``"accuracy"`` (steps to ``target``) or ``"loss"`` (final loss)
    target_metric: str
    target: float | None = None
    title = "tuning the learning rates"

    @classmethod
    def of(cls, race: Tunable, grid: LrGrid) -> LrTuning:
        """The tuning for ``race`` (its out, methods, target and recipe), refused in one line if
        the tuning seed is one of the race's."""
        race_seeds = range(race.base.seed, race.base.seed + race.seeds)
        if grid.seed in race_seeds:
            raise ValueError(
                f"--tune-seed {grid.seed} is one of the seeds compared ({race_seeds.start}.."
                f"{race_seeds.stop - 1}): tune on a seed kept out of the race"
            )
        local = [m.name for m in methods.select(race.methods) if m.local_steps != 1]
        if grid.outer_lrs and not local:
            raise ValueError(
                "--tune-outer-lr tunes the outer rate of local steps: no method given runs "
                "them (terngrad-local25, say)"
            )
        metric = race.target_metric
        inner = race.for_tuning(grid.seed, str(Path(race.base.out) / FOLDER))
        target = race.target if metric == "accuracy" else None
        return cls(inner, inner.base, grid, metric, target)  # type: ignore[attr-defined]

    @property
    def out(self) -> Path:
        """The tuning's folder (``<race out>/tuning``)."""
        return Path(self.base.out)

    def plan(self) -> list[Run]:
        """Every method at every point of the grid, on the tuning seed."""
        runs = []
        for r in self.inner.plan():
            for lr, outer in self.grid.points(methods.get(r.method)):
                folder = str(self.out / folder_name(r.method, lr, outer))
                cfg = at_rates(r.config.replace(out=folder), lr, outer)
                label = f"{r.method} lr {lr:g}" + ("" if outer is None else f" outer lr {outer:g}")
                runs.append(Run(r.method, cfg, label, {"lr": lr, "outer_lr": outer}))
        return runs

    def key(self) -> dict[str, Any]:
        """What the tuning was made for: the model and recipe (every setting but the rates, the
        seed, the folder and what a resumed run may change), the target, the seed."""
        return {
            "recipe": _recipe(self.base),
            "target_metric": self.target_metric,
            # a loss target chooses by the lowest final loss: the target itself plays no part
            "target": self.target,
            "seed": self.grid.seed,
        }

    def check(self, runs: list[Run]) -> None:
        """The record in the folder, if any, was made for this tuning; then the race's checks
        of every point not yet finished."""
        self.check_record()
        self.inner.check([r for r in runs if self.finished(r) is None])

    def check_record(self) -> None:
        """``ValueError`` in one line if the folder holds a tuning made for another model,
        recipe, target or seed."""
        path = self.out / RECORD
        if path.exists():
            made_for = read_json(path, "tuning record").get("key", {})
            key = self.key()
            recipe = made_for.get("recipe", {})
            # (read as today's: an older version's layout, a setting added since at its default)
            recipe = _recipe(TrainConfig.from_dict({"out": ".", **recipe}))
            changed = differences(recipe, key["recipe"])
            changed += differences({k: v for k, v in made_for.items() if k != "recipe"},
                                   {k: v for k, v in key.items() if k != "recipe"})  # fmt: skip
            if changed:
                raise ValueError(
                    f"{path} was made for another tuning ({'; '.join(changed[:3])}): give "
                    f"another --out, or move {path.parent} away to tune again"
                )

    def finished(self, run: Run) -> dict[str, Any] | None:
        """The record of a point that was stopped or diverged, or a finished point's summary
        (made with these settings, up to what a resumed run may change: its folder, say; a run
        stopped at its last evaluation may have written its summary too: it stays stopped)."""
        for name in (STOPPED_FILE, DIVERGED_FILE):
            path = Path(run.config.out) / name
            if path.exists():
                record = read_json(path, "tuning point")
                made = TrainConfig.from_dict(record["config"])
                if not run.config.diff(made, ignore=RESUMABLE_CHANGES):
                    return record
        return self.inner.finished(run)

    def _fewest_steps(self, runs: list[Run], method: str) -> int | None:
        """The fewest steps to target among ``method``'s points finished so far that
        :func:`choose` could choose."""
        steps = []
        for r in runs:
            summary = self.finished(r) if r.method == method else None
            if summary is not None:
                p = point(r, summary, self)
                if not p["diverged"] and not p.get("stopped") and p["reached"]:
                    steps.append(p["reached"]["step"])
        return min(steps, default=None)

    def _keep(self, r: Run, name: str, record: dict[str, Any], echo: Echo) -> dict[str, Any]:
        """``record`` of a point that ended early, written into its folder as ``name``."""
        record = {**record, "config": r.config.to_dict()}
        Path(r.config.out).mkdir(parents=True, exist_ok=True)
        atomic_write_text(Path(r.config.out) / name, json.dumps(record, indent=2) + "\n")
        what = "stopped" if "stopped" in record else "diverged"
        echo(f"   {r.label}: {what} ({record[what]})")
        return record

    @contextlib.contextmanager
    def session(
        self, runs: list[Run], echo: Echo, observe: Observe | None = None
    ) -> Iterator[Train]:
        """The race's own session (the testbed, or plain launches). A point whose training
        diverged is recorded as such (in its folder, ``diverged.json``): the trainer stopped on
        NaN/Inf gradients, or (where the session can watch a run) an evaluation's test loss
        was not finite. For an accuracy
        target, a run that passes the fewest steps to target of its method's finished points
        without reaching it cannot be chosen: it is stopped there (``stopped.json``; where the
        session can watch a run: the testbed's)."""
        fewest: dict[str, int | None] = {}

        by_accuracy = self.target_metric == "accuracy"

        def give_up(r: Run, record: dict[str, Any]) -> None:
            if observe is not None:
                observe(r, record)
            if not math.isfinite(record["loss"]):  # (PyTorch's hooks train on through NaN)
                raise _Diverged(f"test loss {record['loss']} at step {record['step']}")
            best = fewest.get(r.method)
            reached = outputs.reaches_target(record, accuracy=self.target)
            if by_accuracy and best is not None and record["step"] >= best and not reached:
                raise RunStopped(
                    f"not at {target_words(self.target)} by step {record['step']}; another rate "
                    f"got there at step {best}"
                )

        with self.inner.session(runs, echo, give_up) as train:
            record = self.out / RECORD
            if not record.exists():  # what the tuning is made for, before its first run
                self.out.mkdir(parents=True, exist_ok=True)
                atomic_write_text(record, json.dumps({"key": self.key()}, indent=2) + "\n")

            def tune(r: Run) -> dict[str, Any]:
                if by_accuracy:
                    fewest[r.method] = self._fewest_steps(runs, r.method)
                try:
                    return train(r)
                except _Diverged as exc:
                    return self._keep(r, DIVERGED_FILE, {"diverged": str(exc)}, echo)
                except RunStopped as exc:
                    return self._keep(r, STOPPED_FILE, {"stopped": str(exc)}, echo)
                except Exception as exc:  # re-raised unless the trainer says it diverged
                    why = _diverged(Path(r.config.out), str(exc))
                    if why is None:
                        raise
                    return self._keep(r, DIVERGED_FILE, {"diverged": why}, echo)

            yield tune

    def describe(self, summary: dict[str, Any]) -> str:
        if "diverged" in summary:
            return "diverged"
        if "stopped" in summary:
            return f"stopped: {summary['stopped']}"
        return self.inner.describe(summary)

    def report(self, runs: list[Run], summaries: list[dict[str, Any]], out: Path) -> str:
        """The record, its table and its plot, of this call's methods and of every method an
        earlier call tuned into the same folder (a sweep tunes its methods over several calls:
        the report of the last keeps the others')."""
        tuned = summarise(self, runs, summaries)
        path = out / RECORD
        if path.exists():
            tuned = with_earlier(tuned, read_json(path, "tuning record"))
        atomic_write_text(out / RECORD, json.dumps(tuned, indent=2) + "\n")
        text = markdown(tuned)
        atomic_write_text(out / "tuning.md", text)
        plot(tuned, out / "tuning.png")
        return text


class _Diverged(RunStopped):
    """A watched run whose test loss is no longer finite: it can never reach a target."""


def _diverged(out: Path, error: str) -> str | None:
    """The trainer's words if the error or a rank's log says training stopped on NaN/Inf
    gradients, else ``None``."""
    texts = [error, *(log.read_text(errors="replace") for log in sorted(out.glob("rank*.log")))]
    for text in texts:
        for line in text.splitlines():
            if DIVERGED in line:
                return line.split("TrainingFailed: ")[-1].strip()[:200]
    return None


def tune(tuned: LrTuning, echo: Echo, report_only: bool = False) -> tuple[dict[str, Any], str]:
    """Train the tuning's points not yet finished (``echo``: its progress; ``report_only``:
    none, every one must be) and write its report; returns the record (``tuning.json``) and
    the report (Markdown)."""
    from terngrad.train import run_folder

    folder = tuned.out
    tuned.check_record()
    if report_only:
        with run_folder.claim(folder):
            text = comparison.report_only(tuned, folder)
    else:
        text = comparison.run(tuned, folder, echo=echo)
    return read_json(folder / RECORD, "tuning record"), text


def raced(race: Tunable, record: Mapping[str, Any]) -> Comparison:
    """``race`` with each method at its tuned rates."""
    return race.at_rates(chosen_settings(record), record["seed"])
