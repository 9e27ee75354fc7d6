"""The measured figures of docs/quantizers.md, study.md, training.md, reliability.md, wire.md,
methods.md and of the README (what ``test_doc_figures.py`` leaves of it), checked against the
committed result files they come from, or, for byte counts that follow from the wire format,
against the library's own functions.

Each check reads a figure where the page states it (a table cell, or the words around it with
white space normalised: a figure may wrap) and computes the same figure, with the page's
rounding, from ``docs/results/`` (study reports, reproductions, sweeps, codec runs) or from
``terngrad.wire`` and ``terngrad.quantize``: a figure that drifts from its source, or a source
that changes under a figure, fails here. Tables are made again cell by cell; of the two tables
that are a command's example output (``bench quantizers``, ``make demo``), the columns that the
wire format fixes.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from decimal import Decimal
from functools import cache
from pathlib import Path

from support import markdown_rows

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
RESULTS = DOCS / "results"


def _text(page: str) -> str:
    """``page`` (``README.md`` or ``docs/<name>.md``) as written."""
    return (ROOT / page).read_text()


def _words(page: str) -> str:
    """``page`` with every run of white space one space (a figure may wrap across lines)."""
    return " ".join(_text(page).split())


def _span(low: float, high: float, digits: int = 0) -> str:
    """``low–high`` rounded to ``digits`` decimals (one figure where both round alike)."""
    a, b = f"{low:.{digits}f}", f"{high:.{digits}f}"
    return a if a == b else f"{a}–{b}"


# --------------------------------------------------------------------------- quantizers.md


def test_the_quantizers_pages_bytes_are_the_wire_formats():
    """docs/quantizers.md's bytes of 1M elements (the API's example and TernGrad's section),
    the header's size, and the bits an element of base-3, -5 and -9 packing, from
    ``Quantizer.message_nbytes``, ``wire.frame.header_nbytes`` and ``wire.pack.word_layout``."""
    from terngrad import quantize
    from terngrad.wire.frame import header_nbytes
    from terngrad.wire.pack import word_layout

    words = _words("docs/quantizers.md")
    tern, fp32 = (quantize.get(n).message_nbytes(1_000_000) for n in ("terngrad", "fp32"))
    assert f"# {tern} bytes: {fp32 / tern:.2f}x fewer than fp32" in words
    assert f"{tern:,} bytes against {fp32:,} for fp32 — {fp32 / tern:.2f}× fewer" in words
    flat, one_segment = header_nbytes(1), header_nbytes(1, 1)
    assert (f"a header of {header_nbytes(0)} + 8·ndim bytes ({flat} for a flat gradient; "
            f"{one_segment - flat} more per segment") in words  # fmt: skip

    (k3, w3), (k5, w5), (k9, w9) = (word_layout(b) for b in (3, 5, 9))

    def bits(k: int, w: int) -> str:
        return f"{8 * w / k:.3g}"

    assert f"base-`levels` packing: {bits(k5, w5)} for 5, {bits(k3, w3)} for 3" in words
    assert w3 == 1
    assert (
        f"base 3 → {k3} per byte ({bits(k3, w3)} bits, log₂3 = {math.log2(3):.3f}), "
        f"base 5 → {k5} per {w5} bytes ({bits(k5, w5)}, log₂5 = {math.log2(5):.2f}), "
        f"base 9 → {k9} per {w9} bytes ({bits(k9, w9)}, log₂9 = {math.log2(9):.2f})"
    ) in words


def test_the_bench_quantizers_tables_bytes_are_the_wire_formats():
    """docs/quantizers.md's ``bench quantizers`` table (example output, 1M elements): each
    method's bytes, bits an element and reduction against fp32 from
    ``Quantizer.message_nbytes``; and ORQ's error against QSGD's and Linear's, from the
    table's own error column."""
    from terngrad import quantize

    header, *rows = markdown_rows(_text("docs/quantizers.md"), "| method | bytes | bits/elem |")
    assert header[:4] == ["method", "bytes", "bits/elem", "vs fp32"]
    assert [row[0] for row in rows] == list(quantize.names())
    numel = 1_000_000
    fp32 = quantize.get("fp32").message_nbytes(numel)
    for row in rows:
        size = quantize.get(row[0]).message_nbytes(numel)
        assert row[1:4] == [f"{size:,}", f"{8 * size / numel:.3f}", f"{fp32 / size:.1f}×"], row
    error = {row[0]: float(row[4]) for row in rows}
    cuts = [error[name] / error["orq"] for name in ("qsgd", "linear")]
    assert (f"cut the error of QSGD's and Linear's evenly spaced ones by {_span(*sorted(cuts))}× "
            "at the same 5 levels") in _words("docs/quantizers.md")  # fmt: skip


