"""Plots and tables of training runs: accuracy and loss curves, side-by-side result tables."""

from __future__ import annotations

import re
import statistics
from pathlib import Path
from typing import Any

import matplotlib

from terngrad.util.files import atomic_write

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt


def write_curves(runs: dict[str, list[dict[str, Any]]], path: Path, title: str = "") -> None:
    """Test accuracy and test loss against step, one line per run, written atomically (language
    models: next-character accuracy and validation bits per character)."""
    text = any("bits_per_char" in m for metrics in runs.values() for m in metrics)
    fig, (acc_ax, loss_ax) = plt.subplots(1, 2, figsize=(11, 4))
    for label, metrics in runs.items():
        steps = [m["step"] for m in metrics]
        acc_ax.plot(steps, [100 * m["accuracy"] for m in metrics], marker=".", label=label)
        losses = [m["bits_per_char"] if text else m["loss"] for m in metrics]
        loss_ax.plot(steps, losses, marker=".", label=label)
    if text:
        acc_ax.set(xlabel="step", ylabel="next-character accuracy (%)", title="accuracy")
        loss_ax.set(xlabel="step", ylabel="validation bits per character", title="loss")
    else:
        acc_ax.set(xlabel="step", ylabel="test accuracy (%)", title="accuracy")
        loss_ax.set(xlabel="step", ylabel="test loss", title="loss")
    loss_ax.set_yscale("log")
    for ax in (acc_ax, loss_ax):
        ax.grid(True, alpha=0.3)
        ax.legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    try:
        atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=110))
    finally:
        plt.close(fig)


def mean_curve(curves: list[list[tuple[int, float]]]) -> list[tuple[int, float]]:
    """The mean of several runs' ``(step, value)`` curves at the first run's steps (a shorter
    run counts where it has a value)."""
    return [
        (step, statistics.fmean(c[i][1] for c in curves if i < len(c)))
        for i, (step, _) in enumerate(curves[0])
    ]


def write_tradeoff_plot(
    points: dict[str, tuple[float, float]], path: Path, title: str, xlabel: str, ylabel: str
) -> None:
    """One labelled point per method, ``(bytes, value)``, the bytes on a log axis: what each
    method sends against what it reaches; written atomically."""
    fig, ax = plt.subplots(figsize=(7.5, 5))
    for label, (x, y) in points.items():
        ax.scatter([x], [y], s=30)
        ax.annotate(label, (x, y), textcoords="offset points", xytext=(5, 4), fontsize=8)
    ax.set_xscale("log")
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    ax.grid(True, alpha=0.3, which="both")
    fig.tight_layout()
    try:
        atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=110))
    finally:
        plt.close(fig)


def write_step_plot(
    lines: dict[str, list[tuple[int, float]]],
    path: Path,
    title: str = "",
    ylabel: str = "test accuracy (%)",
    percent: bool = True,
) -> None:
    """A value against step, one line per label — up to 20 told apart by colour, dashed from
    the eleventh on — written atomically. ``percent``: the values are fractions (accuracy),
    drawn as percent from a little under the worst final value to the best; else (a loss, lower
    is better) from a little under the best final value to a quarter above the worst."""
    fig, ax = plt.subplots(figsize=(9, 5.5))
    colours = plt.get_cmap("tab20").colors
    factor = 100 if percent else 1
    for i, (label, points) in enumerate(lines.items()):
        ax.plot([s for s, _ in points], [factor * a for _, a in points], label=label,
                color=colours[(2 * i) % 20 if i < 10 else (2 * i + 1) % 20],
                linestyle="-" if i < 10 else "--", marker=".")  # fmt: skip
    ax.set(xlabel="step", ylabel=ylabel, title=title)
    finals = [factor * points[-1][1] for points in lines.values() if points]
    if finals and percent:  # the interesting band
        ax.set_ylim(max(0.0, min(finals) - 5), min(100.0, max(finals) + 1))
    elif finals:
        ax.set_ylim(0.95 * min(finals), 1.25 * max(finals))
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    try:
        atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=110))
    finally:
        plt.close(fig)


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    """A GitHub Markdown table; numbers right-aligned."""
    align = ["---:" if rows and _numeric(rows[0][i]) else "---" for i in range(len(header))]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _numeric(text: str) -> bool:
    """A figure such as ``1,234``, ``99.10%`` or ``16.0x``."""
    return re.fullmatch(r"-?[\d,]+(\.\d+)?[%x×]?", text.strip()) is not None
