"""The figure of a time-to-accuracy comparison (``time-to-accuracy.png``): each method's test
accuracy (or loss) against training seconds and against steps, the target dashed; its table
is :mod:`terngrad.experiments.time_to_accuracy_report`'s."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from terngrad.experiments.time_to_accuracy_report import results_target
from terngrad.util.files import atomic_write


def plot(results: dict[str, Any], path: Path) -> tuple[list[str], list[str]]:
    """Test accuracy (or, for a loss target, test loss) against training seconds (left) and
    against steps (right), every method in both, the target as a dashed line; returns the
    methods drawn in each panel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    words, by_loss = results_target(results)
    scale = 1 if by_loss else 100  # a loss as it is, an accuracy in percent

    def score(record: dict[str, Any]) -> float:
        return record["loss"] if by_loss else 100 * record["accuracy"]

    fig, (by_time, by_step) = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    colors: dict[str, str] = {}
    for r in results.get("runs", results["methods"]):
        curve, name = r["curve"], r["method"]
        accuracy = [score(m) for m in curve]
        label = name if name not in colors else "_" + name  # one legend entry a method
        (drawn_line,) = by_time.plot([m["train_seconds"] for m in curve], accuracy, marker=".",
                                     label=label, color=colors.get(name))  # fmt: skip
        colors.setdefault(name, drawn_line.get_color())
        by_step.plot([m["step"] for m in curve], accuracy, marker=".", color=colors[name],
                     label=label)  # fmt: skip
        if r["reached"]:
            by_time.plot(r["reached"]["train_seconds"], scale * results["target"], "o",
                         color=colors[name], markersize=8, fillstyle="none")  # fmt: skip
    target = scale * results["target"]
    values = [score(m) for r in results.get("runs", results["methods"])
              for m in r["curve"]] or [target]  # fmt: skip
    for ax, label in ((by_time, "training seconds (wall-clock)"), (by_step, "step")):
        ax.axhline(target, color="gray", linestyle="--", linewidth=0.8)
        ax.set_xlabel(label)
        ax.grid(True, alpha=0.3)
        if by_loss:  # from under the best to twice the target: the early loss is off scale
            ax.set_ylim(min(*values, target) * 0.98, min(max(*values, target), 2 * target))
        else:
            ax.set_ylim(max(min(values), target - 10) - 0.5, min(100, max(*values, target) + 0.5))
    by_time.set_ylabel("test loss (nats)" if by_loss else "test accuracy (%)")
    by_step.legend(loc="upper right" if by_loss else "lower right")
    fig.suptitle(
        f"{results['model']} on {results['dataset']}, {results['workers']} ranks, "
        f"{results['bandwidth']} links: time to {words} (measured)"
    )
    fig.tight_layout()
    drawn = tuple(
        [line.get_label() for line in ax.get_lines() if not line.get_label().startswith("_")]
        for ax in (by_time, by_step)
    )
    try:
        atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=110))
    finally:
        plt.close(fig)
    return drawn
