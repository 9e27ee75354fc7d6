"""The measured figures of the README (and of docs/time-to-accuracy.md's tuned LeNet table, and
the local-steps sweep's leads, bytes and steps in docs/time-to-accuracy.md and
docs/local-steps.md), checked against the committed result files they come from.

Each check reads a figure where the README states it (a table cell, or the words around it)
and computes the same figure from ``docs/results/``: a figure that drifts from its file, or a
file that changes under a figure, fails here. Formats are the README's: seconds as
``mean ± sd s`` rounded to whole seconds, ratios to two decimals with ``×``, loss gaps as signed
percentages to two decimals.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
from support import markdown_rows

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
#: the README's words with every run of white space one space (a figure may wrap)
WORDS = " ".join(README.split())
RESULTS = ROOT / "docs" / "results"
SWEEP = json.loads((RESULTS / "accuracy" / "lenet-tuned" / "sweep.json").read_text())

#: the README's time-to-accuracy table: its links and its method columns, as the sweep names them
LINKS = {
    "unlimited": "unlimited",
    "1 Gbit/s": "1gbit",
    "100 Mbit/s": "100mbit",
    "25 Mbit/s": "25mbit",
    "10 Mbit/s": "10mbit",
}
COLUMNS = {
    "DDP fp32": "fp32",
    "fp16 hook": "fp16",
    "PowerSGD rank 4": "powersgd-r4",
    "terngrad per step": "terngrad",
    "terngrad-local25": "terngrad-local25",
}
#: PyTorch's own methods, among which "PyTorch's fastest" is taken
PYTORCH = ("fp32", "fp16", "powersgd", "powersgd-r1", "powersgd-r4")


def _table(heading: str) -> list[dict[str, str]]:
    """The first Markdown table at or after ``heading`` in the README, one dict per row."""
    header, *rows = markdown_rows(README, heading)
    return [dict(zip(header, row, strict=True)) for row in rows]


def _point(link: str) -> dict[str, dict]:
    return next(p["methods"] for p in SWEEP["points"] if p["bandwidth"] == link)


def _seconds(run: dict | None) -> str:
    """A cell: ``mean ± sd s`` where every seed reached the target, ``-`` otherwise."""
    if run is None or run["seconds_to_target"] is None or run["reached_runs"] < len(run["seeds"]):
        return "-"
    return f"{run['seconds_to_target']:.0f} ± {run['seconds_to_target_sd']:.0f} s"


def _lead(link: str) -> float:
    """How much sooner terngrad-local25 reaches the target than PyTorch's fastest method."""
    methods = _point(link)
    fastest = min(
        m["seconds_to_target"]
        for name, m in methods.items()
        if name in PYTORCH and m["seconds_to_target"] is not None
        and m["reached_runs"] == len(m["seeds"])
    )  # fmt: skip
    return fastest / methods["terngrad-local25"]["seconds_to_target"]


def _ratio(value: float) -> str:
    return f"{value:.2f}×"


def test_the_time_to_accuracy_table_is_the_sweeps():
    rows = _table("## Time to accuracy on a slow link")
    assert [row["link"] for row in rows] == list(LINKS)
    for row in rows:
        methods = _point(LINKS[row["link"]])
        for column, method in COLUMNS.items():
            assert row[column] == _seconds(methods.get(method)), (row["link"], column)
        lead = row["local25 vs PyTorch's fastest"].strip("*")
        assert lead == _ratio(_lead(LINKS[row["link"]])), row["link"]


def test_the_which_method_table_quotes_the_sweeps_leads():
    rows = {(r["your training"], r["link"]): r["measured"] for r in _table("| your training |")}
    slow = [_lead(link) for link in ("100mbit", "25mbit", "10mbit")]
    fast = [_lead(link) for link in ("unlimited", "1gbit")]
    assert rows["SGD + momentum (LeNet)", "≤ 100 Mbit/s"].startswith(
        f"{min(slow):.2f}–{_ratio(max(slow))} sooner than PyTorch's fastest"
    )
    assert (
        f"level: {min(fast):.2f}–{_ratio(max(fast))}"
        in rows["SGD + momentum (LeNet)", "≥ 1 Gbit/s"]
    )


