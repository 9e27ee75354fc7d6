"""The measured figures of docs/local-steps.md that ``test_doc_tables.py`` and
``test_doc_figures.py`` leave unchecked, each read where the page states it (a table cell, or
the words around it with white space normalised) and made again from the committed result files
under ``docs/results/`` with the page's rounding: a figure that drifts from its file, or a file
that changes under a figure, fails here.

The sources: the LeNet sweeps (``accuracy/sweep-local``, ``accuracy/lenet-tuned``,
``accuracy/sweep-amd``), the GPT's runs (``transformer-local``, ``transformer-small``), the GPT
race (``accuracy/gpt-race``), the one-worker check (``one-worker``), the Trainer's runs
(``trainer-defaults``), and the traffic model for the bytes of the DiLoCo tests' small model
(``tests/distributed/test_traffic_model.py`` holds it to DiLoCo's own counters). The examples'
local-steps bytes, which this page and docs/integrations.md both give, are checked in
``test_doc_integrations.py``."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from support import markdown_rows

from terngrad.experiments.comparison import spread

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs" / "local-steps.md").read_text()
#: the page's words with every run of white space one space (a figure may wrap)
WORDS = " ".join(PAGE.split())
RESULTS = ROOT / "docs" / "results"
ACCURACY = RESULTS / "accuracy"
LOCAL = RESULTS / "transformer-local"
#: PyTorch's own methods, among which "the fastest of PyTorch's" is taken
PYTORCH = ("fp32", "fp16", "powersgd", "powersgd-r1", "powersgd-r4")


def _json(path: Path) -> dict:
    return json.loads(path.read_text())


def _methods(folder: str, link: str) -> dict[str, dict]:
    """A sweep's methods on ``link`` (``results.json``), by name."""
    return {m["method"]: m for m in _json(ACCURACY / folder / link / "results.json")["methods"]}


def _points(folder: str) -> dict[str, dict]:
    """A sweep's points (``sweep.json``), by link."""
    return {p["bandwidth"]: p for p in _json(ACCURACY / folder / "sweep.json")["points"]}


def _reached(m: dict | None) -> float | None:
    """A method's mean seconds to the target where every seed reached it, else ``None``."""
    if m is None or m["seconds_to_target"] is None or m["reached_runs"] < len(m["seeds"]):
        return None
    return m["seconds_to_target"]


def _pct(value: float, digits: int = 1) -> str:
    """A signed percentage as the page writes it in prose (a minus sign, not a hyphen)."""
    return f"{value:+.{digits}f}%".replace("-", "−")


def _loss(folder: Path) -> float:
    return _json(folder / "summary.json")["loss"]


def _curve(folder: Path) -> dict[int, float]:
    """A run's validation loss by step, from its ``metrics.jsonl``."""
    lines = (folder / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r["loss"] for r in map(json.loads, lines) if "loss" in r}


def _ddp() -> list[float]:
    """fp32 DDP's final losses on the GPT, its three seeds."""
    return [_loss(RESULTS / "transformer-small" / f"fp32-s{s}") for s in range(3)]


def _ddp_bytes() -> float:
    """fp32 DDP's bytes a step per rank on the GPT, from transformer-small's results table."""
    table = (RESULTS / "transformer-small" / "results.md").read_text()
    header, *rows = markdown_rows(table, "| method | seeds | final val loss | vs fp32 |")
    row = next(r for r in rows if r[0] == "fp32")
    return float(row[header.index("bytes / step / rank (whole run)")].replace(",", ""))


# --------------------------------------------------------------------------- bytes


