"""TernGrad on a transformer with AdamW: ``terngrad reproduce transformer``.

TernGrad was shown on CNNs; users of GRACE report that it diverged on BERT with one shared scale
(sands-lab/grace#14). This comparison trains the character-level GPT of
:mod:`terngrad.train.models` on Python's documentation (:mod:`terngrad.train.text`) with AdamW,
a linear warm-up from lr/10 over a tenth of the steps and cosine decay to lr/10, ``workers``
real processes, and these methods of :data:`terngrad.comm.spec.methods.METHODS`:

* ``fp32``, ``fp16``: PyTorch's DDP all-reduce and its fp16 compression hook, the references;
* ``terngrad``: the hook's defaults — one scale per tensor, clipping at 2.5 sigma, the last layer
  (the output head) and tensors under 1,024 elements (biases, layer norms) in fp32;
* ``terngrad-b512``, ``terngrad-b2048``: one scale per bucket of 512 / 2,048 elements;
* ``terngrad-ef``: worker-side error feedback;
* ``terngrad-warmup0.2``: full-precision averaging for the first ``full_precision_steps`` steps (by
  default a fifth of the run, at least 1), then TernGrad — 1-bit Adam's warm-up (Tang et al. 2021);
* ``terngrad-b512-warmup0.2``: both, buckets of 512 after the same warm-up;
* ``terngrad-b512-ef-frozen0.2``: buckets of 512 with error feedback, and AdamW's variance
  frozen after a fifth of the steps, its preconditioned momentum exchanged from then on (the
  whole run in TernGrad: :class:`terngrad.optim.FrozenVarianceAdamW`);
* ``terngrad-b512-ef-localvar100``: the same exchange of the momentum from the first step,
  AdamW's variance measured by each rank on its own gradient and averaged over the ranks at
  steps 1, 2, 4, ..., 64 and every 100th (:class:`terngrad.optim.LocalVarianceAdamW`);
  ``fp32-sharded-localvar100``: the same optimizer through an exact (fp32) exchange, to tell
  the optimizer's share from TernGrad's;
* ``terngrad-b512-last-min0-ef-localvar100``: the same with every tensor ternary, the output
  head and the tensors under 1,024 elements too (``-noclip``: without clipping);
* ``qsgd-5``, ``orq-5``: QSGD and ORQ with 5 levels in buckets of 512 (their defaults).

Every TernGrad-family run uses the sharded exchange (the hook's default). The result table gives
per run the final and best validation loss (nats per character) and bits per character, the
gap to fp32 in percent, and the bytes one rank sent per step (the hook's count; for PyTorch's
hooks the ring all-reduce's ``2 (N-1)/N`` times the gradient's bytes), with the goal this
experiment sets — within 2% of fp32's validation loss while sending at least 10x fewer bytes —
checked per run. Outputs in ``out``: one run folder per run (``<method>-s<seed>``; a
finished run is read back), ``results.json``, ``results.md``, ``curves.png`` (validation bits
per character against step) and ``tradeoff.png`` (bytes per step against the final bits per
character).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from terngrad.comm.spec import methods
from terngrad.experiments import comparison
from terngrad.experiments.comparison import Comparison, Run, at_rates, base_protocol, spread
from terngrad.experiments.time_to_accuracy_report import rate_words
from terngrad.train import models
from terngrad.train.config import TrainConfig
from terngrad.util.files import atomic_write_text

#: the goal: validation loss within this fraction of fp32's ...
LOSS_GAP = 0.02
#: ... while sending at least this many times fewer bytes per step
BYTES_FACTOR = 10.0
#: the methods compared by default
DEFAULT_METHODS = (
    "fp32", "fp16", "terngrad", "terngrad-b512", "terngrad-b2048", "terngrad-ef",
    "terngrad-warmup0.2", "terngrad-b512-warmup0.2", "terngrad-b512-ef-frozen0.2",
    "terngrad-b512-ef-localvar100", "terngrad-b512-last-min0-ef-localvar100",
    "terngrad-b512-noclip-last-min0-ef-localvar100", "fp32-sharded-localvar100", "qsgd-5",
    "orq-5",
)  # fmt: skip
#: local steps (DiLoCo) with AdamW inside, ternary and fp32 outer gradients: not run by
#: default, named with --methods (--eval-every a multiple of 25)
LOCAL_METHODS = ("terngrad-local25", "terngrad-ef-local25", "fp32-sharded-local25")


#: the language models the comparison runs
MODELS = ("gpt", "gpt-small")


def protocol(
    out: str, data_dir: str | None = None, workers: int = 4, steps: int = 1000,
    eval_every: int | None = None, batch_size: int = 16, lr: float = 1e-3, model: str = "gpt",
) -> TrainConfig:  # fmt: skip
    """The training settings every method shares: the GPT (``model``: ``gpt``, or ``gpt-small``
    at half the width) on pydoc, AdamW (lr 1e-3, weight decay 0.1 on matrices and embeddings),
    warm-up over a tenth of the steps, cosine decay, ``batch_size`` windows of 128 characters
    per worker."""
    if model not in MODELS:
        raise ValueError(
            f"the transformer comparison runs one of {', '.join(MODELS)}, not {model!r}"
        )
    return TrainConfig(
        out=out, model=model, dataset="pydoc", data_dir=data_dir, workers=workers,
        optimizer="adamw", lr=lr, weight_decay=0.1, lr_schedule="cosine",
        warmup_steps=max(1, steps // 10), batch_size=batch_size, steps=steps,
        eval_every=eval_every or max(1, steps // 10), keep_checkpoints=1, progress=False,
    )  # fmt: skip


@dataclass(frozen=True)
class TransformerComparison(Comparison):
    """Every method of ``methods`` with ``seeds`` seeds (a seed fixes the initial weights and
    the data order of every method alike), runs in ``<out>/<method>-s<seed>``; the methods
    with a full-precision warm-up get ``full_precision_steps`` (a fifth of the steps)."""

    base: TrainConfig
    methods: Sequence[str] = DEFAULT_METHODS
    seeds: int = 1
    full_precision_steps: int | None = None
    #: settings over ``base`` by method name (tuned: each method's ``lr``, ``outer_lr``)
    per_method: Mapping[str, Mapping[str, Any]] = field(default_factory=dict, hash=False)
    #: the seed the rates were tuned on (:mod:`terngrad.experiments.tuning`)
    tuned_on: int | None = None
    title = "terngrad reproduce transformer"
    #: a learning rate's tuning chooses the lowest final validation loss
    target_metric = "loss"
    target = None

    def for_tuning(self, seed: int, out: str) -> TransformerComparison:
        """One run a method on ``seed`` into ``out``."""
        base = self.base.replace(out=out, seed=seed)
        return replace(self, base=base, seeds=1, per_method={}, tuned_on=None)

    def at_rates(
        self, per_method: Mapping[str, Mapping[str, Any]], seed: int
    ) -> TransformerComparison:
        """The comparison with each method's tuned settings (tuned on ``seed``)."""
        return replace(self, per_method=per_method, tuned_on=seed)

    def plan(self) -> list[Run]:
        chosen = methods.select(self.methods, (*DEFAULT_METHODS, *LOCAL_METHODS))
        if self.seeds < 1:
            raise ValueError(f"seeds must be at least 1, got {self.seeds}")
        base_protocol(self.base)  # (the base's method would not run)
        k = self.full_precision_steps
        if k is None:
            k = max(1, self.base.steps // 5)
        if any(m.warmup for m in chosen) and not 0 < k < self.base.steps:
            raise ValueError(
                f"full-precision steps must lie between 1 and the run's {self.base.steps - 1}, "
                f"got {k}"
            )
        runs = []
        first = self.base.seed
        for method in chosen:
            for seed in range(first, first + self.seeds):
                out = str(Path(self.base.out) / f"{method.name}-s{seed}")
                cfg = at_rates(
                    self.base.replace(seed=seed, out=out, method=method,
                                      full_precision_steps=k if method.warmup else None),
                    **self.per_method.get(method.name, {}),
                )  # fmt: skip
                runs.append(Run(method.name, cfg, f"{method.name} seed {seed}", {"seed": seed}))
        return runs

    def report(self, runs: list[Run], summaries: list[dict[str, Any]], out: Path) -> str:
        return write_results(runs, summaries, out, self.tuned_on)


def _record(r: Run, summary: dict[str, Any]) -> dict[str, Any]:
    cfg = r.config
    return {
        "method": r.method, "seed": r.tags["seed"], "loss": summary["loss"],
        "best_loss": summary["best_loss"], "bits_per_char": summary["bits_per_char"],
        "best_bits_per_char": summary["best_bits_per_char"],
        "bytes_per_step": comparison.bytes_per_step(cfg, summary),
        "seconds": summary.get("seconds"), "folder": cfg.out,
        "curve": comparison.curve(cfg, "bits_per_char"),
        "lr": cfg.lr, "outer_lr": cfg.method.local.outer_lr if cfg.method.local else None,
    }  # fmt: skip


def write_results(
    runs: list[Run], summaries: list[dict[str, Any]], out: Path, tuned_on: int | None = None
) -> str:
    """``results.json``, ``results.md``, ``curves.png`` and ``tradeoff.png`` in ``out``; with
    ``tuned_on`` (each method at its own rate) the table gives each method's rates. Returns the
    Markdown."""
    from terngrad.train.report import (
        markdown_table,
        mean_curve,
        write_step_plot,
        write_tradeoff_plot,
    )  # fmt: skip

    base = runs[0].config
    records = [_record(r, s) for r, s in zip(runs, summaries, strict=True)]
    by_method: dict[str, list[dict[str, Any]]] = {}
    for rec in records:
        by_method.setdefault(rec["method"], []).append(rec)
    reference = by_method.get("fp32")
    fp32_loss = statistics.fmean(r["loss"] for r in reference) if reference else None
    fp32_bytes = reference[0]["bytes_per_step"] if reference else None
    rows = []
    for method, recs in by_method.items():
        loss = statistics.fmean(r["loss"] for r in recs)
        sent = statistics.fmean(r["bytes_per_step"] for r in recs)
        gap = 100 * (loss / fp32_loss - 1) if fp32_loss else None
        fewer = fp32_bytes / sent if fp32_bytes else None
        goal = (gap is not None and fewer is not None and gap <= 100 * LOSS_GAP
                and fewer >= BYTES_FACTOR)  # fmt: skip
        rows.append([
            method, *([rate_words(recs[0])] if tuned_on is not None else []), str(len(recs)),
            spread([r["loss"] for r in recs], 4),
            spread([r["best_loss"] for r in recs], 4),
            spread([r["bits_per_char"] for r in recs], 3),
            "—" if gap is None else f"{gap:+.2f}%", f"{sent:,.0f}",
            "—" if fewer is None else f"{fewer:.1f}x", "yes" if goal else "no",
        ])  # fmt: skip
    table = markdown_table(
        ["method", *(["lr (outer lr)"] if tuned_on is not None else []), "seeds",
         "final val loss", "best", "bits/char", "vs fp32", "bytes / step / rank", "fewer bytes",
         f"within {100 * LOSS_GAP:.0f}%, ≥{BYTES_FACTOR:.0f}x"],
        rows,
    )  # fmt: skip
    k = max((r.config.full_precision_steps or 0 for r in runs), default=0)
    text = (
        f"# TernGrad on a transformer: {base.model} on {base.dataset}, {base.workers} workers, "
        f"{base.steps} steps\n\n{table}\n"
        "Settings: AdamW, "
        + (
            f"each method at its own lr (the column lr), tuned on seed {tuned_on}, kept out of "
            "the comparison (tuning/tuning.md)"
            if tuned_on is not None
            else f"lr {base.lr}"
        )
        + f" (warm-up from lr/10 over {base.warmup_steps} steps, "
        f"cosine to lr/10), weight decay {base.weight_decay} on matrices and embeddings, "
        f"{base.worker_batch} windows of {models.default_input_shape(base.model)[0]} characters "
        f"per worker; the -warmup0.2 methods average in full precision for their "
        f"first {k} steps. Loss is nats per character on the held-out files' validation windows "
        "(bits/char = loss / ln 2); ± is the sample standard deviation over seeds. Bytes: the "
        "hook's count per rank; for PyTorch's fp32/fp16 hooks the ring all-reduce's 2 (N-1)/N "
        "times the gradient's bytes.\n"
    )
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "results.md", text)
    result = {"settings": base.to_dict(), "tuned_on": tuned_on, "runs": records}
    atomic_write_text(out / "results.json", json.dumps(result, indent=2) + "\n")
    lines = {m: mean_curve([r["curve"] for r in recs]) for m, recs in by_method.items()}
    write_step_plot(
        lines, out / "curves.png", f"{base.model} on {base.dataset}: validation bits per "
        "character (mean over seeds)", ylabel="validation bits per character", percent=False,
    )  # fmt: skip
    points = {
        m: (statistics.fmean(r["bytes_per_step"] for r in recs),
            statistics.fmean(r["bits_per_char"] for r in recs))
        for m, recs in by_method.items()
    }  # fmt: skip
    write_tradeoff_plot(
        points, out / "tradeoff.png", f"{base.model} on {base.dataset}, {base.steps} steps: "
        "bytes against the final validation loss", xlabel="bytes one rank sends per step",
        ylabel="final validation bits per character",
    )  # fmt: skip
    return text