def test_the_level_fits_costs_are_the_codec_run():
    """docs/quantizers.md's encode times at 1M elements of ORQ-5, Linear and BinGrad-pb on the
    fused kernels, from ``results/codec-1m.json``."""
    rows = json.loads((RESULTS / "codec-1m.json").read_text())["rows"]
    ms = {r["op"]: 1e3 * r["seconds"] for r in rows if r["numel"] == 1_000_000}
    words = _words("docs/quantizers.md")
    assert (f"{ms['orq encode [public]']:.0f} ms per million elements for s = 5 against "
            f"{ms['linear encode [public]']:.0f} ms for Linear") in words  # fmt: skip
    assert f"O(n)): {ms['bingrad-pb encode [public]']:.0f} ms per million elements" in words


# --------------------------------------------------------------------------- wire.md


def test_the_wire_pages_packers_and_header_are_the_wire_formats():
    """docs/wire.md's digits a word and bits a digit of base 3, 5 and 9, the planar block's
    words and the header's size, from ``word_layout``, ``BLOCK_WORDS`` and ``header_nbytes``."""
    from terngrad.wire.frame import header_nbytes
    from terngrad.wire.pack import BLOCK_WORDS, word_layout

    words = _words("docs/wire.md")
    assert f"(`BLOCK_WORDS` = {BLOCK_WORDS}," in words
    k, w = word_layout(3)
    powers = str(k).translate(str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹"))
    assert w == 1
    assert f"{k} trits per byte (3{powers} = {3**k} ≤ 256) | {8 / k:.1f} |" in words
    said = []
    for n in (2, 4):
        base = 2 * n + 1
        k, w = word_layout(base)
        said.append(f"N = {n} → base {base}, {k} digits per {w} bytes ({8 * w / k:.3g} bits, "
                    f"log₂{base} = {math.log2(base):.2f})")  # fmt: skip
    assert "; ".join(said) in words
    assert (f"The header is {header_nbytes(0)} + 8·ndim + 8·segments bytes "
            f"({header_nbytes(1)} for a flat gradient), a multiple of 4") in words  # fmt: skip


def test_the_frame_layout_table_is_the_frames_header():
    """docs/wire.md's frame table: each field's offset and size from the header's own struct,
    the method ids from the quantizers', the dtype ids from ``wire.frame.DTYPES`` and the codec
    kinds from ``Codec.KINDS``."""
    import struct

    import torch

    from terngrad import quantize
    from terngrad.wire import frame
    from terngrad.wire.codec import Codec

    _, *rows = markdown_rows(_text("docs/wire.md"), "| offset | bytes | field |")
    codes = re.findall(r"\d*[a-zA-Z]", frame._HEADER.format[1:])
    sizes = [struct.calcsize("<" + code) for code in codes]
    offsets = [sum(sizes[:i]) for i in range(len(sizes))]
    assert [int(row[0]) for row in rows[: len(sizes)]] == offsets
    assert [int(row[1]) for row in rows[: len(sizes)]] == sizes
    assert rows[len(sizes)][:2] == [str(frame._HEADER.size), "8·ndim"]
    fields = {row[2].split(" (")[0]: row[2] for row in rows}
    ids = ", ".join(f"{quantize.get(n).method_id} {n}" for n in quantize.names())
    assert fields["method id"] == f"method id ({ids})"
    names = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16",
             torch.float64: "float64"}  # fmt: skip
    dtypes = ", ".join(f"{i} {names[d]}" for i, d in enumerate(frame.DTYPES))
    assert fields["dtype id of the original gradient"].endswith(f"({dtypes})")
    words = _words("docs/wire.md")
    codecs = words[words.index("names the packer of a payload:") : words.index("Kind ids")]
    assert re.findall(r"`(\w+)` \(", codecs) == list(Codec.KINDS)
    assert f"Kind ids 0–{len(Codec.KINDS) - 1} go into the frame header" in words


# --------------------------------------------------------------------------- methods.md


def test_the_methods_table_is_the_libraries():
    """docs/methods.md's table of the methods the benchmarks compare: every name of
    ``METHODS``, in order, with the label its spec writes."""
    from terngrad.comm.spec.methods import METHODS

    _, *rows = markdown_rows(_text("docs/methods.md"), "| name | what |")
    assert [(row[0].strip("`"), row[1]) for row in rows] == [
        (name, method.label) for name, method in METHODS.items()
    ]


# --------------------------------------------------------------------------- study.md


@cache
def _study(folder: str) -> dict:
    return json.loads((RESULTS / folder / "study.json").read_text())


def _totals(folder: str, step: str | None = None) -> dict[str, dict]:
    """A study's totals by method at ``step`` (its last captured step by default)."""
    totals = _study(folder)["totals"]
    return totals[step or max(totals, key=int)]


def _report(folder: str, heading: str) -> list[dict[str, str]]:
    """A table of a study's ``report.md``, one dict per row."""
    header, *rows = markdown_rows((RESULTS / folder / "report.md").read_text(), heading)
    return [dict(zip(header, row, strict=True)) for row in rows]


#: the columns of a study report's histogram table (its header's ``max|g| / σ`` holds a ``|``)
HISTOGRAM = ("step", "tensor", "σ", "max|g| / σ", "clipped %", "angle moved °")


