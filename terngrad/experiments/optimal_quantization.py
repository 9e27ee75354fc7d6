"""The optimal-quantization paper's comparison, trained for real: ``terngrad reproduce orq``.

Xu, Huo, Huang (2020, Sec. 4) compare TernGrad, QSGD-s, Linear-s, ORQ-s (s = 3, 5, 9), BinGrad-b,
BinGrad-pb and scaled SignSGD, bucket-based, without and with TernGrad's clipping at 2.5 sigma,
and claim that ORQ-s beats QSGD-s and Linear-s at every s, that BinGrad beats sign, and that
with clipping they come close to full precision. Their code simulated the encoding; here every
run is ``terngrad train``: ``workers`` real processes, each quantizing its own gradient into the
bytes that travel.

* Every method quantizes every tensor (the last layer too, no size floor: the protocol
  :data:`PROTOCOL`) in buckets of 512 elements, one set of scales (or levels) each: the methods
  ``terngrad-b512``, ``qsgd-s``, ``linear-s``, ``orq-s``, ``bingrad-b``, ``bingrad-pb`` and
  ``signsgd-b512`` of :data:`terngrad.comm.spec.methods.METHODS`. The available text of the paper
  does not state its bucket size ``d``; 512 is QSGD's, and what ``terngrad study`` uses.
* ``noclip``: the methods as they are (TernGrad without its clipping). ``clip``: every method
  clips at 2.5 sigma (:mod:`terngrad.quantize.clipping`) and every run of the variant, fp32
  too, warms the learning rate up linearly from lr/10 (the paper: 5 epochs, for ORQ and BinGrad;
  our runs are shorter than 5 epochs, so the warm-up is the first ``warmup_steps``, by default
  10% of the steps, and it is given to every method of the variant so the comparison stays
  fair).
* Exchange: ``allgather`` by default — every worker's message is decoded and averaged exactly,
  so the table measures the quantizers, not a second rounding. :data:`ALGORITHM2` adds the
  paper's parameter-server Algorithm 2 for ORQ-5 and BinGrad-b with both low-bit broadcasts
  (levels coherent among the workers; the average re-quantized with server error feedback).
* fp32 is PyTorch's own DDP all-reduce (``--baseline fp32``).

Outputs in ``out``: one run folder per run (``<variant>/<method>-s<seed>``; a finished run is
read back, not trained again), ``results.json`` (every run), ``results.md`` (mean ± std over the
seeds, each claim of the paper tested against the spread), ``curves-<variant>.png``.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from terngrad.comm.spec import methods
from terngrad.experiments import comparison
from terngrad.experiments.comparison import Comparison, Run, spread
from terngrad.train.config import TrainConfig
from terngrad.util.files import atomic_write_text

#: elements per bucket (one set of scales or levels each) of every method
BUCKET = 512
#: TernGrad's clipping constant c (clip at c sigma)
CLIP = 2.5
LEVELS = (3, 5, 9)
VARIANTS = ("noclip", "clip")
DEFAULT_METHODS = (
    "fp32", "terngrad-b512", *(f"{q}-{s}" for q in ("qsgd", "linear", "orq") for s in LEVELS),
    "bingrad-b", "bingrad-pb", "signsgd-b512",
)  # fmt: skip
#: the methods run with several seeds (the rest, and fp32, get as many too if asked)
SEEDED = ("fp32", "terngrad-b512", "qsgd-5", "linear-5", "orq-5", "bingrad-b", "bingrad-pb",
          "signsgd-b512")  # fmt: skip
#: Algorithm 2 rows: (method, aggregate) through the parameter server, clipped, first seed
ALGORITHM2 = (
    ("orq-5", "coherent"), ("orq-5", "requantize"),
    ("bingrad-b", "coherent"), ("bingrad-b", "requantize"),
)  # fmt: skip
#: what every method of the comparison runs under: every tensor quantized, exact averages
PROTOCOL = {"topology": "allgather", "quantize_last": True, "min_numel": 0}


#: the exchanges whose average is exact (the table's main rows; the others are Algorithm 2's)
EXACT = ("allgather", "all-reduce")


def exchange_of(run: Run) -> str:
    """``allgather``, ``all-reduce`` (PyTorch's, for fp32), or ``ps/<aggregate>`` for an
    Algorithm 2 row."""
    if run.config.method.baseline is not None:
        return "all-reduce"
    x = run.config.hook_options
    return "allgather" if x.topology == "allgather" else f"{x.topology}/{x.aggregate}"


#: the data set each model is compared on, and its default length in steps
DATASETS = {"lenet": "mnist", "cifarnet": "fashion"}
STEPS = {"lenet": 600, "cifarnet": 1000}


def protocol(
    out: str, model: str = "lenet", dataset: str | None = None, data_dir: str | None = None,
    workers: int = 4, steps: int | None = None, eval_every: int | None = None,
) -> TrainConfig:  # fmt: skip
    """The training settings of one model: LeNet's (momentum 0.9, lr 0.01 with poly decay,
    weight decay 5e-4) or, for the CIFAR ConvNet, Table 1's (Adam, lr 2e-4); 64 examples per
    worker either way. By default LeNet on MNIST for 600 steps, the ConvNet on Fashion-MNIST
    for 1,000, another model on synthetic data for 600; a tenth of the steps between
    evaluations."""
    dataset = dataset or DATASETS.get(model, "synthetic")
    steps = steps or STEPS.get(model, 600)
    every = eval_every or max(1, steps // 10)
    common = dict(out=out, model=model, dataset=dataset, data_dir=data_dir, workers=workers,
                  batch_size=64, steps=steps, eval_every=every, keep_checkpoints=1,
                  progress=False)  # fmt: skip
    if model == "cifarnet":
        return TrainConfig(**common, optimizer="adam", lr=2e-4)
    return TrainConfig(
        **common, optimizer="momentum", lr=0.01, momentum=0.9, lr_schedule="poly",
        weight_decay=5e-4,
    )  # fmt: skip


@dataclass(frozen=True)
class ORQComparison(Comparison):
    """Every method of ``methods`` in every variant, ``seeds`` seeds for those in
    :data:`SEEDED` (one for the rest), then the :data:`ALGORITHM2` rows whose method is asked
    for (clipped); runs in ``<out>/<variant>/<method>-s<seed>[-ps-<aggregate>]``."""

    base: TrainConfig
    methods: Sequence[str] = DEFAULT_METHODS
    variants: Sequence[str] = VARIANTS
    seeds: int = 3
    warmup_steps: int | None = None
    algorithm2: bool = True
    title = "terngrad reproduce orq"

    def plan(self) -> list[Run]:
        chosen = [m.name for m in methods.select(self.methods, DEFAULT_METHODS)]
        for variant in self.variants:
            if variant not in VARIANTS:
                raise ValueError(f"unknown variant {variant!r}; choose from: {', '.join(VARIANTS)}")
        if len(set(self.variants)) != len(self.variants):
            raise ValueError("each variant may be named once")
        if self.seeds < 1:
            raise ValueError(f"seeds must be at least 1, got {self.seeds}")
        runs = []
        for variant in self.variants:
            for name in chosen:
                for seed in range(self.seeds if name in SEEDED else 1):
                    runs.append(self._run(name, variant, seed))
        if self.algorithm2 and "clip" in self.variants:
            for name, aggregate in ALGORITHM2:
                if name in chosen:
                    runs.append(self._run(name, "clip", 0, "ps", aggregate))
        return runs

    def _run(self, name, variant, seed, topology="allgather", aggregate="requantize") -> Run:
        clipped = variant == "clip"
        folder = f"{variant}/{name}-s{seed}"
        if topology != "allgather":
            folder += f"-{topology}-{aggregate}"
        warmup = self.base.steps // 10 if self.warmup_steps is None else self.warmup_steps
        base = self.base.replace(seed=seed, warmup_steps=warmup if clipped else 0)
        protocol = {**PROTOCOL, "topology": topology, "aggregate": aggregate,
                    "quantizer_options": {"clip": CLIP if clipped else None}}  # fmt: skip
        cfg = base.replace(out=str(Path(self.base.out) / folder),
                           method=methods.get(name).under(**protocol))  # fmt: skip
        run = Run(name, cfg, "", {"variant": variant, "seed": seed})
        label = f"{name} {variant} seed {seed} ({exchange_of(run)})"
        return Run(name, cfg, label, run.tags)

    def report(self, runs: list[Run], summaries: list[dict[str, Any]], out: Path) -> str:
        return write_results(runs, summaries, out)


def bits_per_element(cfg: TrainConfig) -> float:
    """Wire bits per gradient element of one worker's message of the run's whole gradient
    (every tensor its own segment): 32 for PyTorch's fp32."""
    if cfg.method.baseline is not None:
        return 32.0
    from terngrad.train import models

    net = models.build(cfg.model, models.default_input_shape(cfg.model), 10, None)
    sizes = [p.numel() for p in net.parameters()]
    q = cfg.hook_options.make_quantizer()
    return 8 * q.message_nbytes(sum(sizes), sizes) / sum(sizes)