def test_the_local_steps_tests_bytes_are_the_traffic_models():
    """The section 'Tested': ternary outer gradients with every tensor quantized against fp32 ones
    at the same H on ``tests/distributed/diloco_workers.py``'s MLP (10k parameters, 256 batch-norm
    statistics), 2 and 4 ranks, from the traffic model, and the formulas' ceilings."""
    import torch
    from torch import nn

    from terngrad.bench.profile import profile
    from terngrad.bench.traffic_model import transfers

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(64, 128), nn.BatchNorm1d(128), nn.ReLU(), nn.Linear(128, 10))
    prof = profile(net, (64,))

    def sent(method: str, world: int) -> float:
        return sum(t.ranks[0].sent * t.weight for t in transfers(prof, method, world))

    fewer = {
        world: sent("fp32-sharded-last-min0-local4", world)
        / sent("terngrad-last-min0-local4", world)
        for world in (2, 4)
    }
    ceiling = {n: 2 * 32 / (1.6 + math.log2(2 * n + 1)) for n in (2, 4)}
    assert (
        f"send {fewer[2]:.1f}× (2 ranks) and {fewer[4]:.1f}× (4 ranks) fewer bytes than fp32 ones "
        f"at the same H on that {round(prof.numel, -3) // 1000}k-parameter MLP, whose "
        f"{prof.buffers} batch-norm statistics travel in fp32 in both" in WORDS
    )
    assert f"{ceiling[2]:.1f}× and {ceiling[4]:.1f}× before headers and scales" in WORDS


# --------------------------------------------------------------------------- the LeNet sweeps


def test_the_tuned_races_lead_is_lenet_tuned():
    """The lead at every method's tuned rate from 100 Mbit/s down: ``terngrad-local25`` over
    PyTorch's fastest (PowerSGD on every such link), and ``--local-steps auto``'s at 25 and
    10 Mbit/s, from ``accuracy/lenet-tuned/sweep.json``."""
    points = _points("lenet-tuned")
    slow = ("100mbit", "25mbit", "10mbit")
    leads = []
    for link in slow:
        methods = points[link]["methods"]
        fastest = min(t for n in PYTORCH if (t := _reached(methods.get(n))) is not None)
        assert points[link]["fastest_pytorch"]["method"].startswith("powersgd")
        leads.append(fastest / methods["terngrad-local25"]["seconds_to_target"])
    auto = [points[link]["terngrad_sooner_than_pytorch"] for link in ("25mbit", "10mbit")]
    assert all(points[link]["fastest_terngrad"]["method"] == "terngrad-localauto"
               for link in ("25mbit", "10mbit"))  # fmt: skip
    assert (
        f"the lead from 100 Mbit/s down is {min(leads):.2f}–{max(leads):.2f}× over PowerSGD for "
        f"`terngrad-local25` ({auto[0]:.2f}× and {auto[1]:.2f}× at 25 and 10 Mbit/s for "
        "`--local-steps auto`)" in WORDS
    )


def test_fp32_and_fp16_on_the_slow_links_are_the_earlier_sweeps():
    """fp32's and fp16's seconds at 25 Mbit/s (the earlier sweep on this CPU,
    ``accuracy/sweep-amd``), and what their wire bytes alone (``sweep-local`` unlimited) would
    need at 10 Mbit/s over their steps to 98%, floored to ten seconds."""
    earlier = _methods("sweep-amd", "25mbit")
    took = [
        f"{earlier[n]['reached']['train_seconds']:.0f} ± {earlier[n]['seconds_to_target_sd']:.0f} s"
        for n in ("fp32", "fp16")
    ]
    assert f"at 25 Mbit/s they took {took[0]} and {took[1]} in the earlier sweep" in WORDS
    fast = _methods("sweep-local", "unlimited")
    mb = [f"{fast[n]['wire_bytes_per_step'] / 1e6:.1f}" for n in ("fp32", "fp16")]
    steps = [fast[n]["reached"]["step"] for n in ("fp32", "fp16")]
    need = [
        fast[n]["wire_bytes_per_step"] * 8 * s / 10e6
        for n, s in zip(("fp32", "fp16"), steps, strict=True)
    ]
    floor = [f"{s // 10 * 10:,.0f}" for s in need]
    assert (
        f"their bytes alone ({mb[0]} and {mb[1]} MB a step, {steps[0]:.0f} and {steps[1]:.0f} "
        f"steps) need over {floor[0]} s and {floor[1]} s" in WORDS
    )


