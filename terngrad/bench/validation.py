"""The performance model against the testbed (``terngrad perf-model validate``): calibrate it on
a ``terngrad bench network`` run with unshaped links (the host rate ``H`` that reproduces fp32's
step, each method's codec seconds per element ``κ`` that reproduces its step), then predict the
steps measured on shaped links from each run's compute time and link probe.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from terngrad.bench.perf_model import Cluster, Profile, modelled, predict
from terngrad.comm.spec import methods
from terngrad.util.files import read_json


def _solve(f: Callable[[float], float], target: float, lo: float, hi: float) -> float:
    """``x`` in ``[lo, hi]`` with ``f(x) = target`` for increasing ``f`` (bisection in log
    space; an end of the range if the target lies beyond it)."""
    if f(lo) >= target:
        return lo
    if f(hi) <= target:
        return hi
    for _ in range(100):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if f(mid) < target else (lo, mid)
    return math.sqrt(lo * hi)


@dataclass(frozen=True)
class Calibration:
    """What the model takes from a run on unshaped links: the host rate ``H`` and each
    method's codec seconds per element."""

    model: str
    workers: int
    host_bytes_per_s: float
    codec_seconds_per_element: dict[str, float] = field(default_factory=dict)


def _steps(summary: dict) -> dict[str, float]:
    """The measured step of every method the model knows, by its name in the table."""
    named = ((methods.canonical(m["method"]), m) for m in summary["methods"])
    return {name: m["step_seconds"] for name, m in named if modelled(name)}


def calibrate(summary: dict, prof: Profile) -> Calibration:
    """``H`` and every method's ``κ`` from ``summary`` (``bench network`` results with
    ``--bandwidth unlimited``, fp32 among the methods)."""
    if summary.get("bandwidth") != "unlimited":
        raise ValueError(
            "calibrate on a run with unshaped links (terngrad bench network --bandwidth "
            f"unlimited); this one had {summary.get('bandwidth')!r}"
        )
    steps, compute, n = _steps(summary), summary["compute_seconds"], summary["ranks"]
    if "fp32" not in steps:
        raise ValueError("the calibration run needs the fp32 method (it gives the host's rate)")

    def at(host: float, name: str, kappa: float) -> float:
        return predict(prof, name, Cluster(n, math.inf, host), compute, kappa).seconds

    host = _solve(lambda h: -at(h, "fp32", 0.0), -steps["fp32"], 1e6, 1e12)
    kappas = {
        name: _solve(lambda k, name=name: at(host, name, k), t, 1e-13, 1e-5)
        for name, t in steps.items()
        if name != "fp32"
    }
    return Calibration(prof.model, n, host, {"fp32": 0.0, **kappas})


@dataclass(frozen=True)
class Check:
    """One method at one bandwidth: measured and predicted step seconds."""

    bandwidth: str
    method: str
    measured: float
    predicted: float

    @property
    def error(self) -> float:
        return self.predicted / self.measured - 1.0


def validate(calibration: Calibration, summaries: Iterable[dict], prof: Profile) -> list[Check]:
    """Predict every method of every run in ``summaries`` (shaped links; each run's own compute
    time and link probe as inputs) and set it beside the measurement."""
    checks = []
    for s in summaries:
        if s["model"] != calibration.model or s["ranks"] != calibration.workers:
            raise ValueError(
                f"run of {s['model']} on {s['ranks']} ranks cannot be checked against a "
                f"calibration of {calibration.model} on {calibration.workers}"
            )
        if "link_probe" not in s:
            raise ValueError(
                f"the {s['bandwidth']} run has no link probe: rerun it with this version of "
                "terngrad bench network"
            )
        cluster = Cluster(
            s["ranks"], s["link_probe"]["bytes_per_second"], calibration.host_bytes_per_s
        )
        for name, measured in _steps(s).items():
            if name not in calibration.codec_seconds_per_element:
                continue
            step = predict(
                prof, name, cluster, s["compute_seconds"],
                calibration.codec_seconds_per_element[name],
            )  # fmt: skip
            checks.append(Check(s["bandwidth"], name, measured, step.seconds))
    return checks


def load_summary(path: str) -> dict:
    """A ``bench network`` results.json; ``ValueError`` with the reason if it is not one."""
    summary = read_json(path, "results file")
    needed = {"ranks", "bandwidth", "model", "compute_seconds", "methods"}
    if not isinstance(summary, dict) or not needed <= set(summary):
        raise ValueError(f"{path} is not the results.json of terngrad bench network")
    return summary


def validation_table(calibration: Calibration, checks: Sequence[Check]) -> str:
    """The model-against-measurement table, in Markdown."""
    lines = [
        f"{calibration.model}, {calibration.workers} ranks; calibrated: host "
        f"{calibration.host_bytes_per_s / 1e6:.0f} MB/s, codec "
        + ", ".join(
            f"{k} {v * 1e9:.2f} ns/element"
            for k, v in calibration.codec_seconds_per_element.items()
            if k != "fp32"
        ),
        "",
        "| links | method | measured s | predicted s | error |",
        "|---|---|---:|---:|---:|",
    ]
    for c in checks:
        lines.append(
            f"| {c.bandwidth} | {c.method} | {c.measured:.3f} | {c.predicted:.3f} | "
            f"{100 * c.error:+.1f}% |"
        )
    worst = max((abs(c.error) for c in checks), default=0.0)
    lines += ["", f"largest error: {100 * worst:.1f}% over {len(checks)} predictions"]
    return "\n".join(lines)