def _record(r: Run, summary: dict[str, Any]) -> dict[str, Any]:
    cfg = r.config
    return {
        "method": r.method, "variant": r.tags["variant"], "seed": r.tags["seed"],
        "exchange": exchange_of(r), "final_accuracy": summary["accuracy"],
        "best_accuracy": summary["best_accuracy"], "bits_per_element": bits_per_element(cfg),
        "bytes_per_step": comparison.bytes_per_step(cfg, summary),
        "seconds": summary.get("seconds"), "folder": cfg.out, "curve": comparison.curve(cfg),
    }  # fmt: skip


def compare(records: list[dict[str, Any]], a: str, b: str, variant: str) -> str | None:
    """``a`` against ``b`` on final accuracy in ``variant`` (the allgather rows): the difference
    of the means and whether it exceeds twice its standard error ("higher"/"lower", else "within
    the noise"); ``None`` if either is missing. Runs of one seed share the initial weights and the
    data order, so where both have the same seeds (two or more) the difference is taken seed by
    seed (paired: the seed's own effect cancels); else the two spreads are combined (Welch)."""

    def by_seed(method: str) -> dict[int, float]:
        return {
            r["seed"]: r["final_accuracy"]
            for r in records
            if (r["method"], r["variant"]) == (method, variant) and r["exchange"] in EXACT
        }

    xs, ys = by_seed(a), by_seed(b)
    if not xs or not ys:
        return None
    if len(xs) > 1 and xs.keys() == ys.keys():
        diffs = [100 * (xs[k] - ys[k]) for k in sorted(xs)]
        diff = statistics.fmean(diffs)
        se = statistics.stdev(diffs) / math.sqrt(len(diffs))
        how = f"paired over {len(diffs)} seeds"
    elif len(xs) > 1 and len(ys) > 1:
        diff = 100 * (statistics.fmean(xs.values()) - statistics.fmean(ys.values()))
        se = 100 * math.sqrt(
            statistics.variance(xs.values()) / len(xs) + statistics.variance(ys.values()) / len(ys)
        )
        how = "unpaired"
    else:
        diff = 100 * (statistics.fmean(xs.values()) - statistics.fmean(ys.values()))
        return f"{a} − {b}: {diff:+.2f} points (one seed: no error bar)"
    verdict = ("higher" if diff > 0 else "lower") if abs(diff) > 2 * se else "within the noise"
    return f"{a} − {b}: {diff:+.2f} points (± {se:.2f} s.e., {how}; {verdict})"