def test_the_goals_table_is_the_sweeps():
    """The goals table of the local-steps sweep (``sweep-local``): every row's verdict from its
    figures, and the figures of the rows the leads' test of ``test_doc_figures.py`` does not
    read (the slow links against the fastest unlimited time, the steps, the bytes)."""
    points = _points("sweep-local")
    _, *rows = markdown_rows(PAGE, "| goal | measured | |")
    assert len(rows) == 5
    slow = [
        points[link]["terngrad_sooner_than_pytorch"] for link in ("100mbit", "25mbit", "10mbit")
    ]
    fast = [points[link]["terngrad_sooner_than_pytorch"] for link in ("unlimited", "1gbit")]
    assert rows[0][2] == ("met" if min(slow) >= 1.3 else "not met")
    assert rows[1][2] == ("met (sooner)" if min(fast) > 1 else "met" if min(fast) >= 1 / 1.05
                          else "not met")  # fmt: skip

    unlimited = _json(ACCURACY / "sweep-local" / "sweep.json")["fastest_on_fastest_link"]["seconds"]
    over = {
        link: points[link]["terngrad_over_fastest_on_fastest_link"] for link in ("25mbit", "10mbit")
    }
    best = {link: points[link]["fastest_terngrad"]["seconds"] for link in over}
    local25 = _methods("sweep-local", "10mbit")["terngrad-ef-local25"]["reached"]["train_seconds"]
    assert rows[2][0].endswith(f"of the fastest method's unlimited time ({unlimited:.0f} s)")
    assert rows[2][1] == (
        f"{over['25mbit']:.2f}× ({best['25mbit']:.0f} s), {over['10mbit']:.2f}× "
        f"({best['10mbit']:.0f} s; local25 {local25 / unlimited:.2f}×)"
    )
    met = [link for link in ("25mbit", "10mbit") if over[link] <= 1.15]
    assert rows[2][2] == {("25mbit",): "met at 25, not at 10", ("25mbit", "10mbit"): "met"}.get(
        tuple(met), "not met"
    )

    step = _methods("sweep-local", "25mbit")["terngrad-ef-local25"]["reached"]["step"]
    fp32 = _methods("sweep-local", "unlimited")["fp32"]["reached"]["step"]
    assert rows[3][1:] == [f"{step / fp32:.2f}×", "met" if step / fp32 <= 1.1 else "not met"]

    fast_link = _methods("sweep-local", "unlimited")
    wire, counted = (
        fast_link["fp32-sharded-local25"][key] / fast_link["terngrad-ef-local25"][key]
        for key in ("wire_bytes_per_step", "hook_bytes_per_step")
    )
    assert rows[4][1].startswith(f"{wire:.1f}× on the wire ({counted:.1f}× counted;")
    assert rows[4][2] == ("met" if wire >= 16 else "not met")


def test_the_caveats_are_the_sweeps():
    """``localauto`` chose H = 25 in all six runs at 25 and 10 Mbit/s (the bytes it had sent at
    every evaluation are ``terngrad-ef-local25``'s, one exchange each 25 steps); the 1 Gbit/s
    spread of local25; the overlap form's steps against the plain form's and the exchange's
    wire bytes a step, from ``sweep-local``."""
    chosen = []
    for link in ("25mbit", "10mbit"):
        runs = _json(ACCURACY / "sweep-local" / link / "results.json")["runs"]
        plain = {r["seed"]: r for r in runs if r["method"] == "terngrad-ef-local25"}
        for run in (r for r in runs if r["method"] == "terngrad-ef-localauto"):
            mine = {p["step"]: p["bytes_sent"] for p in run["curve"]}
            theirs = {p["step"]: p["bytes_sent"] for p in plain[run["seed"]]["curve"]}
            chosen.append(round(25 * theirs[25] / mine[25]))
            assert all(mine[s] == theirs[s] for s in mine if s in theirs)
    assert len(set(chosen)) == 1
    words = {6: "six"}[len(chosen)]
    assert f"`localauto` chose H = {chosen[0]} in all {words} runs" in WORDS

    gbit = _methods("sweep-local", "1gbit")["terngrad-ef-local25"]
    assert f"1 Gbit/s local25 spread (± {gbit['seconds_to_target_sd']:.0f} s)" in WORDS
    slow = _methods("sweep-local", "25mbit")
    overlap, plain = slow["terngrad-ef-local25-overlap"], slow["terngrad-ef-local25"]
    assert (
        f"costs {overlap['reached']['step']:.0f} ± {overlap['steps_to_target_sd']:.0f} inner steps "
        f"instead of {plain['reached']['step']:.0f} ± {plain['steps_to_target_sd']:.0f}" in WORDS
    )
    assert f"(an exchange of {plain['wire_bytes_per_step'] / 1e6:.2f} MB a step" in WORDS


