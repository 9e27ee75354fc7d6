"""The report of a :class:`~terngrad.bench.study.Study`: tables, figures, and what they say.

:func:`write_report` writes into a folder ``report.html`` (self-contained: the figures are
embedded), ``report.md`` with the figures beside it (``histograms.png``, ``pareto.png``,
``over-steps.png``) and ``study.json`` (every number). Each file is written to a temporary
name and renamed, so no file is ever half-written (an interrupted run may leave new figures
beside an older report; run it again).
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
from pathlib import Path

from terngrad import quantize
from terngrad.bench.study import Study, Total, clip_effect
from terngrad.util.files import atomic_write, atomic_write_text

FIGURES = ("histograms", "pareto", "over-steps")


def _family(method: str) -> str:
    return method.split("-")[0] if method.split("-")[-1].isdigit() else method


def _pareto(points: dict[str, tuple[float, float]]) -> list[str]:
    """Methods not beaten on both bits and variance by another, in order of bits."""
    front, best = [], math.inf
    for name, (_, var) in sorted(points.items(), key=lambda kv: kv[1]):
        if var < best:
            front.append(name)
            best = var
    return front


def _figures(study: Study) -> dict[str, bytes]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    last = study.captures[-1]
    out = {}

    # --- histograms before and after clipping, the weight tensors of the last capture
    weights = [(n, g) for n, g in last.grads.items() if g.dim() > 1]
    cols = min(3, len(weights)) or 1
    rows = max(1, math.ceil(len(weights) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.3 * rows), squeeze=False)
    for ax, (name, g) in zip(axes.flat, weights, strict=False):
        flat = g.reshape(-1).double()
        sigma, share, angle = clip_effect(g)
        bound = 2.5 * sigma
        top = float(flat.abs().max()) or 1.0
        bins = [(-top + 2 * top * k / 80) for k in range(81)]
        ax.hist(flat.numpy(), bins=bins, color="tab:blue", alpha=0.55, label="gradient")
        ax.hist(flat.clamp(-bound, bound).numpy(), bins=bins, histtype="step", color="tab:red",
                label="clipped at 2.5σ")  # fmt: skip
        for x in (-bound, bound):
            ax.axvline(x, color="tab:red", ls="--", lw=0.8)
        ax.set_yscale("log")
        ax.set_title(f"{name}\n{share:.2%} clipped, direction moves {angle:.2f}°", fontsize=9)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(weights) :]:
        ax.axis("off")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"{study.title}: gradients at step {last.step} (log counts)", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.35 / (3.3 * rows)))  # room for the title
    out["histograms"] = _png(fig, plt)

    # --- variance against bits per element: the Pareto front
    totals = {m: study.total(last.step, m) for m in study.methods}
    points = {m: (t.bits_per_element, max(t.normalized_variance, 1e-7)) for m, t in totals.items()}
    front = _pareto(points)
    fig, ax = plt.subplots(figsize=(7.5, 5))
    families = sorted({_family(m) for m in points})
    colors = {f: plt.cm.tab10(i % 10) for i, f in enumerate(families)}
    for m, (bits, var) in points.items():
        ax.scatter(bits, var, color=colors[_family(m)], s=40 if m in front else 18,
                   edgecolor="black" if m in front else "none", zorder=3)  # fmt: skip
        ax.annotate(m, (bits, var), fontsize=7, xytext=(4, 3), textcoords="offset points")
    ax.plot([points[m][0] for m in front], [points[m][1] for m in front], "k--", lw=0.8,
            label="Pareto front")  # fmt: skip
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("bits per element on the wire")
    ax.set_ylabel("E‖Q(g) − g‖² / ‖g‖²")
    ax.set_title(f"{study.title}: variance against bits, step {last.step}", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    out["pareto"] = _png(fig, plt)

    # --- over training steps
    steps = [c.step for c in study.captures]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for m in study.methods:
        ts = [study.total(s, m) for s in steps]
        a1.plot(steps, [max(t.normalized_variance, 1e-7) for t in ts], marker="o", ms=3, label=m)
        a2.plot(steps, [t.angle_degrees for t in ts], marker="o", ms=3, label=m)
    a1.set_yscale("log")
    a1.set_ylabel("E‖Q(g) − g‖² / ‖g‖²")
    a2.set_ylabel("angle between Q(g) and g (degrees)")
    for ax in (a1, a2):
        ax.set_xlabel("training step")
        ax.grid(alpha=0.3)
    a2.legend(fontsize=6, ncol=2)
    fig.suptitle(f"{study.title}: how the statistics move over training", fontsize=10)
    fig.tight_layout()
    out["over-steps"] = _png(fig, plt)
    return out


def _png(fig, plt) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()


def _total_rows(study: Study, step: int) -> list[list[str]]:
    rows = []
    for m in study.methods:
        t = study.total(step, m)
        rows.append([
            m, f"{t.bits_per_element:.3f}", f"{t.normalized_variance:.4g}",
            f"{t.sampled_normalized_variance:.4g}", f"{t.bias:.4f} (±{t.bias_floor:.4f})",
            f"{t.angle_degrees:.1f}", f"{100 * t.zeros:.1f}", f"{1000 * t.encode_seconds:.2f}",
        ])  # fmt: skip
    return rows


TOTAL_HEADER = [
    "method", "bits/elem", "E‖Q−g‖²/‖g‖² (exact)", "(sampled)", "bias ‖EQ−g‖/‖g‖ (noise)",
    "angle °", "zeros %", "encode ms",
]  # fmt: skip


def _layer_rows(study: Study, step: int) -> tuple[list[str], list[list[str]]]:
    header = ["method"] + [f"{n} ({study.captures[0].grads[n].numel():,})" for n in study.layers]
    rows = []
    for m in study.methods:
        cells = []
        for n in study.layers:
            ms = study.measures[(step, m, n)]
            cells.append(f"{ms.sq_error / ms.sq_norm:.3g}" if ms.sq_norm else "-")
        rows.append([m, *cells])
    return header, rows


def _reference(study: Study) -> str:
    """The method the per-kind ranking follows: TernGrad when studied, else the first."""
    return "terngrad" if "terngrad" in study.methods else next(iter(study.methods))


def _kind_shares(study: Study, step: int) -> list[tuple[str, list[str], float, float, float]]:
    """Per kind of tensor (:attr:`Study.kinds`): (kind, its tensors, its share of ``‖g‖²``,
    the reference method's normalised variance over it, its share of that method's error)."""
    ref = _reference(study)
    total_norm = study.sq_norm(step) or math.inf
    total_error = study.total(step, ref).normalized_variance * total_norm or math.inf
    shares = []
    for kind, names in study.kinds.items():
        norm = study.sq_norm(step, names)
        variance = study.total(step, ref, names).normalized_variance
        shares.append((kind, names, norm / total_norm, variance, variance * norm / total_error))
    return shares


def _kind_rows(study: Study, step: int) -> tuple[list[str], list[list[str]]]:
    """The per-kind table: share of ``‖g‖²``, every method's normalised variance over the
    kind, and the kind's share of the reference method's error."""
    ref = _reference(study)
    header = ["kind", "tensors", "elements", "‖g‖² %", *study.methods, f"{ref} error %"]
    rows = []
    for kind, names, norm_share, _, error_share in _kind_shares(study, step):
        elements = study.total(step, ref, names).numel
        cells = [kind, str(len(names)), f"{elements:,}", f"{100 * norm_share:.2f}"]
        for m in study.methods:
            variance = study.total(step, m, names).normalized_variance
            cells.append(f"{variance:.3g}" if norm_share else "-")
        rows.append([*cells, f"{100 * error_share:.1f}"])
    return header, rows


def kind_findings(study: Study) -> list[str]:
    """Which kinds of tensor the reference method (TernGrad) hurts most, at the last step."""
    step, ref = study.captures[-1].step, _reference(study)
    rank = sorted(
        ((variance, kind, error) for kind, _, norm, variance, error in _kind_shares(study, step)
         if norm),
        reverse=True,
    )  # fmt: skip
    if len(rank) < 2:
        return []
    worst = ", ".join(f"{k} ({v:.3g})" for v, k, _ in rank[:3])
    best = ", ".join(f"{k} ({v:.3g})" for v, k, _ in rank[-3:][::-1])
    heavy = max(rank, key=lambda r: r[2])
    return [
        f"Quantized with {ref} on its own, the kinds of tensor with the largest normalised "
        f"variance at step {step} are {worst}; the smallest, {best}. The largest share of "
        f"the model's {ref} error, {100 * heavy[2]:.0f}%, is {heavy[1]}'s."
    ]


def _clip_rows(study: Study) -> list[list[str]]:
    rows = []
    for c in study.captures:
        for n, g in c.grads.items():
            if g.dim() > 1:
                sigma, share, angle = clip_effect(g)
                top = float(g.abs().max())
                rows.append([str(c.step), n, f"{sigma:.3g}", f"{top / sigma if sigma else 0:.1f}",
                             f"{100 * share:.2f}", f"{angle:.2f}"])  # fmt: skip
    return rows


CLIP_HEADER = ["step", "tensor", "σ", "max|g| / σ", "clipped %", "angle moved °"]


def findings(study: Study) -> list[str]:
    """What the numbers say, in sentences (computed, so they always match the tables)."""
    step = study.captures[-1].step
    t = {m: study.total(step, m) for m in study.methods}
    out = []
    unbiased = {m: quantize.get(q, **o).unbiased for m, (q, o) in study.methods.items()}
    budgets = (1.2, 2.0, 3.0, 4.0, 17.0)
    seen = None
    for b in budgets:
        within = [m for m in t if t[m].bits_per_element <= b]
        if not within:
            continue
        best = min(within, key=lambda m: t[m].normalized_variance)
        fair = min((m for m in within if unbiased[m]), key=lambda m: t[m].normalized_variance,
                   default=None)  # fmt: skip
        if (best, fair) == seen:
            continue
        seen = (best, fair)
        text = (
            f"At {b:g} bits per element or fewer, {best} has the lowest error "
            f"({t[best].normalized_variance:.3g} at {t[best].bits_per_element:.2f} bits"
        )
        if not unbiased[best]:
            text += f"; biased: ‖E Q(g) − g‖/‖g‖ = {t[best].bias:.2f}"
        text += ")"
        if fair is not None and fair != best:
            text += (
                f"; among unbiased methods {fair} ({t[fair].normalized_variance:.3g} at "
                f"{t[fair].bits_per_element:.2f} bits)"
            )
        out.append(text + ".")
    for s in (3, 5, 9):
        trio = [f"{q}-{s}" for q in ("orq", "qsgd", "linear")]
        if all(m in t for m in trio):
            o, q, li = (t[m].normalized_variance for m in trio)
            verdict = "beats" if o < min(q, li) else "does not beat"
            out.append(
                f"With {s} levels ORQ {verdict} QSGD and Linear: variance {o:.3g} against "
                f"{q:.3g} and {li:.3g} ({min(q, li) / o:.2f}× the better of the two)."
            )
    if "terngrad" in t and "terngrad-noclip" in t:
        c, n = t["terngrad"], t["terngrad-noclip"]
        out.append(
            f"Clipping at 2.5σ cuts TernGrad's variance from {n.normalized_variance:.3g} to "
            f"{c.normalized_variance:.3g} ({n.normalized_variance / c.normalized_variance:.1f}×), "
            f"at a bias of {c.bias:.3f} of ‖g‖ (noise floor {c.bias_floor:.3f}); the angle to the "
            f"gradient drops from {n.angle_degrees:.1f}° to {c.angle_degrees:.1f}°."
        )
    if "terngrad-b512" in t and "terngrad" in t:
        b, c = t["terngrad-b512"], t["terngrad"]
        out.append(
            f"Buckets of 512 (one scale each) take TernGrad to {b.normalized_variance:.3g} at "
            f"{b.bits_per_element:.2f} bits (layer-wise: {c.normalized_variance:.3g} at "
            f"{c.bits_per_element:.2f})."
        )
    return out + kind_findings(study)


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _html_table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _sections(study: Study, command: str | None):
    """(title, intro, table header, rows, figure) for every part of the report."""
    last = study.captures[-1]
    header, layer_rows = _layer_rows(study, last.step)
    kind_header, kind_rows = _kind_rows(study, last.step)
    steps = ", ".join(f"{c.step} (loss {c.loss:.3f})" for c in study.captures)
    return [
        ("Summary at the last step", f"Totals over all parameter tensors at step {last.step}; "
         f"each tensor quantized on its own, {study.draws} draws per stochastic method.",
         TOTAL_HEADER, _total_rows(study, last.step), "pareto"),
        ("Per kind of tensor", "The same tensor of every repeated block together "
         f"(blocks.*.attn.qkv.weight): its share of ‖g‖², each method's normalised variance "
         f"over the kind, and the kind's share of {_reference(study)}'s error, step "
         f"{last.step}.", kind_header, kind_rows, None),
        ("Per tensor", "Normalised variance E‖Q(g) − g‖² / ‖g‖² of each parameter tensor "
         f"(elements in brackets), step {last.step}.", header, layer_rows, None),
        ("Gradient histograms and clipping", "TernGrad clips g to ±2.5σ of its tensor before "
         "ternarizing (paper Sec. 3.3, Fig. 2): the share of elements it clips, and how far it "
         "turns the gradient's direction.", CLIP_HEADER, _clip_rows(study), "histograms"),
        ("Over training", f"Captured steps: {steps}.", [], [], "over-steps"),
    ]  # fmt: skip


def write_report(study: Study, out: Path | str, command: str | None = None) -> Path:
    """Write the report into folder ``out``; returns the path of ``report.html``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    figures = _figures(study)
    facts = findings(study)
    for name, data in figures.items():
        atomic_write(out / f"{name}.png", lambda f, data=data: f.write(data))
    sections = _sections(study, command)

    md = [f"# Quantizers on {study.title}'s gradients", ""]
    if command:
        md += ["Made by:", "", f"```sh\n{command}\n```", ""]
    md += ["## Findings", ""] + [f"- {f}" for f in facts] + [""]
    for title, intro, header, rows, figure in sections:
        md += [f"## {title}", "", intro, ""]
        if figure:
            md += [f"![{title}]({figure}.png)", ""]
        if rows:
            md += [_md_table(header, rows), ""]
    atomic_write_text(out / "report.md", "\n".join(md))

    style = (
        "body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}"
        "table{border-collapse:collapse;font-size:13px;margin:1em 0}"
        "td,th{border:1px solid #ccc;padding:3px 7px;text-align:right}"
        "td:first-child,th:first-child{text-align:left}img{max-width:100%}"
    )
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>"
        f"{html.escape(study.title)}: quantizer study</title><style>{style}</style></head><body>",
        f"<h1>Quantizers on {html.escape(study.title)}'s gradients</h1>",
    ]
    if command:
        parts.append(f"<p>Made by: <code>{html.escape(command)}</code></p>")
    parts.append("<h2>Findings</h2><ul>" + "".join(f"<li>{html.escape(f)}</li>" for f in facts))
    parts.append("</ul>")
    for title, intro, header, rows, figure in sections:
        parts.append(f"<h2>{html.escape(title)}</h2><p>{html.escape(intro)}</p>")
        if figure:
            data = base64.b64encode(figures[figure]).decode()
            parts.append(f"<img alt='{html.escape(title)}' src='data:image/png;base64,{data}'>")
        if rows:
            parts.append(_html_table(header, rows))
    parts.append("</body></html>")
    atomic_write_text(out / "report.html", "\n".join(parts))

    numbers = {
        "title": study.title,
        "command": command,
        "draws": study.draws,
        "methods": {m: {"quantizer": q, "options": o} for m, (q, o) in study.methods.items()},
        "steps": [{"step": c.step, "loss": c.loss} for c in study.captures],
        "totals": {
            str(c.step): {m: _total_dict(study.total(c.step, m)) for m in study.methods}
            for c in study.captures
        },
        "per_tensor_normalized_variance": {
            str(c.step): {
                m: {
                    n: study.measures[(c.step, m, n)].sq_error
                    / (study.measures[(c.step, m, n)].sq_norm or math.inf)
                    for n in study.layers
                }
                for m in study.methods
            }
            for c in study.captures
        },
        "kinds": study.kinds,
        "findings": facts,
    }
    atomic_write_text(out / "study.json", json.dumps(numbers, indent=1) + "\n")
    return out / "report.html"


def _total_dict(t: Total) -> dict:
    return {k: getattr(t, k) for k in t.__dataclass_fields__}