def _histogram(folder: str) -> list[dict[str, str]]:
    """The rows of a study report's histogram table: each weight tensor at each captured step,
    its σ, max |g| / σ, the share clipped at 2.5σ and the angle clipping turns it by."""
    _, *rows = markdown_rows(
        (RESULTS / folder / "report.md").read_text(), "## Gradient histograms and clipping"
    )
    return [dict(zip(HISTOGRAM, row, strict=True)) for row in rows]


LENET, CONVNET, GPT = "study-lenet-mnist", "study-cifarnet-fashion", "study-gpt-pydoc"


def _variance(v: float) -> str:
    """A normalised variance as the study's table rounds it: one significant figure below
    0.001, three decimals below 1, three significant figures above."""
    if v < 1e-3:
        return re.sub(r"e-0*", "e-", f"{v:.0e}")
    return f"{v:.3f}" if v < 1 else f"{v:.3g}"


def _bias(ms: list[str], totals: dict[str, dict]) -> str:
    """The bias column: ``0`` where every method's bias is below its noise floor (or rounds to
    zero), else the bias; a single method's noise floor in brackets where it has one."""
    zero = [t["bias"] < t["bias_floor"] or round(t["bias"], 2) == 0
            for t in (totals[m] for m in ms)]  # fmt: skip
    floor = totals[ms[0]]["bias_floor"]
    bracket = f" (±{floor:.2f})" if len(ms) == 1 and floor > 0 else ""
    if all(zero):
        return "0" + bracket
    assert len(ms) == 1
    return f"{totals[ms[0]]['bias']:.2f}{bracket}"


#: the study table's rows: the methods of each
STUDY_ROWS = {
    "signsgd": ["signsgd"], "bingrad-b": ["bingrad-b"], "terngrad (clip 2.5σ)": ["terngrad"],
    "terngrad-noclip": ["terngrad-noclip"], "terngrad-b512": ["terngrad-b512"],
    "qsgd-3 / linear-3 / orq-3": ["qsgd-3", "linear-3", "orq-3"],
    "qsgd-5 / linear-5 / orq-5": ["qsgd-5", "linear-5", "orq-5"],
    "qsgd-9 / linear-9 / orq-9": ["qsgd-9", "linear-9", "orq-9"], "fp16": ["fp16"],
}  # fmt: skip


def test_the_study_table_is_the_two_studies():
    """docs/study.md's table at step 200: the ConvNet's bits an element, both models'
    normalised variance, the ConvNet's bias (noise floor) and angle, from each
    ``study.json``."""
    header, *rows = markdown_rows(_text("docs/study.md"), "| method | ConvNet bits/elem |")
    assert len(header) == 6
    lenet, convnet = _totals(LENET), _totals(CONVNET)
    assert _study(LENET)["steps"][-1]["step"] == _study(CONVNET)["steps"][-1]["step"] == 200
    assert [row[0] for row in rows] == list(STUDY_ROWS)
    for row in rows:
        ms = STUDY_ROWS[row[0]]
        assert row[1:] == [
            " / ".join(f"{convnet[m]['bits_per_element']:.2f}" for m in ms),
            " / ".join(_variance(_nv(lenet, m)) for m in ms),
            " / ".join(_variance(_nv(convnet, m)) for m in ms),
            _bias(ms, convnet),
            " / ".join(f"{convnet[m]['angle_degrees']:.0f}°" for m in ms),
        ], row[0]


def _nv(totals: dict, method: str) -> float:
    return totals[method]["normalized_variance"]


def test_the_studys_budget_reading_is_the_two_studies():
    """docs/study.md's "which quantizer at which budget": the biased methods alone below 1.2
    bits, BinGrad-b's error and bias, TernGrad's against the 3-level methods', ORQ's lead from
    5 levels on and the Pareto front of error against bits, on both models."""
    words = _words("docs/study.md")
    both = [_totals(LENET), _totals(CONVNET)]
    unbiased = ("terngrad-noclip", *(f"{q}-{n}" for q in ("qsgd", "linear", "orq") for n in
                                      (3, 5, 9)))  # fmt: skip

    def pair(method: str, key: str = "normalized_variance", digits: int = 2) -> list[str]:
        return [f"{t[method][key]:.{digits}f}" for t in both]

    for t in both:
        below = {m for m, v in t.items() if v["bits_per_element"] < 1.2}
        assert below == {"signsgd", "bingrad-b", "bingrad-pb"}
        assert not below & set(unbiased)
        assert min((_nv(t, m), m) for m in below)[1] == "bingrad-b"
    assert (f"least error on both models ({' and '.join(pair('bingrad-b'))}), all of it bias "
            f"(‖E Q − g‖/‖g‖ = {' and '.join(pair('bingrad-b', 'bias'))})") in words  # fmt: skip
    three = [_nv(t, m) for t in both for m in ("qsgd-3", "linear-3")]
    assert (f"clipped TernGrad ({' / '.join(pair('terngrad'))}) and TernGrad with buckets of 512 "
            f"({' / '.join(pair('terngrad-b512'))}) beat every unbiased method at that budget "
            f"(QSGD-3 and Linear-3: {_span(min(three), max(three), 1)}; ORQ-3: "
            f"{' / '.join(pair('orq-3'))})") in words  # fmt: skip
    for t in both:
        ternary = max(_nv(t, "terngrad"), _nv(t, "terngrad-b512"))
        assert all(_nv(t, m) > ternary for m in unbiased if m.endswith("-3") or "noclip" in m)
        for n in (5, 9):
            assert _nv(t, f"orq-{n}") < min(_nv(t, f"qsgd-{n}"), _nv(t, f"linear-{n}"))
    names = {"signsgd": "scaled sign", "bingrad-b": "BinGrad-b", "fp16": "fp16"}
    fronts = []
    for t in both:
        front, best = [], math.inf
        for _, _, m in sorted((v["bits_per_element"], v["normalized_variance"], m)
                              for m, v in t.items()):  # fmt: skip
            if _nv(t, m) < best:
                front.append(names.get(m, m.upper().replace("LINEAR", "Linear")))
                best = _nv(t, m)
        fronts.append(", ".join(front))
    assert fronts[0] == fronts[1]
    assert f"the same on both models: {fronts[0]}." in words