def test_when_to_pick_what_on_lenet_is_the_sweeps():
    """The section 'When to pick what' on LeNet: ``terngrad-local25`` against PowerSGD rank 4 at 100
    Mbit/s, its steps against fp32's and its tuned rates (``lenet-tuned``); ternary against fp32
    outer gradients on the slow links (``sweep-local``); the H that ``--local-steps auto`` chose on
    the faster links and how those runs ended (its runs' ``summary.json`` in ``lenet-tuned``)."""
    tuned = _points("lenet-tuned")
    at100 = tuned["100mbit"]["methods"]
    lead = (
        at100["powersgd-r4"]["seconds_to_target"] / at100["terngrad-local25"]["seconds_to_target"]
    )
    assert f"({lead:.2f}× sooner than PowerSGD rank 4 at 100 Mbit/s," in WORDS
    local25, fp32 = (tuned["unlimited"]["methods"][n] for n in ("terngrad-local25", "fp32"))
    assert local25["steps_to_target_sd"] == 0
    assert (
        f"in about fp32's steps ({local25['steps_to_target']:.0f} against "
        f"{fp32['steps_to_target']:.0f} ± {fp32['steps_to_target_sd']:.0f};" in WORDS
    )
    rates = {(m["lr"], m["outer_lr"]) for p in tuned.values() for n, m in p["methods"].items()
             if n == "terngrad-local25"}  # fmt: skip
    ((lr, outer),) = rates
    assert f"Tune its rate and outer rate: {lr:g} and {outer:g} for LeNet." in WORDS

    def seconds(link: str) -> list[str]:
        methods = _methods("sweep-local", link)
        return [f"{methods[n]['reached']['train_seconds']:.0f} s"
                for n in ("terngrad-ef-local25", "fp32-sharded-local25")]  # fmt: skip

    at25, at10 = seconds("25mbit"), seconds("10mbit")
    assert (
        f"ternary outer gradients over fp32 ones: {at25[0]} against {at25[1]} at 25 Mbit/s, "
        f"{at10[0]} against {at10[1]} at 10 Mbit/s" in WORDS
    )

    def auto(link: str) -> list[tuple[int, bool]]:
        """Per run: the H chosen, and whether the run diverged (never reached the target, its
        final loss above the untrained model's, ln 10)."""
        found = []
        for run in sorted((ACCURACY / "lenet-tuned" / link).glob("terngrad-localauto-s*")):
            summary = _json(run / "summary.json")
            diverged = summary["best_accuracy"] < 0.98 and summary["loss"] > math.log(10)
            found.append((summary["local_steps"], diverged))
        return found

    assert {h for h, _ in auto("unlimited")} == {25}
    gbit, mbit = auto("1gbit"), auto("100mbit")
    five = [[d for h, d in runs if h == 5] for runs in (gbit, mbit)]
    assert all(all(d) for d in five)  # every run that chose H = 5 diverged
    assert (
        f"it chose H = 5 in all {len(gbit)} runs at 1 Gbit/s and in {len(five[1])} of "
        f"{len(mbit)} at 100 Mbit/s, and those runs diverged" in WORDS
    )
    assert len(five[0]) == len(gbit)


