"""The measured figures of docs/performance.md, checked against the committed result files they
come from: the codec's timings (``codec*.json``), the hook's parts (``overhead*.json``), the
bandwidth-limited testbed (``network-*.json``), the performance model's validation
(``model-validation-*.json``) and extrapolation (``scaling.json``), and the bytes on the wire.

Each check reads a figure where the page states it (a table cell, or the words around it with
white space normalised) and makes it again from ``docs/results/`` with the page's rounding: a
figure that drifts from its file, or a file that changes under a figure, fails here.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

from support import markdown_rows

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results"
PAGE = (ROOT / "docs" / "performance.md").read_text()
#: the page's lines without their indentation (tables nested in a list read as any other)
FLAT = "\n".join(line.strip() for line in PAGE.splitlines())
#: the page's words with every run of white space one space (a figure may wrap)
WORDS = " ".join(PAGE.split())
CAST = "half() into buffer"


def _json(name: str):
    return json.loads((RESULTS / name).read_text())


def _table(heading: str) -> list[list[str]]:
    """The rows of the first table at or after ``heading``, header first, bold marks dropped
    (an escaped ``\\|`` inside a cell kept in it)."""
    rows = markdown_rows(FLAT.replace("\\|", "\0"), heading)
    return [[cell.replace("\0", "|").replace("**", "") for cell in row] for row in rows]


def _said(*figures: str) -> None:
    """Every one of ``figures`` (words of the page) is on the page."""
    for words in figures:
        assert words in WORDS, words


def _x(value: float, digits: int = 2) -> str:
    return f"{value:.{digits}f}×"


def _signed(percent: float, digits: int = 1) -> str:
    """A signed percentage as the page's prose writes it (a minus sign, not a hyphen)."""
    return f"{percent:+.{digits}f}%".replace("-", "−")


# --------------------------------------------------------------------------- codec


def _codec(name: str) -> dict[str, float]:
    """Seconds by operation (its indentation dropped) of one size's ``bench codec`` run."""
    return {r["op"].strip(): r["seconds"] for r in _json(name)["rows"]}


LOADED, MILLION, QUIET = _codec("codec.json"), _codec("codec-1m.json"), _codec("codec-quiet.json")


def test_the_codec_table_is_its_two_runs():
    """The codec table, every cell: milliseconds, the ratios to the cast into a buffer and to
    ``half()``, GB/s of input read, from ``codec.json`` (25M) and ``codec-1m.json`` (1M)."""
    header, *rows = _table("| size | operation | ms | × cast into buffer |")
    assert header == ["size", "operation", "ms", "× cast into buffer", "× half()", "GB/s"]
    made = []
    for name in ("codec.json", "codec-1m.json"):
        found = _json(name)["rows"]
        cast = next(r["seconds"] for r in found if r["op"] == CAST)
        half = next(r["seconds"] for r in found if r["op"] == "half()")
        for r in found:
            op = r["op"].strip() + (" (a pass of encode)" if r["op"].startswith(" ") else "")
            made.append([
                f"{r['numel']:,}", op, f"{1e3 * r['seconds']:.2f}", f"{r['seconds'] / cast:.2f}",
                f"{r['seconds'] / half:.2f}", f"{4 * r['input_numel'] / r['seconds'] / 1e9:.2f}",
            ])  # fmt: skip
    assert rows == made


def test_the_codec_readings_are_the_loaded_run():
    """The reading of the codec table at 25M (and the level quantizers at 1M): the cast, how far
    the loaded run is from the quiet one, the level quantizers' encodes and decodes and their
    ratio to TernGrad's, the public API against the exchange path, from ``codec.json``,
    ``codec-1m.json`` and ``codec-quiet.json``."""
    loaded = _json("codec.json")
    assert (loaded["cpu"], loaded["threads"]) == ("AMD EPYC", 2)
    _said("the CPU reports itself as **AMD EPYC**", "no AVX-512), 2 threads")
    ms = {op: 1e3 * s for op, s in LOADED.items()}
    both = [LOADED[op] / QUIET[op] for op in QUIET]
    ratios = [(LOADED[op] / LOADED[CAST]) / (QUIET[op] / QUIET[CAST]) for op in QUIET]
    drift = max(max(ratios), 1 / min(ratios))
    _said(
        f"every absolute time at 25M here is {min(both):.1f}–{_x(max(both), 1)} the quiet run's "
        f"below: the cast into a buffer took {ms[CAST]:.1f} ms in this run, "
        f"{1e3 * QUIET[CAST]:.2f} ms in the quiet one",
        f"against the cast into a buffer ({ms[CAST]:.1f} ms in this loaded run, "
        f"{1e3 * QUIET[CAST]:.2f} ms in the quiet one below; every ratio to it here differs from "
        f"the quiet run's by up to {_x(drift, 1)})",
    )
    million = {q: 1e3 * MILLION[f"{q} encode [public]"] for q in ("orq", "bingrad-pb")}
    enc = {q: ms[f"{q} encode [public]"] for q in ("linear", "bingrad-b", "signsgd", "orq",
                                                   "bingrad-pb", "terngrad")}  # fmt: skip
    _said(
        f"Linear {enc['linear']:,.0f} ms, BinGrad-b {enc['bingrad-b']:,.0f} ms, scaled sign "
        f"{enc['signsgd']:,.0f} ms, ORQ-5 {enc['orq']:,.0f} ms, BinGrad-pb "
        f"{enc['bingrad-pb']:,.0f} ms at 25M; at 1M ORQ-5 {million['orq']:.1f} ms and BinGrad-pb "
        f"{million['bingrad-pb']:.1f} ms"
    )
    decodes = [ms[f"{q} decode [public]"] for q in ("linear", "orq", "bingrad-b", "bingrad-pb",
                                                    "signsgd")]  # fmt: skip
    _said(f"Their decodes are a table lookup, {min(decodes):.0f}–{max(decodes):.0f} ms at 25M.")

    def over_terngrad(run: dict[str, float], q: str) -> float:
        return run[f"{q} encode [public]"] / run["terngrad encode [public]"]

    level = [over_terngrad(run, q) for run in (MILLION, LOADED) for q in ("orq", "bingrad-pb")]
    _said(
        f"ORQ-5 and BinGrad-pb are {min(level):.0f}–{max(level):.0f}× TernGrad's encode** (1M: "
        f"{_x(level[0], 1)} and {_x(level[1], 1)}; 25M: {_x(level[2], 1)} and {_x(level[3], 1)};"
    )
    _said(
        f"TernGrad `encode` {ms['terngrad encode [public]']:.1f} ms through the public API against "
        f"{ms['encode [numba]']:.1f} ms for the exchange's encode into a frame",
        f"`decode` {ms['terngrad decode [public]']:.1f} ms against {ms['decode [numba]']:.1f} ms "
        "for the exchange's",
    )


