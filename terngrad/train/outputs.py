"""What a training run writes into its folder besides checkpoints: ``metrics.jsonl``, one JSON
record per evaluation, and at the end ``summary.json`` and ``curves.png``.

An evaluation's record: step, loss and accuracy on the test set (a language model: on the
validation windows, with ``bits_per_char``), ``train_loss`` (mean since the last evaluation),
``lr`` (that step's), ``bytes_sent`` (the hook's count, this rank, cumulative), ``seconds``
(wall clock), ``train_seconds`` (the steps alone) and ``wire_bytes`` (inside the testbed of
:mod:`terngrad.experiments.time_to_accuracy`: what the ranks' interfaces sent during the steps).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from terngrad.train.config import TrainConfig
from terngrad.util.files import atomic_write_text, read_text

METRICS = "metrics.jsonl"
SUMMARY = "summary.json"
CURVES = "curves.png"


def append_metrics(path: Path, record: dict[str, Any]) -> None:
    """One evaluation's record at the end of ``path``."""
    with Path(path).open("a") as f:
        f.write(json.dumps(record) + "\n")


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The evaluations written so far, oldest first (a line cut short by a crash, or still
    being written, is left out)."""
    return [json.loads(line) for line in _records(path)]


def truncate_metrics(path: Path, step: int, evaluation: dict[str, Any] | None = None) -> None:
    """Keep the evaluations up to ``step`` (the checkpoint a run resumes from), drop the rest
    and any damaged line; ``evaluation``, the checkpoint's copy of the record of its own step,
    is written back if that record was lost (a damaged last line): the run, which goes on
    after that step, would never make it again."""
    if not path.exists() and evaluation is None:
        return
    kept = [line for line in _records(path) if json.loads(line)["step"] <= step]
    steps = {json.loads(line)["step"] for line in kept}
    if evaluation is not None and evaluation["step"] not in steps:
        kept.append(json.dumps(evaluation))
    atomic_write_text(path, "".join(line + "\n" for line in kept))


def _records(path: Path) -> list[str]:
    """The lines of ``path`` that are whole records (JSON objects with a step)."""
    if not Path(path).exists():
        return []
    whole = []
    for line in read_text(path, "metrics").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # cut short by a crash
        if isinstance(record, dict) and isinstance(record.get("step"), int):
            whole.append(line)
    return whole


def scores(record: dict[str, Any]) -> str:
    """An evaluation in words: bits per character for a language model, else test accuracy."""
    if "bits_per_char" in record:
        return (
            f"validation loss {record['loss']:.4f} ({record['bits_per_char']:.3f} bits/char), "
            f"next-char accuracy {100 * record['accuracy']:.2f}%"
        )
    return f"test accuracy {100 * record['accuracy']:.2f}%, test loss {record['loss']:.4f}"


def reaches_target(
    record: dict[str, Any], accuracy: float | None = None, loss: float | None = None
) -> bool:
    """Whether an evaluation reached a time-to-target run's target: its test accuracy at least
    ``accuracy`` (a fraction), or its test loss at most ``loss``; ``False`` with neither."""
    return (accuracy is not None and record["accuracy"] >= accuracy) or (
        loss is not None and record["loss"] <= loss
    )


def title(cfg: TrainConfig) -> str:
    """The run in a line, for its plot."""
    how = cfg.method.name
    return (
        f"{cfg.model} on {cfg.dataset}, {cfg.workers} workers, {how}, "
        f"batch {cfg.worker_batch}/worker"
    )


def write_summary(
    cfg: TrainConfig, stats: Any, accuracy: float, seconds: float, train_seconds: float,
    wire: float | None, steps: int | None = None, loss: float | None = None,
) -> dict[str, Any]:  # fmt: skip
    """``summary.json`` and ``curves.png`` in ``cfg.out`` from its metrics and the hook's
    ``stats`` (``None`` for PyTorch's baselines); ``steps``: the steps trained (fewer than
    ``cfg.steps`` where the run stopped at its target accuracy); ``loss``: the test loss of
    the evaluation that gave ``accuracy`` where the metrics hold no record of it (a run with
    nothing left to train evaluates its checkpoint). Returns the summary."""
    out = Path(cfg.out)
    metrics = read_metrics(out / METRICS)
    losses = [m["loss"] for m in metrics] + ([] if loss is None else [loss])
    summary = {
        "method": cfg.method.name,
        "accuracy": accuracy,
        "best_accuracy": max((m["accuracy"] for m in metrics), default=accuracy),
        # the last evaluation's test loss (nats per prediction) and the lowest one
        "loss": losses[-1] if losses else None,
        "best_loss": min(losses, default=None),
        "steps": cfg.steps if steps is None else steps,
        "stopped_at_target": steps is not None and steps < cfg.steps,
        # what terngrad's hook handed to the collectives (None for PyTorch's baselines)
        "bytes_sent_per_rank": stats.bytes_sent if stats else None,
        "bytes_received_per_rank": stats.bytes_received if stats else None,
        "bytes_sent_per_step": stats.bytes_sent_per_step if stats else None,
        "skipped_steps": stats.skipped_steps if stats else 0,
        # inside the testbed: what the interfaces sent during the steps, mean over ranks
        "wire_bytes_per_rank": wire,
        "wire_bytes_per_step": wire / (steps or cfg.steps) if wire is not None else None,
        "seconds": seconds,
        "train_seconds": train_seconds,
        "config": cfg.to_dict(),
    }
    if getattr(stats, "local_steps", None) is not None:  # local steps: H (auto: as chosen)
        summary["local_steps"] = stats.local_steps
    if cfg.node_size is not None:  # across nodes: the bytes above crossed the slow link
        summary["node_bytes_sent_per_rank"] = stats.node_bytes_sent  # (these stayed inside)
    if metrics and "bits_per_char" in metrics[-1]:
        summary["bits_per_char"] = metrics[-1]["bits_per_char"]
        summary["best_bits_per_char"] = min(m["bits_per_char"] for m in metrics)
    atomic_write_text(out / SUMMARY, json.dumps(summary, indent=2) + "\n")
    from terngrad.train.report import write_curves  # matplotlib: rank 0 only, at the end

    write_curves({cfg.method.name: metrics}, out / CURVES, title=title(cfg))
    return summary