def test_when_to_pick_what_on_the_gpt_is_its_runs():
    """The section 'When to pick what' on the GPT: plain error feedback's gap, DiLoCo's range of
    gaps to DDP over its fp32 and ternary runs without error feedback (``transformer-local``), and
    the GPT race's leads over fp16 at 25 and 100 Mbit/s (``accuracy/gpt-race``, 3 seeds)."""
    ddp = statistics.fmean(_ddp())

    def gap(folder: str, seeds: int) -> float:
        runs = [f"{folder}-s{s}" for s in range(seeds)] if seeds > 1 else [folder]
        return 100 * (statistics.fmean(_loss(LOCAL / r) for r in runs) / ddp - 1)

    assert (
        f"on the GPT plain error feedback stalled the loss at {gap('terngrad-ef-local25', 2):+.0f}%"
        in WORDS
    )
    gaps = [gap("fp32-sharded-local25", 2), gap("terngrad-local25", 2),
            gap("fp32-sharded-local10", 1), gap("terngrad-local10", 2)]  # fmt: skip
    assert (
        f"DiLoCo itself ends {min(gaps):.0f}–{max(gaps):.0f}% above DDP's loss, in fp32 as in "
        "ternary" in WORDS
    )

    def race(link: str) -> dict[str, float]:
        folder = ACCURACY / "gpt-race" / link
        if (folder / "three-seeds").is_dir():
            folder = folder / "three-seeds"
        found = _json(folder / "results.json")["methods"]
        return {m["method"]: m["reached"]["train_seconds"] for m in found if len(m["seeds"]) == 3}

    method = "terngrad-b512-last-min0-ef-localvar100"
    leads = [race(link)["fp16"] / race(link)[method] for link in ("25mbit", "100mbit")]
    assert (
        f"reaches fp32's loss + 1% {leads[0]:.2f}× sooner than the fp16 hook (3 seeds; "
        f"{leads[1]:.2f}× at 100 Mbit/s)" in WORDS
    )


# --------------------------------------------------------------------------- the GPT


def test_the_gpt_tables_other_cells_are_its_runs():
    """The cells of the GPT's local-steps table that ``test_doc_tables.py`` leaves: every row's
    bytes against fp32 DDP's (``transformer-small/results.md``), the bytes of the rows counted
    on the wire (thousands) and the ``fit_scale`` run's, stopped at step 800 (its
    ``metrics.jsonl``); and the model's size, as DDP's bytes imply it."""
    _, *rows = markdown_rows(PAGE, "| method | seeds | final val loss | vs fp32 DDP")
    ddp = _ddp_bytes()
    numel = ddp / (2 * 3 / 4 * 4)  # DDP's ring all-reduce of fp32 gradients on 4 ranks
    assert f"gpt-small ({numel / 1e3:.0f}k parameters), 4 ranks" in WORDS
    for row in rows:
        sent = float(row[4].removesuffix(" (wire)").replace(",", ""))
        assert row[5] == f"{ddp / sent:.0f}×", row[0]
    by = {row[0].split(" ")[0]: row for row in rows}
    for name in ("fp32-sharded-local10", "terngrad-ef-local10"):
        wire = _json(LOCAL / name / "summary.json")["wire_bytes_per_step"]
        assert by[name][4] == f"{round(wire, -3):,.0f} (wire)", name
    fit = LOCAL / "terngrad-ef-fit-local25-s0"
    last = json.loads((fit / "metrics.jsonl").read_text().splitlines()[-1])
    assert (fit / "STOPPED.txt").exists()
    assert by["terngrad-ef-fit-local25"][2:5] == [
        f"{last['loss']:.4f} at step {last['step']} (stopped)",
        "",
        f"{last['bytes_sent'] / last['step']:,.0f}",
    ]