def test_the_studys_orq_reading_is_the_two_studies():
    """docs/study.md's ORQ against QSGD and Linear: its variance cut against the better of the
    two, its extra bits and its encode time over QSGD's (3, 5, 9 levels), and the large layers'
    tails at step 200 (max |g| / σ of every weight tensor but the first, ``report.md``)."""
    words = _words("docs/study.md")
    cuts, bits, times = {}, [], []
    for folder in (LENET, CONVNET):
        t = _totals(folder)
        cuts[folder] = [min(_nv(t, f"qsgd-{n}"), _nv(t, f"linear-{n}")) / _nv(t, f"orq-{n}")
                        for n in (3, 5, 9)]  # fmt: skip
        for n in (3, 5, 9):
            orq, qsgd = t[f"orq-{n}"], t[f"qsgd-{n}"]
            bits.append(orq["bits_per_element"] - qsgd["bits_per_element"])
            times.append(orq["encode_seconds"] / qsgd["encode_seconds"])

    def tails(folder: str) -> str:
        rows = _histogram(folder)
        first = rows[0]["tensor"]
        last = [float(r["max|g| / σ"]) for r in rows if r["step"] == "200" and r["tensor"] != first]
        return _span(min(last), max(last))

    assert (f"two by {_span(min(cuts[LENET]), max(cuts[LENET]), 1)}× on LeNet and "
            f"{_span(min(cuts[CONVNET]), max(cuts[CONVNET]), 1)}× on the ConvNet (3, 5, 9 levels), "
            f"for {_span(min(bits), max(bits), 1)} more bits per element (it sends its levels) and "
            f"{_span(min(times), max(times))}× QSGD's encode time") in words  # fmt: skip
    assert (f"whose large layers' gradients reach {tails(CONVNET)}σ at step 200 (LeNet's "
            f"{tails(LENET)}σ)") in words  # fmt: skip


def test_the_studys_clipping_reading_is_the_two_studies():
    """docs/study.md's clipping: the variance cut and the angles (``study.json``), the share of
    elements clipped and the turn of the weight tensors at step 200 (``report.md``), the bias
    left and its noise floors, and the variance removed over the squared bias added."""
    words = _words("docs/study.md")
    lenet, convnet = _totals(LENET), _totals(CONVNET)
    cut = [_nv(t, "terngrad-noclip") / _nv(t, "terngrad") for t in (lenet, convnet)]
    noclip = [t["terngrad-noclip"]["angle_degrees"] for t in (lenet, convnet)]
    clip = [t["terngrad"]["angle_degrees"] for t in (lenet, convnet)]
    assert (f"cuts TernGrad's variance {cut[0]:.1f}× (LeNet) and {cut[1]:.1f}× (ConvNet) and the "
            f"angle to the true gradient from {_span(min(noclip), max(noclip))}° to "
            f"{_span(min(clip), max(clip))}°") in words  # fmt: skip
    clipped, large, first = [], [], []
    for folder in (LENET, CONVNET):
        rows = [r for r in _histogram(folder)
                if r["step"] == "200"]  # fmt: skip
        clipped += [float(r["clipped %"]) for r in rows]
        first.append(float(rows[0]["angle moved °"]))
        large += [float(r["angle moved °"]) for r in rows[1:]]
    gaussian = 100 * math.erfc(2.5 / math.sqrt(2))
    assert (f"it clips {_span(min(clipped), max(clipped))}% of the elements (a Gaussian would "
            f"lose {gaussian:.1f}%)") in words  # fmt: skip
    assert (f"turns the large layers' gradients by {_span(min(large), max(large))}° (the paper's "
            f"\"small angle\" holds for the first convolution, {_span(min(first), max(first))}°)"
            ) in words  # fmt: skip
    c, n = convnet["terngrad"], lenet["terngrad"]
    assert (f"the bias this leaves is {c['bias']:.2f} ± {c['bias_floor']:.2f} of ‖g‖ on the "
            f"ConvNet (on LeNet {n['bias']:.2f}, within {n['bias'] / n['bias_floor']:.1f} noise "
            f"floors of zero with {_study(LENET)['draws']} draws)") in words  # fmt: skip
    trade = [(_nv(t, "terngrad-noclip") - _nv(t, "terngrad")) / t["terngrad"]["bias"] ** 2
             for t in (lenet, convnet)]  # fmt: skip
    assert f"the variance it removes is {_span(min(trade), max(trade))}× the squared bias" in words


