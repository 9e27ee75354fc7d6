"""A bandwidth sweep of ``terngrad bench accuracy``: the same comparison at several link rates
(each in ``<out>/<bandwidth>/``), then the time to target of every method against the link's
rate and against how far communication outweighs compute there — where TernGrad starts to win.

``sweep.json`` keeps, per bandwidth, every method's mean and spread of the seconds and steps to
target over its seeds and how many times sooner than fp32 and fp16 it got there, and the race
this project runs: the fastest of PyTorch's own (fp32, fp16, PowerSGD) against terngrad's
fastest, and terngrad's against the fastest method on the fastest link swept (the slow link made
free); ``sweep.md`` the tables, ``sweep.png`` the two plots.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from terngrad.bench import testbed
from terngrad.comm.spec import methods
from terngrad.experiments.time_to_accuracy import AccuracyComparison
from terngrad.experiments.time_to_accuracy_report import rate_words, results_target
from terngrad.util.files import atomic_write, atomic_write_text


def comparisons(plan: AccuracyComparison, bandwidths: Sequence[str]) -> list[AccuracyComparison]:
    """``plan`` at each of ``bandwidths``, each into its own folder under ``plan.base.out``."""
    if len(set(bandwidths)) != len(bandwidths):
        raise ValueError("each bandwidth may be given once")
    out = Path(plan.base.out)
    return [
        replace(plan, bandwidth=bw, base=plan.base.replace(out=str(out / bw))) for bw in bandwidths
    ]


def _rate(bandwidth: str) -> float | None:
    bits = testbed.rate_bits(bandwidth)
    return None if bits is None else bits / 1e6


def summarise(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The sweep from each bandwidth's ``results.json`` (in the order given): per bandwidth and
    method, the mean seconds and steps to target and the speedups; the communication/compute
    ratio of each link (an fp32 ring all-reduce of the model's gradient at the link's rate,
    over the compute of a step: fp32's step on the fastest link swept)."""
    from terngrad.experiments.comparison import gradient_numel
    from terngrad.train.config import TrainConfig

    first = results[0]
    cfg = TrainConfig(out="-", model=first["model"], dataset=first["dataset"])
    ring = 2 * (first["workers"] - 1) * 4 * gradient_numel(cfg) / first["workers"]
    unlimited = [r for r in results if _rate(r["bandwidth"]) is None]
    fastest = unlimited[0] if unlimited else max(results, key=lambda r: _rate(r["bandwidth"]))
    fp32 = next((m for m in fastest["methods"] if m["method"] == "fp32"), None)
    compute = fp32["step_seconds"] if fp32 else None
    points = []
    for r in results:
        rate = _rate(r["bandwidth"])
        ratio = None
        if rate is not None and compute:
            ratio = ring / (rate * 1e6 / 8) / compute
        points.append({
            "bandwidth": r["bandwidth"],
            "mbit_per_s": rate,
            "communication_over_compute": ratio,
            "methods": {
                m["method"]: {
                    "seconds_to_target": m["reached"]["train_seconds"] if m["reached"] else None,
                    "seconds_to_target_sd": m["seconds_to_target_sd"],
                    "steps_to_target": m["reached"]["step"] if m["reached"] else None,
                    "steps_to_target_sd": m["steps_to_target_sd"],
                    "reached_runs": m["reached_runs"],
                    "seeds": m["seeds"],
                    "lr": m.get("lr"),
                    "outer_lr": m.get("outer_lr"),
                    "step_seconds": m["step_seconds"],
                    "sooner_than_fp32": m["sooner_than_fp32"],
                    "sooner_than_fp16": m["sooner_than_fp16"],
                }
                for m in r["methods"]
            },
        })  # fmt: skip
    free = _fastest(next(p for p in points if p["bandwidth"] == fastest["bandwidth"]), None)
    for p in points:
        pytorch, ours = _fastest(p, True), _fastest(p, False)
        p["fastest_pytorch"], p["fastest_terngrad"] = pytorch, ours
        p["terngrad_sooner_than_pytorch"] = (
            pytorch["seconds"] / ours["seconds"] if pytorch and ours else None
        )
        p["terngrad_over_fastest_on_fastest_link"] = (
            ours["seconds"] / free["seconds"] if ours and free else None
        )
    return {
        "model": first["model"],
        "dataset": first["dataset"],
        "workers": first["workers"],
        "target": first["target"],
        "target_metric": first.get("target_metric", "accuracy"),
        "seeds": first.get("seeds"),
        "tuned_on": first.get("tuned_on"),
        "fp32_ring_bytes_per_step": ring,
        "compute_seconds": compute,
        "fastest_on_fastest_link": free,
        "points": points,
    }


def _fastest(point: dict[str, Any], pytorch: bool | None) -> dict[str, Any] | None:
    """The method of ``point`` with the fewest mean seconds to target among PyTorch's own
    (``pytorch``), terngrad's (``not pytorch``) or all (``None``); ``None`` if none got there."""
    reached = [
        {"method": name, "seconds": m["seconds_to_target"]}
        for name, m in point["methods"].items()
        if m["seconds_to_target"] is not None and (pytorch is None or _is_pytorchs(name) == pytorch)
    ]
    return min(reached, key=lambda r: r["seconds"], default=None)