def test_the_quiet_codec_run_is_its_file():
    """The quiet run's paragraph (the cast, TernGrad's public encode and decode against their
    goals, the cast's GB/s, the two passes of encode) and its table, from ``codec-quiet.json``."""
    cast = QUIET[CAST]

    def said(op: str) -> str:
        return f"{1e3 * QUIET[op]:.2f} ms, {_x(QUIET[op] / cast)}"

    encode, decode = "terngrad encode [public]", "terngrad decode [public]"
    _said(
        f"the cast into a buffer {1e3 * cast:.2f} ms, the public TernGrad **encode {said(encode)} "
        f"the cast** and **decode {said(decode)}**",
        f"encode is {_x(QUIET[encode] / cast / 2.5, 1)} over its goal (2.5×): the memory-bound "
        f"cast reads {4 * 25e6 / cast / 1e9:.1f} GB/s",
        f"statistics {said('statistics pass [numba]')} the cast, then clip, draws, round and pack "
        f"{said('rounding pass [numba]')})",
    )
    _, *rows = _table("| operation | ms | × cast into buffer | × `half()` |")
    named = [CAST, "half()", encode, decode, "encode [numba]", "decode [numba]",
             "owner sum, 4 workers [numba]"]  # fmt: skip
    assert len(rows) == len(named)
    for row, op in zip(rows, named, strict=True):
        seconds = QUIET[op]
        made = [f"{1e3 * seconds:.2f}", f"{seconds / cast:.2f}", f"{seconds / QUIET['half()']:.2f}"]
        assert row[1:] == made, row[0]


def test_the_pass_table_and_the_1m_figures_are_the_loaded_run():
    """The grid path pass by pass (milliseconds and the ratio to the cast; the bytes moved are
    arithmetic), the public decode against its floor, and the 1M figures: the cast, TernGrad's
    operations and their ratio to it, from ``codec.json`` and ``codec-1m.json``."""
    _, *rows = _table("| pass | ms | × cast | bytes moved per element |")
    named = ["statistics pass [numba]", "rounding pass [numba]", "rounding, draws given [numba]",
             "frame checksum [numba]", "decode [numba]"]  # fmt: skip
    assert len(rows) == len(named)
    for row, op in zip(rows, named, strict=True):
        seconds = LOADED[op]
        assert row[1:3] == [f"{1e3 * seconds:.1f}", _x(seconds / LOADED[CAST])], row[0]
    _said(
        '(the rows marked "a pass of encode" above; the cast '
        f"{1e3 * LOADED[CAST]:.1f} ms in this run)",
        f"the public base-3 decode is at its floor "
        f"({_x(LOADED['terngrad decode [public]'] / LOADED[CAST])} in this run)",
    )
    ops = ["encode [numba]", "decode [numba]", "owner sum, 4 workers [numba]",
           "terngrad encode [public]", "terngrad decode [public]"]  # fmt: skip
    ms = [1e3 * MILLION[op] for op in ops]
    over = [MILLION[op] / MILLION[CAST] for op in ops]
    _said(
        f"the cast takes {1e3 * MILLION[CAST]:.2f} ms; TernGrad's operations then take "
        f"{min(ms):.2f}–{max(ms):.2f} ms",
        f"{min(over):.0f}–{max(over):.0f}× the cast. Small buckets",
    )


# --------------------------------------------------------------------------- overhead