def write_results(runs: list[Run], summaries: list[dict[str, Any]], out: Path) -> str:
    """``results.json``, ``results.md`` and ``curves-<variant>.png`` in ``out``; returns the
    Markdown."""
    from terngrad.train.report import markdown_table  # matplotlib: only when writing

    records = [_record(r, s) for r, s in zip(runs, summaries, strict=True)]
    base = runs[0].config
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for rec in records:
        groups.setdefault((rec["variant"], rec["exchange"], rec["method"]), []).append(rec)
    rows = []
    for (variant, exchange, method), recs in groups.items():
        rows.append([
            method, variant, exchange, str(len(recs)),
            spread([r["final_accuracy"] for r in recs], 2, 100),
            spread([r["best_accuracy"] for r in recs], 2, 100),
            f"{recs[0]['bits_per_element']:.2f}",
            f"{statistics.fmean(r['bytes_per_step'] for r in recs):,.0f}",
        ])  # fmt: skip
    table = markdown_table(
        ["method", "variant", "exchange", "seeds", "final test accuracy (%)", "best (%)",
         "bits / element", "bytes sent / step / rank"],
        rows,
    )  # fmt: skip
    claims = []
    variants = sorted({r.tags["variant"] for r in runs}, key=VARIANTS.index)
    for variant in variants:
        pairs = [(f"orq-{s}", f"{other}-{s}") for s in LEVELS for other in ("qsgd", "linear")]
        pairs += [("bingrad-b", "signsgd-b512"), ("bingrad-pb", "signsgd-b512")]
        pairs += [(m, "fp32") for m in ("orq-5", "bingrad-b", "bingrad-pb", "terngrad-b512")]
        lines = [c for c in (compare(records, a, b, variant) for a, b in pairs) if c]
        lines += _broadcasts(records, variant)
        if lines:
            claims.append(f"**{variant}**\n\n" + "\n".join(f"- {line}" for line in lines))
    text = (
        f"# ORQ / BinGrad comparison: {base.model} on {base.dataset}, {base.workers} workers, "
        f"{base.steps} steps\n\n{table}\n## The paper's claims, measured\n\n"
        + "\n\n".join(claims)
        + f"\n\nSettings: {base.optimizer}, lr {base.lr} ({base.lr_schedule}), weight decay "
        f"{base.weight_decay}, {base.worker_batch} examples per worker; every tensor quantized in "
        f"buckets of {BUCKET}; clip variant: clipping at {CLIP} sigma and a linear warm-up from "
        f"lr/10 over {_warmup(runs)} steps for every method (fp32 too). Accuracy is on the whole "
        "test set; ± in the table is the sample standard deviation over seeds; a difference is "
        "called real (higher/lower) when it exceeds twice its standard error, taken seed by seed "
        "where both methods ran the same seeds (a seed fixes the initial weights and the data "
        "order of every method alike).\n"
    )
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "results.md", text)
    result = {"settings": base.to_dict(), "bucket_size": BUCKET, "clip": CLIP, "runs": records}
    atomic_write_text(out / "results.json", json.dumps(result, indent=2) + "\n")
    for variant in variants:
        _write_curves(records, variant, out / f"curves-{variant}.png", base)
    return text