def _is_pytorchs(name: str) -> bool:
    """Whether a method is PyTorch's own averaging (fp32, fp16, PowerSGD at any rank)."""
    return methods.get(methods.canonical(name)).baseline is not None


def _method_names(sweep: dict[str, Any]) -> list[str]:
    """Every method of the sweep, in the order first met (a link may run fewer)."""
    names: dict[str, None] = {}
    for p in sweep["points"]:
        names.update(dict.fromkeys(p["methods"]))
    return list(names)


def markdown(sweep: dict[str, Any]) -> str:
    """The sweep as a table: a row per bandwidth, a column per method (mean seconds to target ±
    sd, and how many times sooner than fp32 / fp16)."""
    from terngrad.train.report import markdown_table

    names = _method_names(sweep)
    header = ["links", "comm / compute", *names]
    rows = []
    for p in sweep["points"]:
        ratio = p["communication_over_compute"]
        cells = [p["bandwidth"], "-" if ratio is None else f"{ratio:.2f}"]
        for name in names:
            m = p["methods"].get(name)
            if m is None or m["seconds_to_target"] is None:
                cells.append("not reached" if m else "-")
                continue
            sd = m["seconds_to_target_sd"]
            speed = " / ".join(
                f"{m[f'sooner_than_{b}']:.2f}x" if m[f"sooner_than_{b}"] else "-"
                for b in ("fp32", "fp16")
            )
            cells.append(f"{m['seconds_to_target']:.0f} ± {sd:.0f} s ({speed})")
        rows.append(cells)
    target, _ = results_target(sweep)
    race = []
    for p in sweep["points"]:
        pytorch, ours = p["fastest_pytorch"], p["fastest_terngrad"]
        sooner = p["terngrad_sooner_than_pytorch"]
        made_free = p["terngrad_over_fastest_on_fastest_link"]
        race.append([
            p["bandwidth"],
            f"{pytorch['method']} {pytorch['seconds']:.0f} s" if pytorch else "-",
            f"{ours['method']} {ours['seconds']:.0f} s" if ours else "-",
            "-" if sooner is None else f"{sooner:.2f}x",
            "-" if made_free is None else f"{made_free:.2f}x",
        ])  # fmt: skip
    rates = ""
    if sweep.get("tuned_on") is not None:
        raced = {}
        for p in sweep["points"]:
            for name, m in p["methods"].items():
                raced.setdefault(name, rate_words(m))
        rates = (
            f"Each method raced at its own learning rate (outer rate in brackets), tuned on seed "
            f"{sweep['tuned_on']}, kept out of the race (tuning/tuning.md): "
            + ", ".join(f"{name} {words}" for name, words in raced.items())
            + ".\n\n"
        )
    best = sweep["fastest_on_fastest_link"]
    free = f"{best['method']} {best['seconds']:.0f} s" if best else "none reached the target"
    race_header = ["links", "fastest of PyTorch's (fp32, fp16, PowerSGD)", "fastest of terngrad's",
                   "terngrad sooner", "terngrad / fastest on the fastest link"]  # fmt: skip
    return (
        f"# Time to {target} against the link: {sweep['model']} on {sweep['dataset']}, "
        f"{sweep['workers']} ranks\n\n" + markdown_table(header, rows) + "\n"
        f"Each cell: mean training seconds to {target} over seeds {sweep['seeds']} (± sample "
        "sd), then how many times sooner than fp32 / fp16 (ratios of the means); '-': not run "
        "on that link. comm / compute: an fp32 ring all-reduce of the gradient at the link's "
        "rate over fp32's step on the fastest link swept.\n\n"
        + rates
        + "## terngrad against PyTorch's own\n\n"
        + markdown_table(race_header, race)
        + "\n"
        "The last column: terngrad's time on this link over the fastest method's on the fastest "
        f"link swept ({free}): 1.00x is a slow link made free.\n"
    )