#: the overhead tables' models, as the files name them
MODELS = {"LeNet": "lenet", "CIFAR ConvNet": "cifarnet", "AlexNet": "alexnet"}


def _overhead(name: str) -> dict[str, dict]:
    """A ``bench overhead`` file's models by name."""
    return {m["model"]: m for m in _json(name)["models"]}


def _model(cell: str, runs: dict[str, dict]) -> dict:
    """The run of the model a row names (``LeNet (64)``), its batch checked."""
    name, batch = cell.rsplit(" (", 1)
    run = runs[MODELS[name]]
    assert batch == f"{run['batch_size']})", cell
    return run


def test_the_overhead_tables_are_their_file():
    """The steps and exposed times of LeNet, the ConvNet and AlexNet, TernGrad's exchange on
    LeNet part by part, and the readings drawn from them, from ``overhead.json``."""
    runs = _overhead("overhead.json")
    lenet = runs["lenet"]
    assert _json("overhead.json")["cpu"] == "AMD EPYC"
    _said('Measured on this 2-core machine (/proc/cpuinfo "AMD EPYC")')
    _said(f"4 ranks, {lenet['steps']} steps after {lenet['warmup']} (median")
    assert {r["workers"] for r in runs.values()} == {4}

    def ms(seconds: float) -> str:
        return f"{1e3 * seconds:,.0f} ms"

    _, *rows = _table(
        "| model (batch a rank) | compute alone | fp32 | fp16 | terngrad | terngrad /"
    )
    assert len(rows) == len(runs)
    for row in rows:
        run = _model(row[0], runs)
        m = run["methods"]
        steps = [m[k]["step_seconds"] for k in ("fp32", "fp16", "terngrad")]
        exposed = [1e3 * m[k]["exposed_seconds"] for k in ("fp16", "terngrad")]
        assert row[1:] == [
            ms(run["compute_seconds"]), *map(ms, steps), _x(steps[2] / steps[0]),
            f"{exposed[0]:.0f} / {exposed[1]:.0f} ms",
        ], row[0]  # fmt: skip

    tern = lenet["methods"]["terngrad"]
    parts, calls, sent = tern["parts"], tern["calls"], tern["bytes"]
    frames = ("new_frame", "seal_frame", "read_frame")
    #: each row's parts, the digits of its milliseconds, whether it counts calls
    named = {
        "statistics (`grid_prepare`)": (("grid_prepare",), 2, True),
        "rounding and packing (`grid_pack`)": (("grid_pack",), 2, True),
        "owner's sum (`sum_packed`)": (("sum_packed",), 2, True),
        "decoding (`decode_into`)": (("decode_into",), 2, True),
        "frames: build, seal (CRC-32), read": (frames, 2, True),
        "all-reduce: scales ×2, full precision ×1": (("all_reduce",), 1, True),
        "all-to-all": (("all_to_all",), 1, True),
        "all-gather": (("all_gather",), 1, True),
        "glue (Python, copies)": (("glue",), 1, False),
        "hand-off to the hook's thread": (("hand-off",), 1, True),
    }
    _, *rows = _table("| part | ms | calls | KB sent |")
    assert [row[0] for row in rows] == list(named)
    for row in rows:
        keys, digits, counted = named[row[0]]
        made = [
            f"{1e3 * sum(parts[k] for k in keys):.{digits}f}",
            f"{sum(calls[k] for k in keys):.0f}" if counted else "",
            f"{sent[keys[0]] / 1e3:.1f}" if keys[0] in sent else "",
        ]
        assert row[1:] == made, row[0]
    codec = ("grid_prepare", "grid_pack", "sum_packed", "decode_into")
    kernels = sum(parts[k] for k in codec)
    m = lenet["methods"]
    _said(
        f"**The codec is not the cost**: {1e3 * kernels:.1f} ms a step of kernels",
        f"and a step makes about {sum(calls[k] for k in codec):.0f} of them;",
        f"four rounds ({1e3 * tern['exposed_seconds']:.0f} ms exposed) where fp16 needs one "
        f"({1e3 * m['fp16']['exposed_seconds']:.0f} ms)",
        # (the training section's pointer to this table)
        f"LeNet's step {_x(m['terngrad']['step_seconds'] / m['fp32']['step_seconds'])} fp32's "
        "with no network limit",
    )


