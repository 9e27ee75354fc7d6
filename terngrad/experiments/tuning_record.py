"""The record of a learning-rate tuning (:mod:`terngrad.experiments.tuning`): each run as a
point of its method's curve, the rate chosen (:func:`choose`), ``tuning.json`` made of them
(:func:`summarise`; one call's methods kept beside an earlier call's, :func:`with_earlier`),
what a race reads back from it (:func:`chosen_settings`, :func:`tuned_loss_target`), and its
table (:func:`markdown`) and plot (:func:`plot`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from terngrad.experiments.comparison import Run
from terngrad.experiments.time_to_accuracy_report import target_words, time_to_target
from terngrad.train import outputs
from terngrad.util.files import atomic_write


class Grid(Protocol):
    """The rates tuned over (:class:`terngrad.experiments.tuning.LrGrid`)."""

    lrs: tuple[float, ...]
    outer_lrs: tuple[float, ...]
    seed: int


class Tuning(Protocol):
    """What the record is made from (:class:`terngrad.experiments.tuning.LrTuning`)."""

    inner: Any
    base: Any
    grid: Grid
    target_metric: str
    target: float | None

    def key(self) -> dict[str, Any]: ...


RECORD = "tuning.json"


def point(run: Run, summary: dict[str, Any], plan: Tuning) -> dict[str, Any]:
    """One tuning run as a point of its method's curve."""
    lr, outer = run.tags["lr"], run.tags["outer_lr"]
    if "diverged" in summary:
        return {"lr": lr, "outer_lr": outer, "diverged": True, "reached": None,
                "final_accuracy": None, "best_accuracy": None, "final_loss": None,
                "steps": None}  # fmt: skip
    if "stopped" in summary:  # at an evaluation past the fewest steps to target: not chosen
        curve = outputs.read_metrics(Path(run.config.out) / outputs.METRICS)
        return {"lr": lr, "outer_lr": outer, "diverged": False, "stopped": True, "reached": None,
                "final_accuracy": curve[-1]["accuracy"] if curve else None,
                "best_accuracy": max((m["accuracy"] for m in curve), default=None),
                "final_loss": None, "steps": curve[-1]["step"] if curve else None}  # fmt: skip
    reached = None
    if plan.target_metric == "accuracy":
        curve = outputs.read_metrics(Path(run.config.out) / outputs.METRICS)
        reached = time_to_target(curve, plan.target, "accuracy")
    final_loss = summary.get("loss")
    return {
        "lr": lr,
        "outer_lr": outer,
        "diverged": final_loss is not None and not math.isfinite(final_loss),
        "reached": reached,
        "final_accuracy": summary.get("accuracy"),
        "best_accuracy": summary.get("best_accuracy"),
        "final_loss": final_loss,
        "steps": summary["steps"],
    }


def choose(points: Sequence[Mapping[str, Any]], metric: str) -> dict[str, Any]:
    """The best point: for ``accuracy``, the fewest steps to target (a tie: the higher final
    accuracy, then the smaller rate), or with none reaching it the highest best accuracy; for
    ``loss``, the lowest finite final loss (none finite: the smallest rate). Returns
    ``{"lr", "outer_lr", "why"}``."""
    alive = [p for p in points if not p["diverged"] and not p.get("stopped")]
    if metric == "accuracy":
        reached = [p for p in alive if p["reached"]]
        if reached:
            best = min(reached, key=lambda p: (p["reached"]["step"], -p["final_accuracy"],
                                               p["lr"], p["outer_lr"] or 0))  # fmt: skip
            why = f"target at step {best['reached']['step']}, the fewest"
        elif alive:
            best = max(alive, key=lambda p: (p["best_accuracy"], -p["lr"]))
            why = (
                "no rate reached the target; the highest best accuracy "
                f"({best['best_accuracy']:.2%})"
            )
        else:
            best, why = min(points, key=lambda p: p["lr"]), "every rate diverged; the smallest"
    else:
        finite = [p for p in alive if p["final_loss"] is not None]  # (no point is stopped)
        if finite:
            best = min(finite, key=lambda p: (p["final_loss"], p["lr"]))
            why = f"final loss {best['final_loss']:.4f}, the lowest"
        else:
            best, why = min(points, key=lambda p: p["lr"]), "every rate diverged; the smallest"
    return {"lr": best["lr"], "outer_lr": best["outer_lr"], "why": why}