def test_the_limits_quote_per_step_terngrad_and_local_steps_on_fast_links():
    per_step = [
        _point(link)["fp16"]["seconds_to_target"] / _point(link)["terngrad"]["seconds_to_target"]
        for link in ("unlimited", "1gbit")
    ]
    assert f"({_ratio(per_step[0])}, {_ratio(per_step[1])}, tuned)" in WORDS
    fast = [_lead(link) for link in ("unlimited", "1gbit")]
    assert f"local steps are level there ({min(fast):.2f}–{_ratio(max(fast))}" in WORDS


def _race(link: str) -> dict[str, float]:
    """Mean training seconds to the GPT race's target, by method, over its three seeds."""
    folder = RESULTS / "accuracy" / "gpt-race" / link
    if (folder / "three-seeds").is_dir():
        folder = folder / "three-seeds"
    found = json.loads((folder / "results.json").read_text())["methods"]
    return {m["method"]: m["reached"]["train_seconds"] for m in found if len(m["seeds"]) == 3}


def test_the_gpt_race_figures_are_the_three_seed_means():
    method = "terngrad-b512-last-min0-ef-localvar100"
    leads = [_race(link)["fp16"] / _race(link)[method] for link in ("25mbit", "100mbit")]
    assert f"[{_ratio(leads[0])}, {_ratio(leads[1])} sooner than fp16]" in WORDS
    assert f"`{method}`" in WORDS


def _eval_losses(model: str, setting: str) -> list[dict]:
    folder = RESULTS / "trainer-defaults"
    return [json.loads((folder / f"{model}-{setting}-s{s}.json").read_text()) for s in range(3)]


@pytest.mark.parametrize("model, words", [("gpt2", "GPT-2"), ("bert", "BERT")])
def test_the_trainer_defaults_figures_are_the_three_seed_means(model, words):
    ddp = statistics.mean(r["eval_loss"] for r in _eval_losses(model, "ddp"))
    runs = _eval_losses(model, "hook-last-qsgd5-b64")  # the default's setting, bit for bit
    gap = statistics.mean(r["eval_loss"] for r in runs) / ddp - 1
    assert f"{100 * gap:+.2f}% {words}" in WORDS
    compression = {round(r["compression"], 1) for r in runs}
    assert len(compression) == 1
    assert f"{compression.pop():.1f}×" in WORDS


#: how docs/time-to-accuracy.md names PyTorch's methods
PYTORCH_WORDS = {"fp32": "fp32", "fp16": "fp16", "powersgd": "PowerSGD r2",
                 "powersgd-r1": "PowerSGD r1", "powersgd-r4": "PowerSGD r4"}  # fmt: skip


def _fastest(link: str, pytorch: bool) -> tuple[str, float]:
    """The fastest of PyTorch's methods (or of terngrad's) on ``link`` that every seed took to
    the target: its name and mean seconds."""
    done = {
        name: m["seconds_to_target"]
        for name, m in _point(link).items()
        if (name in PYTORCH) == pytorch
        and m["seconds_to_target"] is not None
        and m["reached_runs"] == len(m["seeds"])
    }
    name = min(done, key=done.get)
    return name, done[name]