def test_the_fused_overhead_table_and_its_readings_are_their_files():
    """The sharded exchange bucket by bucket against ``fuse_buckets``: every cell, the readings
    (the hook's time, the exposed time, the steps, the scales' all-reduce), from
    ``overhead-fused.json``; the fused time-to-accuracy runs from ``accuracy/unlimited-fused``."""
    found = _json("overhead-fused.json")
    runs = _overhead("overhead-fused.json")
    assert found["cpu"] == "Intel(R) Xeon(R) Processor"
    _said(f'"{found["cpu"]}", 4 ranks, {runs["lenet"]["steps"]} steps after '
          f"{runs['lenet']['warmup']}")  # fmt: skip

    def ms(seconds: float) -> str:
        return f"{1e3 * seconds:,.0f}"

    _, *rows = _table(
        "| model (batch a rank) | compute alone | fp32 | fp16 | terngrad | terngrad-fused"
    )
    assert len(rows) == len(runs)
    for row in rows:
        run = _model(row[0], runs)
        m = run["methods"]
        fp32 = m["fp32"]["step_seconds"]
        steps = [f"{ms(m[k]['step_seconds'])} ({_x(m[k]['step_seconds'] / fp32)})"
                 for k in ("fp16", "terngrad", "terngrad-fused")]  # fmt: skip
        hook = " / ".join(ms(m[k]["parts"]["hook thread"]) for k in ("terngrad", "terngrad-fused"))
        exposed = " / ".join(ms(m[k]["exposed_seconds"])
                             for k in ("fp16", "terngrad", "terngrad-fused"))  # fmt: skip
        assert row[1:] == [ms(run["compute_seconds"]), ms(fp32), *steps, hook, exposed], row[0]

    def of(model: str, key: str, part: str | None = None) -> list[float]:
        methods = runs[model]["methods"]
        return [1e3 * (methods[k]["parts"][part] if part else methods[k][key])
                for k in ("terngrad", "terngrad-fused")]  # fmt: skip

    def arrow(values: list[float]) -> str:
        return f"{values[0]:.0f} → {values[1]:.0f}"

    lenet_step = of("lenet", "step_seconds")
    alexnet_step = of("alexnet", "step_seconds")
    fused = runs["lenet"]["methods"]["terngrad-fused"]
    _said(
        f"(LeNet {arrow(of('lenet', '', 'hook thread'))} ms, the ConvNet "
        f"{arrow(of('cifarnet', '', 'hook thread'))} ms:",
        f"LeNet's hand-off to the hook's thread {arrow(of('lenet', '', 'hand-off'))} ms",
        f"stays (LeNet {arrow(of('lenet', 'exposed_seconds'))} ms) or grows (the ConvNet "
        f"{arrow(of('cifarnet', 'exposed_seconds'))} ms, AlexNet "
        f"{arrow(of('alexnet', 'exposed_seconds'))} ms)",
        f"LeNet's step gains {100 * (1 - lenet_step[1] / lenet_step[0]):.0f}% "
        f"({arrow(lenet_step)} ms)",
        f"AlexNet's step loses {100 * (alexnet_step[1] / alexnet_step[0] - 1):.0f}%",
        "**TernGrad's step on LeNet is still "
        f"{_x(lenet_step[1] / (1e3 * runs['lenet']['methods']['fp32']['step_seconds']))} fp32's**",
        f"(the scales' all-reduce: {1e3 * fused['parts']['all_reduce']:.1f} ms of the fused "
        f"exchange's {1e3 * fused['parts']['hook thread']:.0f} ms)",
    )
    accuracy = {m["method"]: m for m in _json("accuracy/unlimited-fused/results.json")["methods"]}
    ours, theirs = accuracy["terngrad-fused"], accuracy["terngrad"]
    assert len(ours["seeds"]) == len(theirs["seeds"]) == 3
    assert ours["reached"]["step"] == theirs["reached"]["step"]
    _said(
        f"{ours['step_seconds']:.3f} against {theirs['step_seconds']:.3f} s a step and "
        f"{ours['reached']['train_seconds']:.0f} ± {ours['seconds_to_target_sd']:.0f} against "
        f"{theirs['reached']['train_seconds']:.0f} ± {theirs['seconds_to_target_sd']:.0f} s to 98% "
        "(3 seeds, the same steps"
    )