def test_the_studys_training_and_bucket_readings_are_the_two_studies():
    """docs/study.md's statistics over the captured steps (TernGrad's and ORQ-5's variance,
    scaled sign's angle: from step 0 to the range of the later steps) and what buckets of 512
    do to TernGrad, from each ``study.json``."""
    words = _words("docs/study.md")

    def over(folder: str, method: str, digits: int = 2) -> str:
        values = [_nv(t, method) for t in _study(folder)["totals"].values()]
        return _span(min(values), max(values), digits)

    def angle(folder: str) -> str:
        steps = _study(folder)["totals"]
        first, *later = (steps[s]["signsgd"]["angle_degrees"] for s in sorted(steps, key=int))
        return f"from {first:.0f}° to {_span(min(later), max(later))}°"

    assert (f"TernGrad's variance stays within {over(LENET, 'terngrad')} (LeNet) and "
            f"{over(CONVNET, 'terngrad')} (ConvNet) from step 0 to 200, ORQ-5's within "
            f"{over(LENET, 'orq-5')} and {over(CONVNET, 'orq-5')}; scaled sign's angle rises "
            f"{angle(LENET)} (LeNet) and {angle(CONVNET)} (ConvNet)") in words  # fmt: skip
    c, n = _totals(CONVNET), _totals(LENET)
    more = c["terngrad-b512"]["bits_per_element"] - c["terngrad"]["bits_per_element"]
    assert _nv(c, "terngrad-b512") < _nv(c, "terngrad") < _nv(n, "terngrad-b512")
    assert (f"help TernGrad on the ConvNet ({_nv(c, 'terngrad'):.2f} → "
            f"{_nv(c, 'terngrad-b512'):.2f}) for {more:.2f} more bits, and not on LeNet "
            f"({_nv(n, 'terngrad'):.3f} → {_nv(n, 'terngrad-b512'):.3f})") in words  # fmt: skip


def test_the_gpt_studys_totals_are_its_study():
    """docs/study.md's GPT study: the checkpoint's bits a character (step 250 of the
    transformer comparison's fp32 run, ``transformer/results.json``), the model's size and
    each method's normalised variance (and bias) at step 20, from its ``study.json``."""
    runs = json.loads((RESULTS / "transformer" / "results.json").read_text())["runs"]
    fp32 = next(r for r in runs if r["method"] == "fp32")
    t = _totals(GPT)
    words = _words("docs/study.md")
    assert (f"(step {fp32['curve'][-1][0]} of the transformer comparison, "
            f"{fp32['bits_per_char']:.2f} bits per character)") in words  # fmt: skip
    assert (f"At step {_study(GPT)['steps'][-1]['step']}, over all "
            f"{t['terngrad']['numel'] / 1e6:.1f}M parameters: TernGrad "
            f"{_nv(t, 'terngrad'):.2f} (bias {t['terngrad']['bias']:.2f} of ‖g‖), TernGrad with "
            f"buckets of 512 {_nv(t, 'terngrad-b512'):.2f} (bias "
            f"{t['terngrad-b512']['bias']:.2f}), without clipping {_nv(t, 'terngrad-noclip'):.2g}, "
            f"QSGD-5 {_nv(t, 'qsgd-5'):.2f}, ORQ-5 {_nv(t, 'orq-5'):.2f}.") in words  # fmt: skip


#: the GPT's per-kind table: the kinds of the study's report that make each row
GPT_KINDS = {
    "token embedding": ["token.weight"],
    "position embedding": ["position.weight"],
    "attention q, k, v (×4)": ["blocks.*.attn.qkv.weight"],
    "attention output projection (×4)": ["blocks.*.attn.proj.weight"],
    "MLP in (×4)": ["blocks.*.mlp.0.weight"],
    "MLP out (×4)": ["blocks.*.mlp.2.weight"],
    "layer norms, gains and biases (×9)": [
        "blocks.*.ln1.weight", "blocks.*.ln1.bias", "blocks.*.ln2.weight", "blocks.*.ln2.bias",
        "norm.weight", "norm.bias",
    ],
    "attention output bias (×4)": ["blocks.*.attn.proj.bias"],
    "head (last layer)": ["head.weight"],
}  # fmt: skip


def _kinds() -> dict[str, dict[str, str]]:
    return {r["kind"]: r for r in _report(GPT, "## Per kind of tensor")}


def _clipping(kinds: list[str]) -> list[dict[str, str]]:
    """The histogram rows (every captured step) of the tensors of ``kinds``."""
    patterns = [re.compile(re.escape(k).replace(r"\*", r"\d+") + "$") for k in kinds]
    rows = _histogram(GPT)
    return [r for r in rows if any(p.match(r["tensor"]) for p in patterns)]