def plot(
    sweep: dict[str, Any], path: Path
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Seconds to target against the link's rate (left) and against comm / compute (right),
    a line per method with the seeds' spread, from the slowest link to the fastest whatever
    the order swept; 'unlimited' drawn right of the fastest rate, the ticks at the rates swept.
    A link where a method ran but some seed never reached the target breaks its line and is
    drawn as a cross at the top (no mean to draw; a line across it would suggest one).
    Returns each method's rates drawn as points, and those drawn as crosses, in order."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rates = [p["mbit_per_s"] for p in sweep["points"] if p["mbit_per_s"]]
    free = 4 * max(rates) if rates else 1e4  # where 'unlimited' is drawn
    points = sorted(sweep["points"], key=lambda p: p["mbit_per_s"] or free)
    fig, (by_rate, by_ratio) = plt.subplots(1, 2, figsize=(12, 5.2), sharey=True)
    drawn: dict[str, list[float]] = {}
    missed: dict[str, list[tuple[float, float | None, str]]] = {}
    for name in _method_names(sweep):
        xs, ratios, ys, errs = [], [], [], []
        for p in points:
            m = p["methods"].get(name)
            if not m:
                continue
            x, ratio = p["mbit_per_s"] or free, p["communication_over_compute"]
            if m["seconds_to_target"] is None:  # ran, not reached: a gap in the line
                xs.append(x)
                ratios.append(ratio)
                ys.append(math.nan)
                errs.append(0.0)
                continue
            xs.append(x)
            ratios.append(ratio)
            ys.append(m["seconds_to_target"])
            errs.append(m["seconds_to_target_sd"] or 0.0)
        reached = [x for x, y in zip(xs, ys, strict=True) if not math.isnan(y)]
        if reached:
            drawn[name] = reached
            bars = by_rate.errorbar(xs, ys, yerr=errs, marker="o", capsize=3, label=name)
            color = bars.lines[0].get_color()
        elif xs:  # never reached: its crosses alone
            color = by_rate.plot([], [], "x", label=f"{name}: not reached")[0].get_color()
        else:
            continue
        missed[name] = [(x, r, color) for x, r, y in zip(xs, ratios, ys, strict=True)
                        if math.isnan(y)]  # fmt: skip
        kept = [(r, y, e) for r, y, e in zip(ratios, ys, errs, strict=True) if r]
        if kept:
            r, y, e = zip(*kept, strict=True)
            by_ratio.errorbar(r, y, yerr=e, marker="o", capsize=3, label=name, color=color)
    top = by_rate.get_ylim()[1]
    for marks in missed.values():
        for x, ratio, color in marks:
            by_rate.plot([x], [top], "x", color=color, markersize=8, clip_on=False)
            if ratio:
                by_ratio.plot([ratio], [top], "x", color=color, markersize=8, clip_on=False)
    if any(missed.values()):
        by_rate.plot([], [], "x", color="gray", label="not reached by every seed")
    by_rate.set_xscale("log")
    by_rate.set_yscale("log")
    by_ratio.set_xscale("log")
    if rates:
        known = sorted(set(rates))
        by_rate.set_xticks([*known, free], [*(f"{t:g}" for t in known), "unlimited"])
        by_rate.set_xticks([], minor=True)  # no log-scale labels between the rates swept
    by_rate.set_xlabel("link rate (Mbit/s)")
    by_ratio.set_xlabel("fp32 all-reduce time / compute time of a step")
    target, _ = results_target(sweep)
    by_rate.set_ylabel(f"training seconds to {target}")
    for ax in (by_rate, by_ratio):
        ax.grid(True, which="both", alpha=0.3)
    if drawn:
        fig.legend(*by_rate.get_legend_handles_labels(), loc="lower center", fontsize=8,
                   ncol=min(5, len(by_rate.get_legend_handles_labels()[1])))  # fmt: skip
    fig.suptitle(
        f"{sweep['model']} on {sweep['dataset']}, {sweep['workers']} ranks: time to "
        f"{target} against the link (measured, mean over seeds)"
    )
    fig.tight_layout(rect=(0, 0.12, 1, 1))  # the legend below, clear of the crosses on top
    try:
        atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=110))
    finally:
        plt.close(fig)
    return drawn, {name: [x for x, _, _ in marks] for name, marks in missed.items() if marks}


def write(out: Path, results: list[dict[str, Any]]) -> str:
    """``sweep.json``, ``sweep.md`` and ``sweep.png`` in ``out``; returns the Markdown."""
    sweep = summarise(results)
    atomic_write_text(out / "sweep.json", json.dumps(sweep, indent=2) + "\n")
    text = markdown(sweep)
    atomic_write_text(out / "sweep.md", text)
    plot(sweep, out / "sweep.png")
    return text


#: what the links of one sweep share, in their ``results.json``
_SAME_SWEEP = ("model", "dataset", "workers", "target", "target_metric", "settings", "tuned_on")


def with_earlier_links(out: Path, results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``results`` and every other link of the same sweep already in ``out`` (a folder whose
    ``results.json`` has the same model, recipe, target and tuning: a sweep run a call a link),
    from the fastest link to the slowest once any is added; otherwise ``results`` as given."""
    given = {r["bandwidth"] for r in results}
    earlier = []
    for path in sorted(out.glob("*/results.json")):
        found = json.loads(path.read_text())
        if found.get("bandwidth") in given or found.get("bandwidth") != path.parent.name:
            continue
        if all(found.get(k) == results[0].get(k) for k in _SAME_SWEEP):
            earlier.append(found)
    if not earlier:
        return results
    return sorted([*results, *earlier], key=lambda r: -(_rate(r["bandwidth"]) or math.inf))


def run(
    plans: list[AccuracyComparison], train: Callable[[AccuracyComparison], None], out: Path
) -> str:
    """Train (or report, as ``train`` does) every bandwidth's comparison in turn, then write
    the sweep: these links and those of earlier calls of the same sweep in ``out``."""
    for plan in plans:
        train(plan)
    results = [json.loads((Path(p.base.out) / "results.json").read_text()) for p in plans]
    return write(out, with_earlier_links(out, results))