def test_the_own_scales_table_and_its_readings_are_their_runs():
    """Own scales against the sharded exchange: every cell of the three LeNet runs and the
    ConvNet's, the ratios the readings draw, and LeNet's second run part by part, from
    ``overhead-own-1.json``, ``-2`` and ``-3``."""
    runs = [_overhead(f"overhead-own-{i}.json") for i in (1, 2, 3)]
    columns = ["fp16", "terngrad", "terngrad-fused", "terngrad-own", "terngrad-own-fused"]
    _, *rows = _table("| model | run | compute alone | fp32 | fp16 | terngrad | terngrad-fused |")
    assert [(row[0], row[1]) for row in rows] == [("LeNet (64)", "1"), ("LeNet (64)", "2"),
                                                  ("LeNet (64)", "3"),
                                                  ("CIFAR ConvNet (64)", "3")]  # fmt: skip
    for row in rows:
        run = _model(row[0], runs[int(row[1]) - 1])
        m = run["methods"]
        fp32 = m["fp32"]["step_seconds"]
        ratios = [_x(m[k]["step_seconds"] / fp32) if k in m else "—" for k in columns]
        made = [f"{1e3 * run['compute_seconds']:.0f} ms", f"{1e3 * fp32:.0f} ms", *ratios]
        assert row[2:] == made, row[:2]

    def step(i: int, model: str, method: str) -> float:
        return runs[i][model]["methods"][method]["step_seconds"]

    def over(method: str, base: str, model: str = "lenet", i: tuple = (0, 1, 2)) -> list[float]:
        return [step(j, model, method) / step(j, model, base) for j in i]

    def listed(values: list[float]) -> str:
        return ", ".join(_x(v) for v in values)

    own, sharded = over("terngrad-own-fused", "fp32"), over("terngrad", "fp32")
    against = over("terngrad-own-fused", "terngrad")
    fp16 = over("terngrad-own-fused", "fp16")
    convnet = [over(k, b, "cifarnet", (2,))[0] for k, b in
               (("terngrad-own-fused", "fp32"), ("terngrad", "fp32"),
                ("terngrad-own-fused", "fp16"))]  # fmt: skip
    _said(
        f"LeNet {listed(own)} fused with own scales, against {listed(sharded)} for the default "
        f"sharded exchange in the same runs ({min(against):.2f}–{_x(max(against))} its step); "
        f"the ConvNet {_x(convnet[0])} against {_x(convnet[1])}.",
        f"it is {_x(fp16[0])}, {_x(fp16[1])} and {_x(fp16[2])} on LeNet (fp16's third run, "
        f"{_x(over('fp16', 'fp32')[2])} fp32,",
        f"and {_x(convnet[2])} on the ConvNet.",
    )
    m = runs[1]["lenet"]["methods"]
    own_fused, fused = m["terngrad-own-fused"], m["terngrad-fused"]
    rounds = " + ".join(f"{1e3 * fused['parts'][k]:.1f}" for k in ("all_reduce", "all_to_all",
                                                                   "all_gather"))  # fmt: skip

    def hook(method: str) -> str:
        return f"{1e3 * m[method]['parts']['hook thread']:.0f} ms"

    _said(
        f"one all-gather of {own_fused['bytes']['all_gather'] / 1e3:.0f} KB, "
        f"{1e3 * own_fused['parts']['all_gather']:.1f} ms with its waiting, against {rounds} ms "
        "for the fused sharded exchange's three rounds",
        f"decoding four messages instead of one sum, {1e3 * own_fused['parts']['decode_into']:.1f}"
        f" ms against {1e3 * fused['parts']['decode_into']:.1f} ms; glue "
        f"{1e3 * own_fused['parts']['glue']:.1f} ms",
        f"busy {hook('terngrad-own-fused')} a step against {hook('terngrad-fused')} fused-sharded "
        f"and {hook('terngrad')} sharded",
    )
    fp32 = [1e3 * step(i, "lenet", "fp32") for i in range(3)]
    _said(f"fp32's own step {min(fp32):.0f}–{max(fp32):.0f} ms across the runs")


# --------------------------------------------------------------------------- network


def _network(name: str) -> dict:
    return _json(f"network-{name}.json")


def _methods(name: str) -> dict[str, dict]:
    return {m["method"]: m for m in _network(name)["methods"]}


#: the testbed's tables: the words before each, its file, whether rows name the description
NETWORK_TABLES = {
    "**AlexNet (57.0M parameters), 1 Gbit/s links** — compute alone": ("alexnet-1gbit", True),
    "**AlexNet, 10 Gbit/s links** — compute alone": ("alexnet-10gbit", True),
    "**GoogLeNet (6.0M parameters), 1 Gbit/s links, batch 4** — compute alone":
        ("googlenet-1gbit", True),
    "**GoogLeNet, 10 Gbit/s links, batch 4** — compute alone": ("googlenet-10gbit", True),
    "**AlexNet, 1 Gbit/s, with one collective a bucket**": ("alexnet-1gbit-own", False),
}  # fmt: skip


def test_the_network_tables_are_their_runs():
    """The five tables of the bandwidth-limited testbed, every cell (step, speedup, MB sent a
    step per rank, the hook's encode+decode share), and each one's compute alone, from
    ``network-{alexnet,googlenet}-{1gbit,10gbit}.json`` and ``network-alexnet-1gbit-own.json``."""
    for heading, (name, described) in NETWORK_TABLES.items():
        run = _network(name)
        if described:
            _said(f"{heading} {run['compute_seconds']:.2f} s a step:")
        else:
            _said(f"compute alone {run['compute_seconds']:.3f} s, link probe "
                  f"{run['link_probe']['bytes_per_second'] / 1e6:.0f} MB/s:")  # fmt: skip
        _, *rows = _table(heading)
        assert len(rows) == len(run["methods"]), name
        for row, m in zip(rows, run["methods"], strict=True):
            label = f"{m['method']} ({m['description']})" if described else m["method"]
            assert (row[0] if described else row[0].split(" (")[0]) == label, name
            assert row[1:] == [
                f"{m['step_seconds']:.3f}", _x(m["speedup_vs_fp32"]),
                f"{m['wire_bytes_per_rank_per_step'] / 1e6:.2f}", f"{100 * m['codec_share']:.0f}%",
            ], (name, label)  # fmt: skip