def test_the_gpt_per_kind_table_is_its_report():
    """docs/study.md's per-kind table of the GPT: elements, share of ‖g‖², TernGrad's
    normalised variance and share of its error (summed, or their range, over a row's kinds),
    from the report's per-kind table; the turn by clipping over the captured steps, from its
    histogram table."""
    _, *rows = markdown_rows(_text("docs/study.md"), "| kind | elements | share of ‖g‖² |")
    assert [row[0] for row in rows] == list(GPT_KINDS)
    kinds = _kinds()
    for row in rows:
        mine = [kinds[k] for k in GPT_KINDS[row[0]]]
        elements = sum(int(k["elements"].replace(",", "")) for k in mine)
        share = sum(Decimal(k["‖g‖² %"]) for k in mine)
        error = sum(Decimal(k["terngrad error %"]) for k in mine)
        variances = sorted((k["terngrad"] for k in mine), key=float)
        variance = variances[0] if len(mine) == 1 else f"{variances[0]}–{variances[-1]}"
        angles = [float(r["angle moved °"]) for r in _clipping(GPT_KINDS[row[0]])]
        turn = f"{_span(min(angles), max(angles))}°" if angles else "—"
        assert row[1:] == [f"{elements:,}", f"{share}%", variance, f"{error}%", turn], row[0]


def test_the_gpt_studys_readings_are_its_report():
    """docs/study.md's bullets on the GPT: the embeddings' share of the squared norm, of the
    elements and of TernGrad's error, the token embedding's tail and turn, the output
    projection's share, the clipped share of q, k, v against the other block tensors and of the
    head, the layer norms' and biases' variance, buckets of 512's variance and bias (the
    study), and their loss in training (``transformer/results.json``)."""
    words = _words("docs/study.md")
    kinds, t = _kinds(), _totals(GPT)
    embeddings = [kinds["token.weight"], kinds["position.weight"]]
    share = sum(float(k["‖g‖² %"]) for k in embeddings)
    elements = sum(int(k["elements"].replace(",", "")) for k in embeddings)
    error = sum(float(k["terngrad error %"]) for k in embeddings)
    assert (f"carry {share:.0f}% of the gradient's squared norm in "
            f"{100 * elements / t['terngrad']['numel']:.1f}% of the elements and {error:.0f}% of "
            "TernGrad's error") in words  # fmt: skip
    every = _histogram(GPT)
    token = _clipping(["token.weight"])
    tails = [float(r["max|g| / σ"]) for r in token]
    turns = [float(r["angle moved °"]) for r in token]
    assert max(tails) == max(float(r["max|g| / σ"]) for r in every)
    assert max(turns) == max(float(r["angle moved °"]) for r in every)
    assert (f"(max |g| / σ = {_span(min(tails), max(tails))}: a few characters' rows hold most "
            f"of it), so clipping at 2.5σ turns it by {_span(min(turns), max(turns))}°, the "
            f"largest angle of any tensor; its normalised variance is low "
            f"({kinds['token.weight']['terngrad']})") in words  # fmt: skip
    largest = max(kinds.values(), key=lambda k: float(k["terngrad error %"]))
    assert largest["kind"] == "blocks.*.attn.proj.weight"
    assert f"the largest share of TernGrad's error ({float(largest['terngrad error %']):.0f}%)" \
        in words  # fmt: skip
    qkv = [float(r["clipped %"]) for r in _clipping(["blocks.*.attn.qkv.weight"])]
    others = [
        float(r["clipped %"])
        for r in _clipping(
            ["blocks.*.attn.proj.weight", "blocks.*.mlp.0.weight", "blocks.*.mlp.2.weight"]
        )
    ]
    qkv_turns = [float(r["angle moved °"]) for r in _clipping(["blocks.*.attn.qkv.weight"])]
    assert (f"q, k, v clip more elements than any other block tensor "
            f"({_span(min(qkv), max(qkv), 1)}% against {_span(min(others), max(others), 1)}%) and "
            f"turn by {_span(min(qkv_turns), max(qkv_turns))}°") in words  # fmt: skip
    small = [k for name, k in kinds.items() if ".ln" in name or name.startswith("norm.")
             or name.endswith(".bias")]  # fmt: skip
    highest = max(small, key=lambda k: float(k["terngrad"]))
    assert highest["terngrad"] == max((k["terngrad"] for k in kinds.values()), key=float)
    assert f"the highest normalised variance (up to {highest['terngrad']}:" in words
    head = _clipping(["head.weight"])
    clipped = [float(r["clipped %"]) for r in head]
    head_turns = [float(r["angle moved °"]) for r in head]
    assert max(clipped) == max(float(r["clipped %"]) for r in every)
    assert (f"whose gradient clips the most elements ({_span(min(clipped), max(clipped), 1)}%) and "
            f"turns by {_span(min(head_turns), max(head_turns))}°") in words  # fmt: skip
    tern, b512 = t["terngrad"], t["terngrad-b512"]
    assert (f"the total variance rises {tern['normalized_variance']:.2f} → "
            f"{b512['normalized_variance']:.2f} while the bias falls {tern['bias']:.2f} → "
            f"{b512['bias']:.2f} of ‖g‖") in words  # fmt: skip
    runs = {r["method"]: r for r in json.loads(
        (RESULTS / "transformer" / "results.json").read_text())["runs"]}  # fmt: skip

    def gap(method: str) -> float:
        return 100 * (runs[method]["loss"] / runs["fp32"]["loss"] - 1)

    assert (f"buckets win ({gap('terngrad-b512'):.1f}% above fp32's loss against "
            f"{gap('terngrad'):.1f}%)") in words  # fmt: skip