def at_edge(chosen: dict[str, Any], grid: Grid) -> dict[str, Any]:
    """``chosen``, its reason saying so where it is the grid's largest or smallest rate or
    outer rate (the best may lie beyond: tune further that way)."""
    notes = []
    for what, value, tried in (("rate", chosen["lr"], grid.lrs),
                               ("outer rate", chosen["outer_lr"], grid.outer_lrs)):  # fmt: skip
        if value is None or len(tried) < 2 or value not in (max(tried), min(tried)):
            continue
        side, bound = ("largest", "larger") if value == max(tried) else ("smallest", "smaller")
        notes.append(f"the {side} {what} tried: a {bound} one may be better")
    return {**chosen, "why": "; ".join([chosen["why"], *notes])} if notes else chosen


def summarise(plan: Tuning, runs: list[Run], summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """The record: what the tuning was made for, each method's points and its choice."""
    by_method: dict[str, list[dict[str, Any]]] = {}
    for r, s in zip(runs, summaries, strict=True):
        by_method.setdefault(r.method, []).append(point(r, s, plan))
    for pts in by_method.values():  # by outer rate, then rate (they train middle first)
        pts.sort(key=lambda p: (p["outer_lr"] or 0.0, p["lr"]))
    base = plan.base
    return {
        "key": plan.key(),
        "model": base.model,
        "dataset": base.dataset,
        "workers": base.workers,
        "bandwidth": getattr(plan.inner, "bandwidth", None),
        "target": plan.target,
        "target_metric": plan.target_metric,
        "seed": plan.grid.seed,
        "lrs": list(plan.grid.lrs),
        "outer_lrs": list(plan.grid.outer_lrs),
        "methods": {
            name: {"points": pts, "chosen": at_edge(choose(pts, plan.target_metric), plan.grid)}
            for name, pts in by_method.items()
        },
    }


def with_earlier(record: dict[str, Any], earlier: Mapping[str, Any]) -> dict[str, Any]:
    """``record`` with the methods of ``earlier`` (the folder's record, made for the same
    tuning: :meth:`LrTuning.check_record`) that it lacks, after its own; the rates, the union."""
    kept = {k: v for k, v in earlier.get("methods", {}).items() if k not in record["methods"]}
    if not kept:
        return record
    lrs = sorted({*record["lrs"], *earlier.get("lrs", [])})
    outer = sorted({*record["outer_lrs"], *earlier.get("outer_lrs", [])})
    return {**record, "lrs": lrs, "outer_lrs": outer, "methods": {**record["methods"], **kept}}


def chosen_settings(record: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """Each method's chosen rates as settings over the race's base (``lr``, and ``outer_lr``
    where tuned)."""
    out: dict[str, dict[str, float]] = {}
    for name, m in record["methods"].items():
        c = m["chosen"]
        out[name] = {"lr": c["lr"]} | ({} if c["outer_lr"] is None else {"outer_lr": c["outer_lr"]})
    return out


def tuned_loss_target(record: Mapping[str, Any], method: str, percent: float) -> float:
    """``method``'s tuned final loss plus ``percent`` percent (``--target-loss-above-fp32``)."""
    m = record["methods"].get(method)
    if m is None:
        raise ValueError(f"a target above {method}'s tuned loss needs {method} among --methods")
    c = m["chosen"]
    loss = next(p["final_loss"] for p in m["points"]
                if p["lr"] == c["lr"] and p["outer_lr"] == c["outer_lr"])  # fmt: skip
    if loss is None or not math.isfinite(loss):
        raise ValueError(f"{method} diverged at every rate tuned: no loss to set a target from")
    return loss * (1 + percent / 100)


def _cell(p: Mapping[str, Any], metric: str) -> str:
    """A point in the table: steps to target (or the final loss), or how it ended early."""
    if p["diverged"]:
        return "diverged"
    if p.get("stopped"):
        return f"> {p['steps']} (stopped)"
    if metric == "loss":
        return f"{p['final_loss']:.4f}" if p["final_loss"] is not None else "-"
    if p["reached"]:
        return f"{p['reached']['step']}"
    return f"not reached ({100 * p['best_accuracy']:.1f}% best)"


def markdown(record: Mapping[str, Any]) -> str:
    """A row per method (and outer rate), a column per rate: steps to target (or final loss),
    the chosen one in bold."""
    from terngrad.train.report import markdown_table

    metric = record["target_metric"]
    lrs = sorted(record["lrs"])
    rows = []
    for name, m in record["methods"].items():
        chosen = m["chosen"]
        outers = list(dict.fromkeys(p["outer_lr"] for p in m["points"]))
        for outer in outers:
            cells = []
            for lr in lrs:
                p = next((p for p in m["points"] if p["lr"] == lr and p["outer_lr"] == outer),
                         None)  # fmt: skip
                text = "-" if p is None else _cell(p, metric)
                if p is not None and (chosen["lr"], chosen["outer_lr"]) == (lr, outer):
                    text = f"**{text}**"
                cells.append(text)
            label = name if outer is None else f"{name}, outer lr {outer:g}"
            rows.append([label, *cells])
    what = (
        "final test loss after every step"
        if metric == "loss"
        else f"steps to {target_words(record['target'])} (each run stopped there; '> N "
        "(stopped)': stopped at step N, where another rate of the method had already reached "
        "it: it could no longer be chosen)"
    )
    choices = "; ".join(
        f"{name} lr {m['chosen']['lr']:g}"
        + ("" if m["chosen"]["outer_lr"] is None else f", outer lr {m['chosen']['outer_lr']:g}")
        + f" ({m['chosen']['why']})"
        for name, m in record["methods"].items()
    )
    return (
        f"# Learning rates tuned: {record['model']} on {record['dataset']}, {record['workers']} "
        f"ranks, seed {record['seed']} (kept out of the race)"
        + (f", {record['bandwidth']} link" if record.get("bandwidth") else "")
        + "\n\n"
        + markdown_table(["method", *(f"lr {lr:g}" for lr in lrs)], rows)
        + f"\nEach cell: {what}; bold: the rate the method races at. Chosen: {choices}.\n"
    )


def plot(record: Mapping[str, Any], path: Path) -> list[str]:
    """A panel per method, sharing the axes: steps to target (or the final loss) against the
    rate, a line per outer rate, the chosen point circled; a run stopped at step N drawn as an
    open triangle at N (it needed more), one that diverged as a cross at the panel's top.
    Returns the lines' labels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_loss = record["target_metric"] == "loss"
    names = list(record["methods"])
    cols = min(4, len(names)) or 1
    rows = (len(names) + cols - 1) // cols or 1
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.8 * rows), sharex=True,
                             sharey=True, squeeze=False)  # fmt: skip
    values = [p["final_loss"] if by_loss else p["reached"]["step"]
              for m in record["methods"].values() for p in m["points"]
              if (p["final_loss"] if by_loss else p["reached"]) and not p["diverged"]]  # fmt: skip
    top = max([*values, *(p["steps"] or 0 for m in record["methods"].values()
                          for p in m["points"] if p.get("stopped"))], default=1)  # fmt: skip
    labels = []
    for ax, name in zip(axes.flat, names, strict=False):
        m = record["methods"][name]
        chosen = (m["chosen"]["lr"], m["chosen"]["outer_lr"])
        for outer in dict.fromkeys(p["outer_lr"] for p in m["points"]):
            pts = [p for p in m["points"] if p["outer_lr"] == outer]
            done = [p for p in pts if not p["diverged"]
                    and (p["final_loss"] is not None if by_loss else p["reached"])]  # fmt: skip
            label = name if outer is None else f"outer lr {outer:g}"
            xs = [p["lr"] for p in done]
            ys = [p["final_loss"] if by_loss else p["reached"]["step"] for p in done]
            (line,) = ax.plot(xs, ys, marker="o", label=label)
            color = line.get_color()
            labels.append(f"{name}: {label}" if outer is not None else name)
            for x, y, p in zip(xs, ys, done, strict=True):
                if (p["lr"], p["outer_lr"]) == chosen:
                    ax.plot(x, y, "o", markersize=12, fillstyle="none", color=color)
            stopped = [p for p in pts if p.get("stopped") and p["steps"]]
            ax.plot([p["lr"] for p in stopped], [p["steps"] for p in stopped], "^",
                    fillstyle="none", color=color)  # fmt: skip
            diverged = [p["lr"] for p in pts if p["diverged"]]
            ax.plot(diverged, [top] * len(diverged), "x", color=color)
        ax.set_title(name, fontsize=9)
        ax.set_xscale("log")
        ax.set_xticks(record["lrs"], [f"{lr:g}" for lr in record["lrs"]], fontsize=7)
        ax.set_xticks([], minor=True)
        ax.tick_params(labelbottom=True)  # (a panel above an empty one keeps its rates)
        ax.grid(True, alpha=0.3)
        if any(p["outer_lr"] is not None for p in m["points"]):
            ax.legend(fontsize=6)
    for ax in axes.flat[len(names) :]:
        ax.set_visible(False)
    for ax in axes.flat[max(0, len(names) - cols) : len(names)]:
        ax.set_xlabel("learning rate")
    for ax in axes[:, 0]:
        ax.set_ylabel(
            "final test loss" if by_loss else f"steps to {target_words(record['target'])}"
        )
    fig.suptitle(
        f"{record['model']} on {record['dataset']}, {record['workers']} ranks: the tuning (seed "
        f"{record['seed']}); circled: chosen; triangle: stopped there, needed more; x: diverged",
        fontsize=9,
    )
    fig.tight_layout()
    try:
        atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=110))
    finally:
        plt.close(fig)
    return labels