def test_the_error_feedback_paragraph_is_its_runs():
    """The section 'Error feedback on the outer gradients': ternary against fp32 outer gradients at
    H = 25 (bytes, 2-seed losses, each seed's), the ``fit_scale`` run and plain error feedback at
    step 800 (``transformer-local``); the Trainer's GPT-2 at H = 16, seed 0 (``trainer-defaults``);
    LeNet with and without error feedback in its rate tuning
    (``accuracy/lenet-tuned/tuning/tuning.md``)."""
    tern = [_json(LOCAL / f"terngrad-local25-s{s}" / "summary.json") for s in range(2)]
    fp32 = [_json(LOCAL / f"fp32-sharded-local25-s{s}" / "summary.json") for s in range(2)]
    fewer = fp32[0]["bytes_sent_per_step"] / tern[0]["bytes_sent_per_step"]
    t, f = [r["loss"] for r in tern], [r["loss"] for r in fp32]
    assert (
        f"at {fewer:.1f}× fewer bytes: {spread(t, 4)} against {spread(f, 4)} over the same 2 "
        f"seeds ({_pct(100 * (statistics.fmean(t) / statistics.fmean(f) - 1))}; seed 0: "
        f"{t[0]:.4f} against {f[0]:.4f}, seed 1: {t[1]:.4f} against {f[1]:.4f})" in WORDS
    )
    fit, plain = (
        _curve(LOCAL / f"{n}-s0") for n in ("terngrad-ef-fit-local25", "terngrad-ef-local25")
    )
    assert f"{fit[800]:.2f} at step 800, behind plain error feedback ({plain[800]:.2f})" in WORDS

    trainer = RESULTS / "trainer-defaults"

    def gpt2(setting: str) -> str:
        return f"{_json(trainer / f'gpt2-{setting}-s0.json')['eval_loss']:.4f}"

    assert (
        f"(integrations.md: H = 16, no error feedback {gpt2('local16-noef')}, plain "
        f"{gpt2('local16')}, fitted {gpt2('local16-fit')}, DDP {gpt2('ddp')}, seed 0)" in WORDS
    )

    tuning = (ACCURACY / "lenet-tuned" / "tuning" / "tuning.md").read_text()
    header, *rows = markdown_rows(tuning, "| method |")
    by = {row[0]: row for row in rows}
    column = header.index("lr 0.05")
    without, with_ = (by[f"{n}, outer lr 0.5"][column].strip("*")
                      for n in ("terngrad-local25", "terngrad-ef-local25"))  # fmt: skip
    assert (
        "steps to 98% in its rate tuning, lr 0.05 and outer lr 0.5, one seed: "
        f"{without} without, {with_} with" in WORDS
    )


def test_what_is_left_is_diloco_itself():
    """The section 'DiLoCo itself is what is left': fp32 outer gradients' gaps to DDP at H = 10 and
    25, plain averaging against Nesterov's on seed 0, ternary against fp32 outer gradients' bytes
    (``transformer-local``), and ``terngrad-localvar-all`` against fp32 (``transformer-small``, 3
    seeds each)."""
    ddp = statistics.fmean(_ddp())
    h25 = [f"fp32-sharded-local25-s{s}" for s in range(2)]
    gaps = [100 * (statistics.fmean(_loss(LOCAL / r) for r in runs) / ddp - 1)
            for runs in (["fp32-sharded-local10"], h25)]  # fmt: skip
    assert (
        f"fp32 outer gradients end {min(gaps):.0f}–{max(gaps):.0f}% above DDP on this protocol"
        in WORDS
    )
    avg, nesterov = _loss(LOCAL / "terngrad-local25-avg-s0"), _loss(LOCAL / "terngrad-local25-s0")
    assert f"ends further away, {avg:.4f} against {nesterov:.4f} on seed 0" in WORDS
    small = RESULTS / "transformer-small"
    every = [_json(small / f"terngrad-localvar-all-s{s}" / "summary.json") for s in range(3)]
    below = 100 * (1 - statistics.fmean(r["loss"] for r in every) / ddp)
    fewer = _ddp_bytes() / every[0]["bytes_sent_per_step"]
    assert f"ends {below:.1f}% *below* fp32 at {fewer:.1f}×" in WORDS
    tern, fp32 = (_json(LOCAL / f"{n}-s0" / "summary.json")["bytes_sent_per_step"]
                  for n in ("terngrad-local25", "fp32-sharded-local25"))  # fmt: skip
    assert f"Ternary outer gradients send {fp32 / tern:.1f}× fewer bytes than fp32 ones" in WORDS