# --------------------------------------------------------------------------- training.md


def _numel(name: str, input_shape: tuple[int, ...], classes: int, meta: bool = False) -> int:
    """Parameters of one of ``terngrad.train.models``; ``meta``: built on the meta device (no
    memory, no initialisation: for the large models whose ``normal_`` it does not call)."""
    import torch

    from terngrad.train import models

    with torch.device("meta" if meta else "cpu"):
        return sum(p.numel() for p in models.build(name, input_shape, classes).parameters())


def test_the_gpts_sizes_are_the_models():
    """docs/training.md's parameters of ``gpt`` and ``gpt-small`` for the corpus's symbols
    (the head's bias in the GPT study's report), the GPT's as its study counted them; and the
    README's GPT of the transformer results (``transformer-small/``: its steps and seeds)."""
    symbols = int(_kinds()["head.bias"]["elements"].replace(",", ""))
    gpt, small = (_numel(n, (128,), symbols) for n in ("gpt", "gpt-small"))
    assert gpt == _totals(GPT)["terngrad"]["numel"]
    words = _words("docs/training.md")
    assert f"{gpt / 1e6:.1f} million parameters for the corpus's {symbols} symbols" in words
    assert f"`gpt-small` is the same model at d = 128 ({small / 1e6:.2f} million parameters" \
        in words  # fmt: skip
    runs = [json.loads(p.read_text()) for p in sorted(
        (RESULTS / "transformer-small").glob("fp32-s[0-9]/summary.json"))]  # fmt: skip
    assert {r["config"]["model"] for r in runs} == {"gpt-small"}
    (steps,) = {r["steps"] for r in runs}
    assert (f"a {small / 1e3:.0f}k-parameter GPT, {steps:,} steps, {len(runs)} seeds"
            in _words("README.md"))  # fmt: skip


def test_the_transformer_reading_is_the_comparisons():
    """docs/training.md's reading of ``reproduce transformer``: ``terngrad-b512`` the closest
    TernGrad setting to fp32 at ≥10× fewer bytes, its gap to fp32's loss, the bytes of a
    full-precision first fifth, and error feedback's harm (``transformer/results.json``)."""
    runs = {r["method"]: r for r in json.loads(
        (RESULTS / "transformer" / "results.json").read_text())["runs"]}  # fmt: skip
    fp32 = runs["fp32"]

    def gap(method: str) -> float:
        return 100 * (runs[method]["loss"] / fp32["loss"] - 1)

    def fewer(method: str) -> float:
        return fp32["bytes_per_step"] / runs[method]["bytes_per_step"]

    tern = [m for m in runs if m.startswith("terngrad") and fewer(m) >= 10]
    assert min(tern, key=gap) == "terngrad-b512"
    assert gap("terngrad-ef") > gap("terngrad")
    steps = fp32["curve"][-1][0]
    assert (
        f"at ≥10× fewer bytes in `terngrad reproduce transformer`, {gap('terngrad-b512'):.1f}% "
        f"above fp32's validation loss after {steps} steps; full precision for the first fifth "
        f"of the steps (`--full-precision-steps K`) helps about as much but sends "
        f"{fewer('terngrad-fp'):.1f}× fewer bytes only"
    ) in _words("docs/training.md")


@cache
def _lenet() -> dict[str, dict]:
    return json.loads((RESULTS / "lenet" / "results.json").read_text())


def test_the_lenet_reproductions_reading_is_its_runs():
    """docs/training.md's summary of ``reproduce lenet``: TernGrad's gap to fp32 (points of
    final accuracy, at 2 and 4 workers) and its fewer bytes, from ``lenet/results.json``."""
    runs = _lenet()
    gaps, fewer = set(), []
    for workers in (2, 4):
        fp32, tern = runs[f"fp32, {workers} workers"], runs[f"terngrad, {workers} workers"]
        gaps.add(f"{100 * (fp32['accuracy'] - tern['accuracy']):.2f}")
        fewer.append(fp32["bytes_sent_per_step"] / tern["bytes_sent_per_step"])
    (gap,) = gaps
    assert (
        f"(TernGrad {gap} points below fp32 at 2 and 4 workers, "
        f"{_span(min(fewer), max(fewer))}× fewer bytes)"
    ) in _words("docs/training.md")