def test_the_network_readings_are_their_runs():
    """The link probes, the unshaped runs, and the readings of the testbed's tables (speedups,
    bounds, what the network and the codec take, the losses at 10 Gbit/s, GoogLeNet's gains),
    from the ``network-*.json`` runs of AlexNet and GoogLeNet."""

    def probe(name: str) -> float:
        return _network(name)["link_probe"]["bytes_per_second"] / 1e6

    fast = [probe(f"{model}-{link}") for model in ("alexnet", "googlenet")
            for link in ("10gbit", "unlimited")]  # fmt: skip
    assert {f"{probe(f'{m}-1gbit'):.0f}" for m in ("alexnet", "googlenet")} == {"120"}
    _said(
        f"the **link probe**: 120 MB/s at 1 Gbit/s (the {probe('alexnet-1gbit') * 8:.0f} Mbit/s "
        "of TCP",
        f"{min(fast):.0f}–{max(fast):.0f} MB/s at 10 Gbit/s and unshaped",
        f"* At 10 Gbit/s ({probe('alexnet-10gbit'):.0f} MB/s really moved:",
    )
    alexnet, googlenet = _methods("alexnet-unlimited"), _methods("googlenet-unlimited")

    def steps(methods: dict, names: tuple) -> list[str]:
        return [f"{methods[n]['step_seconds']:.3f}" for n in names]

    a = steps(alexnet, ("fp32", "fp16", "powersgd", "terngrad", "terngrad-ps", "qsgd"))
    g = steps(googlenet, ("fp32", "fp16", "powersgd", "terngrad", "terngrad-ps"))
    _said(
        f"AlexNet fp32 {a[0]} s, fp16 {a[1]}, PowerSGD {a[2]}, TernGrad {a[3]}, TernGrad ps "
        f"{a[4]}, QSGD {a[5]} (compute {_network('alexnet-unlimited')['compute_seconds']:.2f} s); "
        f"GoogLeNet fp32 {g[0]}, fp16 {g[1]}, PowerSGD {g[2]}, TernGrad {g[3]}, ps {g[4]} "
        f"(compute {_network('googlenet-unlimited')['compute_seconds']:.2f} s)."
    )
    own = _network("alexnet-1gbit-own")
    m = _methods("alexnet-1gbit-own")
    bound = (
        own["compute_seconds"]
        + m["terngrad"]["wire_bytes_per_rank_per_step"] / (own["link_probe"]["bytes_per_second"])
    )
    step = {k: v["step_seconds"] for k, v in m.items()}
    wire = {k: v["wire_bytes_per_rank_per_step"] for k, v in m.items()}
    # (the own-scales section's bytes against fp32, from the same run)
    _said(
        f"{wire['fp32'] / wire['terngrad-own']:.0f}× fewer bytes than fp32 at N = 4 instead of "
        f"{wire['fp32'] / wire['terngrad']:.0f}×)"
    )
    _said(
        f"stays AlexNet's fastest: {_x(step['fp32'] / step['terngrad'])} fp32 and "
        f"{_x(step['fp16'] / step['terngrad'])} fp16",
        f"bound it at {_x(step['fp32'] / bound, 1)})",
        f"({m['terngrad-own']['wire_bytes_per_rank_per_step'] / 1e6:.1f} MB a step against "
        f"{m['terngrad']['wire_bytes_per_rank_per_step'] / 1e6:.1f})",
    )
    one, ten = _methods("alexnet-1gbit"), _methods("alexnet-10gbit")
    run = _network("alexnet-1gbit")
    compute = run["compute_seconds"]
    repeat = _methods("alexnet-1gbit-repeat")["terngrad"]["speedup_vs_fp32"]

    def speedup(methods: dict, name: str) -> str:
        return _x(methods[name]["speedup_vs_fp32"])

    tern, fp32 = one["terngrad"], one["fp32"]["step_seconds"]
    _said(
        f"sharded TernGrad is **{speedup(one, 'terngrad')} faster per step than DDP's fp32 "
        f"all-reduce and {_x(one['fp16']['step_seconds'] / tern['step_seconds'])} faster than "
        "PyTorch's fp16 hook**, sending "
        f"{one['fp32']['wire_bytes_per_rank_per_step'] / tern['wire_bytes_per_rank_per_step']:.0f}"
        f"× fewer bytes than fp32 (step times move between runs on this shared machine: a "
        f"repeat, below, measured {_x(repeat)})",
        f"compute alone takes {compute:.2f} s of fp32's {fp32:.2f} s, and even free "
        f"communication would give at most {_x(fp32 / compute, 1)}",
        f"TernGrad's step is compute plus about {tern['step_seconds'] - compute:.2f} s, of which "
        f"the network takes about "
        f"{tern['wire_bytes_per_rank_per_step'] / run['link_probe']['bytes_per_second']:.2f} s "
        f"({tern['wire_bytes_per_rank_per_step'] / 1e6:.0f} MB at "
        f"{run['link_probe']['bytes_per_second'] / 1e6:.0f} MB/s)",
        f"in two phases one after the other: {speedup(one, 'terngrad-ps')} at 1 Gbit/s against "
        f"{speedup(one, 'terngrad')}.",
        f"({one['powersgd']['wire_bytes_per_rank_per_step'] / 1e6:.1f} MB)",
        f"the transfer they save here: {speedup(one, 'powersgd')} at 1 Gbit/s, "
        f"{speedup(ten, 'powersgd')} at 10 Gbit/s.",
    )
    losses = [100 * (1 - ten[k]["speedup_vs_fp32"]) for k in ("fp16", "terngrad", "terngrad-ps",
                                                               "qsgd")]  # fmt: skip
    gains = [100 * (g["speedup_vs_fp32"] - 1) for k, g in _methods("googlenet-1gbit").items()
             if k != "fp32"]  # fmt: skip
    ten_g = [g["speedup_vs_fp32"] for k, g in _methods("googlenet-10gbit").items() if k != "fp32"]
    assert max(ten_g) < 1 and min(losses) > 0  # (every compressor loses, none gains)
    ten_compute = _network("alexnet-10gbit")["compute_seconds"]
    googlenet_mb = _methods("googlenet-1gbit")["fp32"]["wire_bytes_per_rank_per_step"] / 1e6
    _said(
        f"fp32 costs {ten['fp32']['step_seconds'] - ten_compute:.2f} s over compute and every "
        f"compressor loses, by {min(losses):.0f}–{max(losses):.0f}% "
        f"(PowerSGD {100 * (1 - ten['powersgd']['speedup_vs_fp32']):.0f}%)",
        f"GoogLeNet ({googlenet_mb:.0f} MB a step) is compute-bound: at 1 Gbit/s every "
        "compressor gains "
        f"{min(gains):.0f}–{max(gains):.0f}%, at 10 Gbit/s none gains.",
    )