def test_the_learning_rate_table_and_its_reading_are_the_runs():
    """The section 'The learning rates: not what is left': every cell of the table (seed 0's final
    losses of DDP and of ``terngrad-local25`` by inner lr, and the gaps; DDP at 8e-3 not run), then
    the paragraph's figures: the outer lr 1.0 run, ``terngrad-local10`` (2 seeds) and the H the
    goal's 100× would need, one outer step's bytes against DDP's a step."""
    rates = ("1e-3", "2e-3", "4e-3", "8e-3")

    def ddp(lr: str) -> float | None:
        folder = (
            RESULTS / "transformer-small" / "fp32-s0" if lr == "1e-3" else LOCAL / f"fp32-lr{lr}-s0"
        )
        return _loss(folder) if folder.is_dir() else None

    def local(lr: str) -> float:
        return _loss(
            LOCAL / ("terngrad-local25-s0" if lr == "1e-3" else f"terngrad-local25-lr{lr}-s0")
        )

    header, *rows = markdown_rows(PAGE, "| inner lr (AdamW, both) |")
    assert header[1:] == ["1e-3 (the protocol's)", *rates[1:]]
    assert rows[0] == ["fp32 DDP", *(f"{d:.4f}" if (d := ddp(lr)) else "" for lr in rates)]
    assert rows[1] == ["terngrad-local25", *(f"{local(lr):.4f}" for lr in rates)]
    ran = [lr for lr in rates if ddp(lr)]
    gaps = {lr: 100 * (local(lr) / ddp(lr if lr in ran else ran[-1]) - 1) for lr in rates}
    assert rows[2] == [
        "DiLoCo above DDP at the same lr",
        *(f"{gaps[lr]:+.1f}%" + ("" if lr in ran else f" (vs {ran[-1]}'s DDP)") for lr in rates),
    ]

    assert f"lowers DiLoCo's loss ({local('1e-3'):.3f} to {local('8e-3'):.3f} at 8×)" in WORDS
    assert (
        f"DDP at 4e-3 ends {100 * (1 - ddp('4e-3') / ddp('1e-3')):.1f}% below its own 1e-3 loss"
        in WORDS
    )
    assert f"stays at {min(gaps.values()):.0f}–{max(gaps.values()):.0f}% whatever the lr" in WORDS
    seeds = [_loss(LOCAL / f"terngrad-local25-s{s}") for s in range(2)]
    assert (
        f"ends at {_loss(LOCAL / 'terngrad-local25-olr1-s0'):.4f} against {seeds[0]:.4f}, inside "
        f"the seeds' spread (± {statistics.stdev(seeds):.3f})" in WORDS
    )
    h10 = [_json(LOCAL / f"terngrad-local10-s{s}" / "summary.json") for s in range(2)]
    losses = [r["loss"] for r in h10]
    fp32_h10 = _loss(LOCAL / "fp32-sharded-local10")
    assert losses[0] < fp32_h10
    assert (
        f"`terngrad-local10` ends at {spread(losses, 4)} "
        f"({100 * (statistics.fmean(losses) / statistics.fmean(_ddp()) - 1):+.1f}%, 2 seeds; on "
        f"seed 0 ternary without error feedback ends *below* fp32's {fp32_h10:.4f} at H = 10), at "
        f"{_ddp_bytes() / h10[0]['bytes_sent_per_step']:.0f}× fewer bytes than DDP" in WORDS
    )
    outer = _json(LOCAL / "terngrad-local25-s0" / "summary.json")["bytes_sent_per_step"] * 25
    needed = math.ceil(100 * outer / _ddp_bytes())
    assert (
        f"(H = {needed} would be needed: {outer / 1e3:.0f} KB per outer step against DDP's "
        f"{_ddp_bytes() / 1e6:.2f} MB a step)" in WORDS
    )


def test_the_one_worker_reading_is_its_runs():
    """The section 'One worker': the default's gaps to AdamW alone, short and long; plain averaging
    equal to AdamW alone to the seventh digit; outer momentum 0.5's gaps; lr 0.5 with momentum 0.5
    on the long run, from ``one-worker``'s summaries."""
    runs = RESULTS / "one-worker"

    def loss(name: str, steps: int) -> float:
        return _loss(runs / f"{name}-{steps}")

    def gap(name: str, steps: int) -> str:
        return _pct(100 * (loss(name, steps) / loss("fp32", steps) - 1), 2)

    default = "fp32-sharded-local25"
    assert (
        f"({gap(default, 300)} in the short run, {gap(default, 1000)} in the long one; the goal: "
        "at most +0.5%)" in WORDS
    )
    assert all(f"{loss('fp32-sharded-local25-olr1-om0', s):.6f}" == f"{loss('fp32', s):.6f}"
               for s in (300, 1000))  # fmt: skip
    assert "(1.0, 0) is AdamW alone to the seventh digit" in WORDS
    om = "fp32-sharded-local25-om0.5"
    assert f"*below* AdamW alone in both runs ({gap(om, 300)}, {gap(om, 1000)})" in WORDS
    both = "fp32-sharded-local25-olr0.5-om0.5"
    assert f"ends above it in the long run ({gap(both, 1000)})" in WORDS