def test_the_demo_tables_bytes_are_the_lenet_exchanges():
    """docs/training.md's ``make demo`` table (example output): the bytes a step of fp32 and
    TernGrad at 4 workers and their ratio, the exchange's, as in ``reproduce lenet``'s 4-worker
    runs (the same protocol and exchange; ``lenet/results.json``)."""
    _, *rows = markdown_rows(_text("docs/training.md"), "| run | final test accuracy |")
    runs = _lenet()
    fp32 = runs["fp32, 4 workers"]["bytes_sent_per_step"]
    assert [row[0] for row in rows] == ["fp32, 4 workers", "terngrad, 4 workers"]
    for row in rows:
        sent = runs[row[0]]["bytes_sent_per_step"]
        assert row[2:4] == [f"{sent:,.0f}", f"{fp32 / sent:.1f}×"], row[0]


# --------------------------------------------------------------------------- reliability.md


def test_the_replica_checks_alexnet_is_the_testbeds():
    """docs/reliability.md's AlexNet bytes (MB of float32 parameters), the model as the
    testbed builds it (``bench network``: its default input shape, 10 classes)."""
    from terngrad.train import models

    numel = _numel("alexnet", models.default_input_shape("alexnet"), 10, meta=True)
    assert f"AlexNet's {4 * numel / 1e6:.0f} MB" in _words("docs/reliability.md")


# --------------------------------------------------------------------------- README.md


def test_the_readmes_bits_an_element_are_the_wire_formats():
    """The README's bits an element of ternary gradients against fp32's, from the packing."""
    from terngrad.wire.pack import word_layout

    k, w = word_layout(3)
    assert f"{8 * w / k:.1f} bits an element instead of {8 * 4}" in _words("README.md")


def test_the_readmes_trainer_defaults_row_is_its_records():
    """The README's row of the Trainer's defaults: within 1% of DDP's loss (3-seed means) and
    the bytes it saves on the two models (``trainer-defaults/``)."""
    folder = RESULTS / "trainer-defaults"

    def runs(model: str, setting: str) -> list[dict]:
        return [
            json.loads(p.read_text()) for p in sorted(folder.glob(f"{model}-{setting}-s*.json"))
        ]

    gaps, compression = [], []
    for model in ("gpt2", "bert"):
        ddp = statistics.fmean(r["eval_loss"] for r in runs(model, "ddp"))
        mine = runs(model, "hook-last-qsgd5-b64")
        gaps.append(statistics.fmean(r["eval_loss"] for r in mine) / ddp - 1)
        compression += [r["compression"] for r in mine]
    assert max(abs(g) for g in gaps) < 0.01
    assert (f"| within 1% of DDP's loss, {_span(min(compression), max(compression), 1)}× fewer "
            "bytes |") in _words("README.md")  # fmt: skip


def test_the_readmes_other_powersgd_ranks_are_the_sweeps():
    """The README's PowerSGD ranks raced besides rank 4 (``lenet-tuned/sweep.json``): rank 2
    reached 98% on all seeds but one on every link, rank 1 later than rank 4 wherever both
    ran."""
    sweep = json.loads((RESULTS / "accuracy" / "lenet-tuned" / "sweep.json").read_text())
    ranks_2 = [p["methods"]["powersgd"] for p in sweep["points"] if "powersgd" in p["methods"]]
    assert ranks_2 and all(len(m["seeds"]) - m["reached_runs"] == 1 for m in ranks_2)
    both = [p["methods"] for p in sweep["points"] if "powersgd-r1" in p["methods"]]
    assert both and all(
        m["powersgd-r1"]["seconds_to_target"] > m["powersgd-r4"]["seconds_to_target"] for m in both
    )
    assert ("PowerSGD at rank 2 and rank 1 were raced too (rank 2 diverged on one seed, rank 1 "
            "is slower)") in _words("README.md")  # fmt: skip


def test_the_readmes_local_steps_auto_is_the_sweeps():
    """The README's ``--local-steps auto`` in the tuned race (``lenet-tuned/``): each run's H
    (its ``summary.json``) was 25 or 5; every run that chose 25 reached 98% and none that chose
    5; where every seed chose 25, auto took no longer than H = 25's mean plus its sd."""
    tuned = RESULTS / "accuracy" / "lenet-tuned"
    sweep = json.loads((tuned / "sweep.json").read_text())
    for point in sweep["points"]:
        link = point["bandwidth"]
        runs = [json.loads(p.read_text()) for p in
                sorted(tuned.glob(f"{link}/terngrad-localauto-s*/summary.json"))]  # fmt: skip
        assert runs, link
        for run in runs:
            assert run["local_steps"] in (5, 25), link
            assert run["stopped_at_target"] == (run["local_steps"] == 25), link
        if all(run["local_steps"] == 25 for run in runs):
            auto, fixed = (
                point["methods"]["terngrad-localauto"],
                point["methods"]["terngrad-local25"],
            )
            limit = fixed["seconds_to_target"] + fixed["seconds_to_target_sd"]
            assert auto["seconds_to_target"] <= limit, link
    assert ("`--local-steps auto` (as fast as H = 25 where it chose 25; it diverged where it "
            "chose H = 5 at a rate tuned for 25)") in _words("README.md")  # fmt: skip