# --------------------------------------------------------------------------- performance model


def _validation(model: str):
    """The calibration and the checks of ``model-validation-<model>.json``."""
    from terngrad.bench.validation import Calibration, Check

    found = _json(f"model-validation-{model}.json")
    checks = [Check(c["bandwidth"], c["method"], c["measured"], c["predicted"])
              for c in found["checks"]]  # fmt: skip
    return Calibration(**found["calibration"]), checks


def test_the_validation_tables_are_the_model_validation_files():
    """The model against the testbed, AlexNet's and GoogLeNet's: the calibration line, every
    row and the largest error, as ``terngrad perf-model validate`` writes them from
    ``model-validation-{alexnet,googlenet}.json``; the measured steps are the runs' own."""
    from terngrad.bench.validation import validation_table

    for model in ("alexnet", "googlenet"):
        calibration, checks = _validation(model)
        assert validation_table(calibration, checks) in PAGE, model
        for c in checks:
            measured = _methods(f"{model}-{c.bandwidth}")[c.method]["step_seconds"]
            assert c.measured == measured, (model, c)


@cache
def _alexnet():
    from terngrad.bench.perf_model import profile_model

    return profile_model("alexnet")


def test_the_validation_readings_are_the_files_and_the_model():
    """How many predictions are within 15% and 10%, the parameter server's misses (its repeat
    predicted by the model from AlexNet's calibration), how far the repeat
    moved from the first runs, its retransmissions, AlexNet's errors and compute times, from
    the validation files and ``network-alexnet-*.json``."""
    from terngrad.bench.validation import validate

    errors = {m: [100 * c.error for c in _validation(m)[1]] for m in ("alexnet", "googlenet")}
    every = errors["alexnet"] + errors["googlenet"]
    within = [sum(abs(e) <= limit for e in every) for limit in (15, 10)]
    calibration, checks = _validation("alexnet")
    ps = {c.bandwidth: 100 * c.error for c in checks if c.method == "terngrad-ps"}
    fp16 = next(100 * c.error for c in checks if (c.bandwidth, c.method) == ("1gbit", "fp16"))
    repeats = {link: _network(f"alexnet-{link}-repeat") for link in ("1gbit", "10gbit")}
    again = {(c.bandwidth, c.method): 100 * c.error
             for c in validate(calibration, repeats.values(), _alexnet())}  # fmt: skip

    def err(method: str) -> str:
        return "/".join(_signed(again[link, method])[:-1] for link in ("1gbit", "10gbit"))

    _said(
        f"**{within[0]} of {len(every)} predictions are within 15% ({within[1]} within 10%); the "
        f"parameter server at 10 Gbit/s misses the goal ({_signed(ps['10gbit'])}), and again at "
        f"1 Gbit/s in a repeat run ({_signed(again['1gbit', 'terngrad-ps'])}).**",
        f"Against the repeat the model is {_signed(again['1gbit', 'terngrad-ps'])} and "
        f"{_signed(again['10gbit', 'terngrad-ps'])} for it (fp32 {err('fp32')}%, TernGrad "
        f"{err('terngrad')}%)",
        f"than this one does ({_signed(fp16)} and {_signed(ps['1gbit'])}).",
    )
    first = {link: _methods(f"alexnet-{link}") for link in ("1gbit", "10gbit")}
    again_steps = {link: {m["method"]: m for m in r["methods"]} for link, r in repeats.items()}
    moved = {(link, k): 100 * (again_steps[link][k]["step_seconds"] / first[link][k]["step_seconds"]
                               - 1)
             for link in first for k in ("fp32", "terngrad", "terngrad-ps")}  # fmt: skip
    steady = [abs(v) for (_, k), v in moved.items() if k != "terngrad-ps"]
    _said(
        f"measured it at {again_steps['1gbit']['terngrad-ps']['step_seconds']:.3f} s at 1 Gbit/s "
        f"(first run {first['1gbit']['terngrad-ps']['step_seconds']:.3f}) and "
        f"{again_steps['10gbit']['terngrad-ps']['step_seconds']:.3f} s at 10 Gbit/s (first run "
        f"{first['10gbit']['terngrad-ps']['step_seconds']:.3f}): "
        f"{_signed(moved['1gbit', 'terngrad-ps'], 0)} and "
        f"{_signed(moved['10gbit', 'terngrad-ps'], 0)} between runs, where fp32 and sharded "
        f"TernGrad moved by {min(steady):.0f}–{max(steady):.0f}%.",
    )
    retransmits = [m["tcp_retransmits_per_step"] for r in repeats.values() for m in r["methods"]]
    fp32_mb = again_steps["1gbit"]["fp32"]["wire_bytes_per_rank_per_step"] / 1e6
    _said(f"(at most {max(retransmits):.0f} segments a step, of fp32's {fp32_mb:.0f} MB)")
    low = [-e for c, e in zip(checks, errors["alexnet"], strict=True)
           if e < 0 and c.method != "terngrad-ps"]  # fmt: skip
    computes = {link: _network(f"alexnet-{link}")["compute_seconds"]
                for link in ("unlimited", "1gbit", "10gbit")}  # fmt: skip
    assert max(computes, key=computes.get) == "unlimited"  # (the calibration's: the slowest)
    lo, hi = min(computes.values()), max(computes.values())
    _said(
        f"AlexNet's predictions are mostly low, by {min(low):.0f}–{max(low):.0f}%",
        f"varies by ±{100 * (hi - lo) / (hi + lo):.0f}% between runs ({lo:.2f}–{hi:.2f} s)",
    )