# --------------------------------------------------------------------------- the Trainer


def test_the_trainers_local_steps_are_its_records():
    """The section 'In the Trainer and Lightning': H = 16 with the default method and with TernGrad
    per tensor on GPT-2 (bytes against DDP's, gap to DDP's 3-seed mean), and every local-steps
    setting's gap on BERT, from ``trainer-defaults``."""
    folder = RESULTS / "trainer-defaults"

    def records(model: str, setting: str) -> list[dict]:
        return [_json(p) for p in sorted(folder.glob(f"{model}-{setting}-s*.json"))]

    def gap(model: str, setting: str) -> float:
        ddp = statistics.fmean(r["eval_loss"] for r in records(model, "ddp"))
        return 100 * (statistics.fmean(r["eval_loss"] for r in records(model, setting)) / ddp - 1)

    default = records("gpt2", "local16-noef-last-qsgd5-b64")
    tern = records("gpt2", "local16-noef")
    bert = [
        gap("bert", p.name[5:].rsplit("-s", 1)[0]) for p in folder.glob("bert-local16*-s0.json")
    ]
    assert len(default) == 1 and len(tern) == 3
    assert round(min(bert)) == round(max(bert))
    assert (
        f"H = 16 sent {default[0]['compression']:.0f}× fewer bytes than DDP with the default "
        f"method and ended {gap('gpt2', 'local16-noef-last-qsgd5-b64'):+.2f}% above its eval "
        f"loss on an untuned GPT-2 (seed 0; TernGrad per tensor {tern[0]['compression']:.0f}×, "
        f"{gap('gpt2', 'local16-noef'):+.2f}% over 3 seeds), but {round(min(bert))}% above it on "
        "a BERT-style masked language model" in WORDS
    )


def test_the_nodes_table_and_its_prose_are_the_runs():
    """local-steps.md's runs across nodes (``docs/results/nodes/``): steps to 98%, final
    accuracy, the exchange's bytes a step per rank and the outer step's bytes inside a node,
    per form, every cell; the prose's sums of them."""
    root = RESULTS / "nodes"
    _, *rows = markdown_rows(PAGE, "**Measured, in steps**")
    assert len(rows) == 2
    means = {}
    for row, layout in zip(rows, ("flat", "nodes"), strict=True):
        runs = [json.loads((root / f"terngrad-local25-olr0.5-{layout}-s{i}" / "summary.json")
                           .read_text()) for i in range(3)]  # fmt: skip
        assert f"`{runs[0]['method']}`" in row[0]
        assert row[2] == ", ".join(str(r["steps"]) for r in runs)
        assert all(r["stopped_at_target"] for r in runs)
        assert row[3] == ", ".join(f"{100 * r['accuracy']:.2f}%" for r in runs)
        sent = statistics.mean(r["bytes_sent_per_step"] for r in runs)
        assert row[4] == f"{sent:,.0f}"
        inside = [r.get("node_bytes_sent_per_rank") for r in runs]
        cell = "—" if layout == "flat" else (
            f"{statistics.mean(b / r['steps'] for b, r in zip(inside, runs, strict=True)):,.0f}"
        )  # fmt: skip
        assert row[5] == cell
        means[layout] = (sent, cell)
    assert (
        f"the two ranks of a node together {2 * means['nodes'][0]:,.0f} bytes a step into one "
        f"exchange of 2 replicas across the nodes, where each of four ranks hands "
        f"{means['flat'][0]:,.0f}" in WORDS
    )
    assert f"broadcasts add {means['nodes'][1]} bytes a step per rank" in WORDS