def test_the_tuned_lenet_table_of_time_to_accuracy_md_is_the_sweeps():
    """docs/time-to-accuracy.md's table of the tuned LeNet race: per link the fastest of
    PyTorch's and of terngrad's methods, the lead, and terngrad's time over its fastest on the
    unlimited link."""
    page = (ROOT / "docs" / "time-to-accuracy.md").read_text()
    heading = "| link | fastest of PyTorch's (fp32, fp16, PowerSGD at rank 1, 2 or 4) |"
    lines = page[page.index(heading) :].splitlines()
    rows = {}
    for line in lines[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        rows[cells[0]] = cells[1:]
    assert list(rows) == list(LINKS)
    _, unlimited = _fastest("unlimited", pytorch=False)
    for words, link in LINKS.items():
        theirs, their_s = _fastest(link, pytorch=True)
        ours, our_s = _fastest(link, pytorch=False)
        assert rows[words] == [
            f"{PYTORCH_WORDS[theirs]} {their_s:.0f} s",
            f"`{ours}` {our_s:.0f} s",
            _ratio(their_s / our_s),
            _ratio(our_s / unlimited),
        ], words


def _words(page: str) -> str:
    """``docs/<page>`` with every run of white space one space."""
    return " ".join((ROOT / "docs" / page).read_text().split())


def _local_sweep() -> dict[str, dict]:
    """The local-steps sweep at the protocol's lr (``sweep-local``), its points by link."""
    sweep = json.loads((RESULTS / "accuracy" / "sweep-local" / "sweep.json").read_text())
    return {p["bandwidth"]: p for p in sweep["points"]}


def test_the_local_steps_sweeps_leads_are_its_files():
    """``terngrad-ef-local25`` against PyTorch's fastest method that reached 98% on every seed
    (PowerSGD on the slow links), fp32 on the unlimited one; and the fastest of terngrad's
    methods there (``fastest_terngrad``: the auto-H run at 25 and 10 Mbit/s) as the sweep
    file records its lead."""
    points = _local_sweep()

    def local25_over(link: str, among: tuple[str, ...]) -> float:
        methods = points[link]["methods"]
        reached = [m["seconds_to_target"] for n, m in methods.items() if n in among
                   and m["seconds_to_target"] is not None and m["reached_runs"] == 3]  # fmt: skip
        return min(reached) / methods["terngrad-ef-local25"]["seconds_to_target"]

    pytorch = ("fp32", "fp16", "powersgd")
    lead = {link: _ratio(local25_over(link, pytorch)) for link in ("100mbit", "25mbit", "10mbit")}
    unlimited = _ratio(local25_over("unlimited", ("fp32",)))
    assert (
        f"`terngrad-ef-local25` reaches 98% {lead['100mbit']} sooner than PowerSGD at 100 Mbit/s, "
        f"{lead['25mbit']} at 25, {lead['10mbit']} at 10, and {unlimited} sooner than fp32 "
        "unlimited" in _words("time-to-accuracy.md")
    )
    best = {link: _ratio(points[link]["terngrad_sooner_than_pytorch"]) for link in points}
    assert (
        f"| {best['100mbit']} (100), {best['25mbit']} (25, localauto; local25 {lead['25mbit']}), "
        f"{best['10mbit']} (10; local25 {lead['10mbit']}) | met |" in _words("local-steps.md")
    )
    assert f"{best['unlimited']} and {best['1gbit']} sooner than fp32" in _words("local-steps.md")


def test_the_local_steps_sweeps_bytes_are_its_files():
    """local-steps.md's wire bytes a step per rank (MB, the testbed's count, mean over seeds)
    and the ratios drawn from them: ternary against fp32 outer gradients at the same H (10.9x
    at unlimited and 1 Gbit/s, the range over every link, and of the bytes the exchanges
    counted) and against DDP fp32."""

    def per_step(link: str, key: str = "wire_bytes_per_step") -> dict[str, float]:
        found = json.loads(
            (RESULTS / "accuracy" / "sweep-local" / link / "results.json").read_text()
        )
        return {m["method"]: m[key] for m in found["methods"]}

    links = ("unlimited", "1gbit", "100mbit", "25mbit", "10mbit")
    wire = {link: per_step(link) for link in links}
    fast, slow = wire["unlimited"], wire["100mbit"]
    mb = {name: value / 1e6 for name, value in fast.items()}
    assert (
        f"Wire bytes per step per rank: fp32 {mb['fp32']:.2f} MB, fp16 {mb['fp16']:.2f}, "
        f"PowerSGD {mb['powersgd']:.3f}, per-step TernGrad {slow['terngrad'] / 1e6:.3f}, "
        f"`fp32-sharded-local25` {mb['fp32-sharded-local25']:.3f}, `terngrad-ef-local25` "
        f"{mb['terngrad-ef-local25']:.3f}" in _words("local-steps.md")
    )
    ratios = [w["fp32-sharded-local25"] / w["terngrad-ef-local25"] for w in wire.values()]
    hook = per_step("unlimited", "hook_bytes_per_step")
    counted = hook["fp32-sharded-local25"] / hook["terngrad-ef-local25"]
    assert f"{ratios[0]:.1f}× fewer on the wire than fp32 DiLoCo at the same H" in _words(
        "local-steps.md"
    )
    assert f"{ratios[0]:.1f}" == f"{ratios[1]:.1f}"  # (unlimited and 1 Gbit/s alike)
    assert (
        f"{min(ratios):.1f}–{max(ratios):.1f}× over the links, {counted:.1f}× of the bytes the "
        f"exchanges counted; {fast['fp32'] / fast['terngrad-ef-local25']:.0f}× fewer than DDP "
        "fp32 on the wire" in _words("local-steps.md")
    )


def test_the_local_steps_sweeps_steps_are_its_files():
    """local-steps.md's steps to 98% (mean ± sd over the seeds): local25's inner steps (the same
    at every link: the link changes no step) against fp32's (unlimited), and the overlap form's
    (25 Mbit/s, where it ran)."""

    def steps(link: str) -> dict[str, tuple[float, float]]:
        found = json.loads(
            (RESULTS / "accuracy" / "sweep-local" / link / "results.json").read_text()
        )
        return {m["method"]: (m["reached"]["step"], m["steps_to_target_sd"])
                for m in found["methods"] if m["reached_runs"] == len(m["seeds"])}  # fmt: skip

    local, fp32 = steps("25mbit")["terngrad-ef-local25"], steps("unlimited")["fp32"]
    overlap = steps("25mbit")["terngrad-ef-local25-overlap"]
    assert all(steps(link)["terngrad-ef-local25"] == local for link in ("unlimited", "10mbit"))
    assert (
        f"`terngrad-ef-local25` {local[0]:.0f} ± {local[1]:.0f} inner steps against fp32's "
        f"{fp32[0]:.0f} ± {fp32[1]:.0f} ({local[0] / fp32[0]:.2f}×); the overlap form "
        f"{overlap[0]:.0f} ± {overlap[1]:.0f}" in _words("local-steps.md")
    )


def test_the_races_rates_and_bytes_are_the_sweeps():
    """The README's rates tuned (every tuned method's lr, local steps' outer rate) and the wire
    bytes a step per rank of local steps and of per-step TernGrad, over every link of the
    sweep (each rounded as the README states it)."""
    chosen: dict[str, set] = {}
    wire: dict[str, list[float]] = {"terngrad": [], "terngrad-local25": []}
    for point in SWEEP["points"]:
        for name, m in point["methods"].items():
            chosen.setdefault(name, set()).add((m.get("lr"), m.get("outer_lr")))
        link = RESULTS / "accuracy" / "lenet-tuned" / point["bandwidth"] / "results.json"
        for m in json.loads(link.read_text())["methods"]:
            if m["method"] in wire:
                wire[m["method"]].append(m["wire_bytes_per_step"])
    per_step = {chosen[n].pop() for n in ("fp32", "fp16", "powersgd", "powersgd-r4", "terngrad")}
    assert per_step == {(0.08, None)}
    ((lr, outer),) = chosen["terngrad-local25"]
    assert f"The rates tuned: 0.08 for fp32, fp16, PowerSGD and per-step TernGrad; {lr:g} " \
        f"(outer {outer:g}) for local steps" in WORDS  # fmt: skip
    local = {f"{b / 1e6:.2f}" for b in wire["terngrad-local25"]}
    tern = {f"{b / 1e6:.2f}" for b in wire["terngrad"]}
    assert len(local) == len(tern) == 1
    assert f"send {local.pop()} MB a step per rank" in WORDS
    assert f"per-step TernGrad ({tern.pop()} MB)" in WORDS


def test_the_gpt_local_steps_limits_are_its_runs():
    """The README's limits on the GPT: local steps end 7–19% above DDP's loss, +7.3% at H = 10
    (``terngrad-local10``, 2 seeds), 15–19% at H = 25 at every inner lr tried (against DDP at
    the same lr), from transformer-local/ and DDP's 3-seed mean."""
    local = RESULTS / "transformer-local"

    def loss(folder: Path) -> float:
        return json.loads((folder / "summary.json").read_text())["loss"]

    ddp = statistics.fmean(loss(RESULTS / "transformer-small" / f"fp32-s{s}") for s in range(3))
    h10 = statistics.fmean(loss(local / f"terngrad-local10-s{s}") for s in range(2))
    h25 = {"1e-3": statistics.fmean(loss(local / f"terngrad-local25-s{s}") for s in range(2))}
    ddp_at = {"1e-3": ddp}
    for lr in ("2e-3", "4e-3"):  # (DDP was run at these rates too)
        h25[lr] = loss(local / f"terngrad-local25-lr{lr}-s0")
        ddp_at[lr] = loss(local / f"fp32-lr{lr}-s0")
    gaps = [100 * (h25[lr] / ddp_at[lr] - 1) for lr in h25]
    low, high = round(100 * (h10 / ddp - 1)), round(max(gaps))
    assert (
        f"(+{100 * (h10 / ddp - 1):.1f}% at H = 10, {round(min(gaps))}–{high}% at H = 25" in WORDS
    )
    assert f"end {low}–{high}% above DDP's loss there" in WORDS


def test_the_mlps_bytes_are_the_traffic_models():
    """The README's (and docs/distributed.md's) bytes of examples/ddp_terngrad.py's MLP at 4
    ranks: sharded TernGrad against PyTorch's fp32 ring all-reduce, from the traffic model,
    which ``tests/distributed/test_traffic_model.py`` holds to the hook's own counters."""
    import torch
    from torch import nn

    from terngrad.bench.profile import profile
    from terngrad.bench.traffic_model import transfers
    from terngrad.comm import ring_bytes

    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                        nn.Linear(256, 10))  # fmt: skip
    prof = profile(mlp, (784,))
    sent, fp32 = {}, {}
    for world in (2, 4):
        sent[world] = sum(t.ranks[0].sent * t.weight for t in transfers(prof, "terngrad", world))
        fp32[world] = ring_bytes(4 * prof.numel, world)
    assert f"each rank sends {fp32[4] / sent[4]:.1f}× fewer bytes a step" in WORDS
    distributed = _words("distributed.md")
    assert (f"{sent[4]:,.0f} vs {fp32[4]:,.0f}: **{fp32[4] / sent[4]:.1f}× fewer** "
            f"({fp32[2] / sent[2]:.1f}× at 2 ranks)") in distributed  # fmt: skip
    assert f"MLP 784-256-256-10 ({prof.numel:,} parameters;" in distributed


def test_the_readmes_test_times_are_the_measured_ones():
    """The README's times of ``make test`` and ``make test-fast``, from the measured run."""
    times = json.loads((RESULTS / "test-suite" / "times.json").read_text())
    minutes = round(times["make_test_seconds"] / 60)
    assert f"(~{minutes} min on 2 cores)" in README
    assert (
        times["make_test_fast_seconds"] < 120 and "the unit tier alone (under 2 minutes)" in README
    )
    words = _words("training.md")
    seconds = times["make_test_seconds"]
    assert f"on 2 cores of an AMD EPYC: {seconds // 60} min {seconds % 60} s" in words
    assert f"pytest {times['make_test_pytest_seconds']} s;" in words