def test_the_scaling_table_is_scaling_json():
    """The extrapolation to GPU clusters: images a second of fp32 and TernGrad at 8, 64 and 512
    workers and their ratio (two decimals where one would read 1.0), every cell, and the
    readings' ranges, from ``scaling.json`` (modelled, not measured)."""
    found = _json("scaling.json")
    ips = found["images_per_second"]
    workers = found["workers"]
    networks = {"1 GbE": "1gbe", "100 Gb IB": "100gib"}
    models = {"AlexNet": "alexnet", "GoogLeNet": "googlenet", "VGG-A": "vgg-a"}
    header, *rows = _table("| images/s (fp32 → TernGrad) |")
    columns = [int(cell.split()[0]) for cell in header[1:]]
    assert len(rows) == len(networks) * len(models)

    def ratio(r: float) -> str:
        return _x(r, 2 if abs(r - 1) < 0.05 else 1)

    gains: dict[str, list[float]] = {net: [] for net in networks.values()}
    for row in rows:
        model, net = row[0].split(", ")
        methods = ips[networks[net]][models[model]]["methods"]
        cells = []
        for n in columns:
            fp32, ours = (methods[k][workers.index(n)] for k in ("fp32", "terngrad"))
            cells.append(f"{fp32:,.0f} → {ours:,.0f} ({ratio(ours / fp32)})")
            gains[networks[net]].append((models[model], ours / fp32))
        assert row[1:] == cells, row[0]
    ethernet = [r for _, r in gains["1gbe"]]
    slow = [r for model, r in gains["100gib"] if model != "alexnet"]
    googlenet = ips["1gbe"]["googlenet"]["methods"]
    _said(
        f"give {min(ethernet):.1f}–{_x(max(ethernet), 1)} more images/s",
        f"holds it to {_x(googlenet['terngrad'][0] / googlenet['fp32'][0], 1)} at 8 workers",
        f"codec time cost up to {100 * (1 - min(slow)):.0f}%",
    )


# --------------------------------------------------------------------------- bytes on the wire


def test_the_bytes_on_the_wire_are_the_traffic_model_and_the_lenet_runs():
    """The MLP's bytes at 4 ranks (sharded TernGrad against the fp32 ring all-reduce), from the
    traffic model that ``tests/distributed/test_traffic_model.py`` holds to the hook's own
    counters; LeNet's at 4 and 2 workers, from ``lenet/results.json``."""
    import torch
    from torch import nn

    from terngrad.bench.profile import profile
    from terngrad.bench.traffic_model import transfers
    from terngrad.comm import ring_bytes

    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                        nn.Linear(256, 10))  # fmt: skip
    prof = profile(mlp, (784,))
    sent = sum(t.ranks[0].sent * t.weight for t in transfers(prof, "terngrad", 4))
    lenet = _json("lenet/results.json")

    def fewer(workers: int) -> str:
        runs = [
            lenet[f"{q}, {workers} workers"]["bytes_sent_per_step"] for q in ("fp32", "terngrad")
        ]
        return _x(runs[0] / runs[1], 1)  # fmt: skip

    _said(
        f"TernGrad: {_x(ring_bytes(4 * prof.numel, 4) / sent, 1)} fewer bytes per step than "
        "PyTorch's fp32 all-reduce hook on a 784-256-256-10 MLP",
        f"LeNet: {fewer(4)} at 4 workers, {fewer(2)} at 2,",
    )