def _broadcasts(records: list[dict[str, Any]], variant: str) -> list[str]:
    """Algorithm 2's rows against the same method and seed through ``allgather`` (whose
    aggregate is exact): what the low-bit broadcast cost in accuracy and saved in bytes."""
    exact = {(r["method"], r["seed"]): r for r in records
             if r["variant"] == variant and r["exchange"] in EXACT}  # fmt: skip
    lines = []
    for r in records:
        base = exact.get((r["method"], r["seed"]))
        if r["variant"] != variant or r["exchange"] in EXACT or base is None:
            continue
        lines.append(
            f"Algorithm 2, {r['method']} through {r['exchange']}: final "
            f"{100 * r['final_accuracy']:.2f}% against {100 * base['final_accuracy']:.2f}% with "
            f"the exact average (seed {r['seed']}); the server sends {r['bytes_per_step']:,.0f} "
            f"bytes a step (an allgather rank {base['bytes_per_step']:,.0f})"
        )
    return lines


def _warmup(runs: list[Run]) -> int:
    return max((r.config.warmup_steps for r in runs), default=0)


def _write_curves(records, variant: str, path: Path, base: TrainConfig) -> None:
    """Mean test accuracy over the seeds against step, one line per method (allgather rows)."""
    from terngrad.train.report import mean_curve, write_step_plot

    by_method: dict[str, list[list[tuple[int, float]]]] = {}
    for rec in records:
        if rec["variant"] == variant and rec["exchange"] in EXACT:
            by_method.setdefault(rec["method"], []).append(rec["curve"])
    lines = {method: mean_curve(curves) for method, curves in by_method.items()}
    title = f"{base.model} on {base.dataset}, {variant}: mean test accuracy over seeds"
    write_step_plot(lines, path, title)
