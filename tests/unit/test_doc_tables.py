"""Whole tables of docs/*.md checked against the committed result files they come from: each
table is read where the page states it and made again from ``docs/results/`` (a cell that
drifts from its file, or a file that changes under a cell, fails here). The figures of the
README and a few of its paragraphs: ``test_doc_figures.py``."""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path

import pytest
from support import markdown_rows

from terngrad.experiments.comparison import spread

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
RESULTS = DOCS / "results"
SWEEP = json.loads((RESULTS / "accuracy" / "lenet-tuned" / "sweep.json").read_text())


def _table(page: str, heading: str) -> list[list[str]]:
    """The rows of the first table at or after ``heading`` in ``docs/<page>``, header first."""
    return markdown_rows((DOCS / page).read_text(), heading)


# --------------------------------------------------------------------------- integrations.md


@pytest.mark.parametrize("folder", ["trainer-defaults", "zoo"])
def test_the_trainer_tables_are_the_report_of_their_records(tmp_path, folder):
    """docs/integrations.md's tables of the Trainer's settings (the first two models, then the
    zoo): line for line what the experiment's ``--report`` makes of the committed records
    (made again here, in a copy), and the folder's own ``results.md``."""
    pytest.importorskip("transformers", reason="transformers is not installed")
    from terngrad.experiments import trainer_defaults

    records = RESULTS / folder
    for record in records.glob("*-s*.json"):
        shutil.copy(record, tmp_path / record.name)
    made = trainer_defaults.report(tmp_path).strip().splitlines()
    page = (DOCS / "integrations.md").read_text().splitlines()
    start = page.index(made[-1]) - len(made) + 1  # (found by its last row: the tables share
    # their header and the first two families' DDP rows)
    assert page[start : start + len(made)] == made
    assert (records / "results.md").read_text().strip().splitlines() == made


# --------------------------------------------------------------------------- time-to-accuracy.md

#: the race table's columns, as the sweep names the methods
RACE_COLUMNS = {
    "fp32": "fp32", "fp16": "fp16", "PowerSGD r1": "powersgd-r1", "PowerSGD r2": "powersgd",
    "PowerSGD r4": "powersgd-r4", "`terngrad`": "terngrad", "`terngrad-local25`":
    "terngrad-local25", "`fp32-sharded-local25`": "fp32-sharded-local25",
    "`terngrad-localauto`": "terngrad-localauto",
}  # fmt: skip
RACE_LINKS = {"unlimited": "unlimited", "1 Gbit/s": "1gbit", "100 Mbit/s": "100mbit",
              "25 Mbit/s": "25mbit", "10 Mbit/s": "10mbit"}  # fmt: skip


def _race_cell(run: dict | None) -> str:
    """``mean ± sd`` seconds to 98% where every seed reached it, ``not reached`` where one did
    not, ``-`` where the method did not run on the link."""
    if run is None:
        return "-"
    if run["seconds_to_target"] is None or run["reached_runs"] < len(run["seeds"]):
        return "not reached"
    return f"{run['seconds_to_target']:.0f} ± {run['seconds_to_target_sd']:.0f}"


def test_the_tuned_lenet_race_table_is_the_sweeps():
    """docs/time-to-accuracy.md's race at each method's tuned rate: every cell (bold marks
    aside) and the link's communication over computation, from ``sweep.json``."""
    header, *rows = _table("time-to-accuracy.md", "| link | comm / compute | fp32 | fp16 |")
    assert header[2:] == list(RACE_COLUMNS)
    assert [row[0] for row in rows] == list(RACE_LINKS)
    for row in rows:
        point = next(p for p in SWEEP["points"] if p["bandwidth"] == RACE_LINKS[row[0]])
        ratio = point.get("communication_over_compute")
        assert row[1] == ("-" if ratio is None else f"{ratio:.2f}"), row[0]
        made = [_race_cell(point["methods"].get(m)) for m in RACE_COLUMNS.values()]
        assert [cell.strip("*") for cell in row[2:]] == made, row[0]


# --------------------------------------------------------------------------- local-steps.md

LOCAL = RESULTS / "transformer-local"
#: the GPT local-steps table's rows: their folders in transformer-local/ (``-s<seed>`` added
#: for several seeds) and the seeds
LOCAL_ROWS = {
    "fp32-sharded-local25 (DiLoCo, fp32 outer gradients)": ("fp32-sharded-local25", 2),
    "**terngrad-local25** (ternary, no error feedback: `DiLoCo`'s default)":
        ("terngrad-local25", 2),
    "terngrad-local25, `--outer-lr 1 --outer-momentum 0` (the replicas' average, local SGD)":
        ("terngrad-local25-avg-s0", 1),
    "terngrad-ef-local25 (plain error feedback)": ("terngrad-ef-local25", 2),
    "fp32-sharded-local10": ("fp32-sharded-local10", 1),
    "terngrad-ef-local10": ("terngrad-ef-local10", 1),
    "terngrad-local10 (no error feedback)": ("terngrad-local10", 2),
    "terngrad-local25, `--outer-lr 1.0` (momentum 0.9)": ("terngrad-local25-olr1-s0", 1),
}  # fmt: skip


def _summary(folder: Path) -> dict:
    return json.loads((folder / "summary.json").read_text())


def test_the_gpt_local_steps_table_is_its_runs():
    """docs/local-steps.md's GPT table: each row's final loss (mean ± sd over its seeds, and
    seed 0's), its gap to fp32 DDP's 3-seed mean (in the header too) and its bytes."""
    header, *rows = _table("local-steps.md", "| method | seeds | final val loss | vs fp32 DDP")
    ddp = [_summary(RESULTS / "transformer-small" / f"fp32-s{s}")["loss"] for s in range(3)]
    assert header[3] == f"vs fp32 DDP ({spread(ddp, 4)}, 3 seeds)"
    by_name = {row[0]: row for row in rows}
    for name, (folder, seeds) in LOCAL_ROWS.items():
        row = by_name[name]
        runs = [_summary(LOCAL / (f"{folder}-s{s}" if seeds > 1 else folder)) for s in
                range(seeds)]  # fmt: skip
        losses = [r["loss"] for r in runs]
        loss = spread(losses, 4) + (f" (seed 0: {losses[0]:.4f})" if seeds > 1 else "")
        gap = 100 * (statistics.fmean(losses) / statistics.fmean(ddp) - 1)
        assert row[1:4] == [str(seeds), loss, f"{gap:+.1f}%"], name
        sent = runs[0]["bytes_sent_per_step"]
        if sent is not None and "(wire)" not in row[4]:
            assert row[4] == f"{sent:,.0f}", name
    inner = by_name["terngrad-local25, inner `--lr 2e-3` / `4e-3` / `8e-3`"]
    assert inner[2] == " / ".join(
        f"{_summary(LOCAL / f'terngrad-local25-lr{lr}-s0')['loss']:.4f}"
        for lr in ("2e-3", "4e-3", "8e-3")
    )


def test_the_gpt_local_steps_losses_along_the_way_are_seed_0s():
    """docs/local-steps.md's validation losses at steps 200 to 1,000, seed 0's metrics."""
    header, *rows = _table("local-steps.md", "| step | 200 | 400 | 600 | 800 | 1000 |")
    steps = [int(s) for s in header[1:]]
    for row in rows:
        lines = (LOCAL / f"{row[0]}-s0" / "metrics.jsonl").read_text().splitlines()
        loss = {r["step"]: r["loss"] for r in map(json.loads, lines) if "loss" in r}
        assert row[1:] == [f"{loss[s]:.3f}" if s in loss else "" for s in steps], row[0]


def test_the_gpt_tuning_losses_are_its_points():
    """docs/time-to-accuracy.md's final losses of the GPT's tuning so far, per method at lr
    1e-3, 2e-3, 4e-3, 8e-3 (``—``: a point not yet run), from each point's summary."""
    tuning = RESULTS / "accuracy" / "gpt-tuned" / "tuning"
    words = " ".join((DOCS / "time-to-accuracy.md").read_text().split())
    named = {"fp32": "fp32", "fp16": "fp16", "`terngrad-localvar-all`":
             "terngrad-b512-last-min0-ef-localvar100", "`powersgd-r16`": "powersgd-r16",
             "`powersgd` (rank 2)": "powersgd",
             "`terngrad-local25`": "terngrad-local25"}  # fmt: skip
    points = 0
    for said, method in named.items():
        losses = []
        for lr in ("0.001", "0.002", "0.004", "0.008"):
            path = tuning / f"{method}-lr{lr}" / "summary.json"
            losses.append(f"{json.loads(path.read_text())['loss']:.4f}" if path.exists() else "—")
            points += path.exists()
        assert f"{said} {', '.join(losses)}" in words, said
    assert f"({points} of the grid's 24 points;" in words
    chosen = json.loads((tuning / "tuning.json").read_text())["methods"]
    rate = {m: v["chosen"]["lr"] for m, v in chosen.items()}
    assert [m for m in named.values() if rate[m] == 0.008] == [
        "fp32", "fp16", "terngrad-b512-last-min0-ef-localvar100", "powersgd-r16"
    ]  # fmt: skip
    assert [m for m in named.values() if rate[m] == 0.004] == ["powersgd", "terngrad-local25"]
    assert ("each races at its lowest: 8e-3 for fp32, fp16, `terngrad-localvar-all` and "
            "`powersgd-r16`, the grid's largest rate, so a larger one may be better; 4e-3 for "
            "`powersgd` and `terngrad-local25`") in words  # fmt: skip


def _sweep_point(link: str) -> dict:
    return next(p for p in SWEEP["points"] if p["bandwidth"] == link)


def test_the_tuned_races_leads_and_goals_are_the_sweeps():
    """docs/time-to-accuracy.md's leads of terngrad's fastest over PyTorch's fastest per link
    (its opening and the goals), ``terngrad-local25``'s own at 25 and 10 Mbit/s, and terngrad's
    slow-link times over the fastest unlimited one, from ``sweep.json``."""
    words = " ".join((DOCS / "time-to-accuracy.md").read_text().split())

    def lead(link: str) -> str:
        return f"{_sweep_point(link)['terngrad_sooner_than_pytorch']:.2f}×"

    def local25(link: str) -> str:
        methods = _sweep_point(link)["methods"]
        fastest = min(m["seconds_to_target"] for name, m in methods.items()
                      if name in ("fp32", "fp16", "powersgd", "powersgd-r1", "powersgd-r4")
                      and m["seconds_to_target"] is not None
                      and m["reached_runs"] == len(m["seeds"]))  # fmt: skip
        return f"{fastest / methods['terngrad-local25']['seconds_to_target']:.2f}×"

    def over(link: str) -> str:
        return f"{_sweep_point(link)['terngrad_over_fastest_on_fastest_link']:.2f}×"

    assert (f"reaches 98% {lead('100mbit')} sooner than the fastest of PyTorch's (PowerSGD rank "
            f"4) at 100 Mbit/s, `terngrad-localauto` {lead('25mbit')} at 25 and "
            f"{lead('10mbit')} at 10 (`terngrad-local25` {local25('25mbit')} and "
            f"{local25('10mbit')} there)") in words  # fmt: skip
    assert f"level ({lead('unlimited')}, {lead('1gbit')}, within the seeds' spread)" in words
    assert (f"**met** ({lead('100mbit')} at 100, {lead('25mbit')} at 25, {lead('10mbit')} at "
            "10 Mbit/s") in words  # fmt: skip
    assert f"ahead ({lead('unlimited')}, {lead('1gbit')} sooner than fp16" in words
    assert f"**met** ({over('25mbit')}, {over('10mbit')}:" in words


def _tuning_rows(folder: str) -> dict[str, list[str]]:
    """A tuning's ``tuning.md`` table by method: its cells with "(stopped)" and the bold of the
    chosen rate left out."""
    path = RESULTS / "accuracy" / folder / "tuning" / "tuning.md"
    lines = [line for line in path.read_text().splitlines() if line.startswith("| ")]
    cells = [[c.strip() for c in line.strip().strip("|").split("|")] for line in lines[1:]]
    return {row[0]: [c.replace(" (stopped)", "").strip("*") for c in row[1:]] for row in cells}


def test_the_lenet_tuning_table_is_its_tuning():
    """docs/time-to-accuracy.md's steps to 98% by learning rate: the tuning's own table (and the
    0.12 column, tried later, its own), the chosen rate in bold where the tuning bolds it."""
    header, *rows = _table("time-to-accuracy.md", "| method | 0.01 | 0.02 | 0.03 | 0.05 |")
    tuned, edge = _tuning_rows("lenet-tuned"), _tuning_rows("lenet-edge")
    named = {"fp32 (DDP)": "fp32", "fp16 (PyTorch's hook)": "fp16", "PowerSGD rank 2": "powersgd",
             "PowerSGD rank 1": "powersgd-r1", "PowerSGD rank 4": "powersgd-r4",
             "`terngrad` (per step, sharded)": "terngrad"}  # fmt: skip
    assert header[1:] == ["0.01", "0.02", "0.03", "0.05", "0.08", "0.12"]
    for row in rows:
        label = named.get(row[0]) or row[0].replace("`", "").replace("outer lr 1.0", "outer lr 1")
        cells = [c.strip("*") for c in row[1:]]
        assert cells[:5] == tuned[label], row[0]
        assert cells[5] == (edge[label][0] if label in edge else ""), row[0]


def test_the_local_steps_sweep_table_is_its_files():
    """docs/local-steps.md's seconds to 98% of the local-steps sweep (the protocol's lr), each
    cell the mean ± sd over its seeds from ``sweep-local``; blank where a method did not run on
    the link; the per-step TernGrad column the own-scales fused exchange where it ran."""
    sweep = json.loads((RESULTS / "accuracy" / "sweep-local" / "sweep.json").read_text())
    points = {p["bandwidth"]: p["methods"] for p in sweep["points"]}
    header, *rows = _table("local-steps.md", "| link | fp32 | fp16 | PowerSGD | per-step")
    columns = ["fp32", "fp16", "powersgd", None, "terngrad-ef-local25", "fp32-sharded-local25",
               "terngrad-ef-local25-overlap", "terngrad-ef-localauto"]  # fmt: skip
    assert len(header) == 1 + len(columns)
    assert [row[0] for row in rows] == list(RACE_LINKS)

    def cell(run: dict | None) -> str:
        return "" if run is None else _race_cell(run)

    for row in rows:
        methods = points[RACE_LINKS[row[0]]]
        own = methods.get("terngrad-own-scales-fused")
        step = (f"{cell(own)} (own-fused)" if own is not None
                else f"{cell(methods['terngrad'])} (sharded)")  # fmt: skip
        made = [step if m is None else cell(methods.get(m)) for m in columns]
        assert [c.strip("*") for c in row[1:]] == made, row[0]


def test_the_fsdp_table_is_its_two_runs():
    """docs/integrations.md's FSDP2 comparison: bytes, step, tokens a second and validation
    losses of the fp32 and the TernGrad reduce-scatter, and the gaps the text draws from them."""
    runs = [json.loads((RESULTS / "fsdp" / f"{name}.json").read_text())
            for name in ("fsdp", "terngrad")]  # fmt: skip
    _, *rows = _table("integrations.md", "| | FSDP2's reduce-scatter (fp32) | TernGrad's |")
    by = {row[0]: row[1:] for row in rows}
    fp32, ours = (r["reduce_scatter_bytes_per_step"] for r in runs)
    assert by["reduce-scatter bytes sent per step per rank"] == [
        f"{fp32:,.0f}",
        f"**{ours:,.0f} ({fp32 / ours:.1f}× fewer)**",
    ]
    assert by["step (mean over 200)"] == [
        f"{r['step_seconds']:.3f} s ({r['tokens_per_step'] / r['step_seconds']:,.0f} tokens/s)"
        for r in runs
    ]
    losses = [{p["step"]: p["validation_loss"] for p in r["curve"]} for r in runs]
    assert by["validation loss at step 25 / 100 / 200"] == [
        " / ".join(f"{loss[s]:.4f}" for s in (25, 100, 200)) for loss in losses
    ]
    assert by["every rank's full parameters the same"] == [
        "yes" if r["replicas_identical"] else "no" for r in runs
    ]
    gaps = {s: 100 * (losses[1][s] / losses[0][s] - 1) for s in losses[0]}
    later = [g for s, g in gaps.items() if 25 < s < 200]
    words = " ".join((DOCS / "integrations.md").read_text().split())
    assert (f"TernGrad ended **{-gaps[200]:.1f}% below** FSDP's fp32 at step 200 "
            f"({gaps[25]:.1f}% at step 25 and between {max(later):.1f}% and {min(later):.1f}% "
            "after)").replace("-", "−") in words  # fmt: skip


def test_the_lenet_lag_table_is_its_five_seeds():
    """docs/time-to-accuracy.md's lag study: steps to 98% per seed and their mean ± sd, the
    mean accuracy of the evaluations at steps 1,400 to 1,500 (mean ± sd over the seeds), and
    the paired differences from fp32, seed by seed, with their t statistics."""
    runs = json.loads((RESULTS / "accuracy" / "lag-lenet" / "results.json").read_text())["runs"]
    _, *rows = _table("time-to-accuracy.md", "| method | steps to 98% | per seed |")
    named = {"DDP fp32": "fp32", "TernGrad, clip 2.5σ (default)": "terngrad",
             "TernGrad, no clipping": "terngrad-noclip"}  # fmt: skip

    def of(method: str) -> tuple[list[float], list[float]]:
        mine = sorted((r for r in runs if r["method"] == method), key=lambda r: r["seed"])
        late = [statistics.fmean(p["accuracy"] for p in r["curve"] if 1400 <= p["step"] <= 1500)
                for r in mine]  # fmt: skip
        return [r["reached"]["step"] for r in mine], late

    def paired(ours: list[float], theirs: list[float], digits: int, scale: float = 1) -> str:
        d = [scale * (a - b) for a, b in zip(ours, theirs, strict=True)]
        mean, sd = statistics.fmean(d), statistics.stdev(d)
        t = mean / (sd / len(d) ** 0.5)
        return f"{mean:+.{digits}f} ± {sd:.{digits}f} (t = {t:.1f})".replace("-", "−")

    fp32_steps, fp32_late = of("fp32")
    for row in rows:
        steps, late = of(named[row[0]])
        cells = [c.strip("*") for c in row[1:]]
        assert cells[:3] == [
            spread(steps, 0),
            " ".join(str(s) for s in steps),
            spread(late, 2, 100) + "%",
        ], row[0]
        if named[row[0]] == "fp32":
            assert cells[3:] == ["", ""]
        else:
            assert cells[3:] == [paired(steps, fp32_steps, 0),
                                 paired(late, fp32_late, 3, 100)], row[0]  # fmt: skip


#: the LeNet sweeps' method labels, as their files name the methods
SWEEP_METHODS = {"DDP fp32": "fp32", "PyTorch fp16 hook": "fp16",
                 "PyTorch PowerSGD (rank 2)": "powersgd", "TernGrad sharded": "terngrad",
                 "TernGrad, own scales, fused": "terngrad-own-fused"}  # fmt: skip


def _sweep_row(m: dict, accuracy: bool) -> list[str]:
    """A row of a LeNet sweep's table from its method's entry of a link's ``results.json``:
    steps and seconds to 98% (mean ± sd over the seeds), how much sooner than fp32 and fp16,
    seconds a step, wire MB a step per rank and, where the table has it, final accuracy."""
    reached = m["reached"]
    row = [
        f"{reached['step']:.0f} ± {m['steps_to_target_sd']:.0f}",
        f"{reached['train_seconds']:.0f} ± {m['seconds_to_target_sd']:.0f}",
        f"{m['sooner_than_fp32']:.2f}×", f"{m['sooner_than_fp16']:.2f}×",
        f"{m['step_seconds']:.3f}", f"{m['wire_bytes_per_step'] / 1e6:.3f}",
    ]  # fmt: skip
    return row + ([f"{100 * m['final_accuracy']:.2f}%"] if accuracy else [])


@pytest.mark.parametrize(
    "folder, first_row",
    [
        ("sweep-amd", "| unlimited | DDP fp32 | 775 ± 25 | 57 ± 0 |"),
        ("sweep-amd/session-2026-12-03", "| 100 Mbit/s | DDP fp32 | 775 ± 25 | 194 ± 5 |"),
        ("sweep-lenet", "| unlimited | DDP fp32 | 758 ± 14 | 47 ± 1 |"),
    ],
)
def test_the_lenet_sweep_tables_are_their_files(folder, first_row):
    """docs/time-to-accuracy.md's LeNet sweeps at the paper's lr (the AMD Zen 4 sweep, its
    earlier session, the Intel one): every cell of every row from its link's results.json."""
    text = (DOCS / "time-to-accuracy.md").read_text()
    lines = text[text.index(first_row) :].splitlines()
    rows = []
    for line in lines:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    for row in rows:
        link = RACE_LINKS[row[0]]
        found = json.loads((RESULTS / "accuracy" / folder / link / "results.json").read_text())
        m = next(m for m in found["methods"] if m["method"] == SWEEP_METHODS[row[1].strip("*")])
        assert row[2:] == _sweep_row(m, accuracy=len(row) == 9), (link, row[1])


def test_the_zoos_ablation_words_are_its_records():
    """docs/integrations.md's reading of the ablation by class on the Llama-style model: each
    class's gap to DDP's 3-seed mean, and the default's, from the zoo's records."""
    zoo = RESULTS / "zoo"

    def gap(setting: str) -> str:
        losses = [json.loads(f.read_text())["eval_loss"] for f in zoo.glob(f"llama-{setting}-s*")]
        ddp = [json.loads(f.read_text())["eval_loss"] for f in zoo.glob("llama-ddp-s*")]
        return f"{100 * (statistics.fmean(losses) / statistics.fmean(ddp) - 1):+.2f}%"

    words = " ".join((DOCS / "integrations.md").read_text().split())
    assert (f"attention {gap('only-attn-qsgd5-b64')}, MLP {gap('only-mlp-qsgd5-b64')}, the "
            f"untied head {gap('only-head-qsgd5-b64')}, norms {gap('only-norm-qsgd5-b64')}, the "
            f"embeddings {gap('only-emb-qsgd5-b64')}; the parts add up to about the whole "
            f"({gap('default')})") in words  # fmt: skip


def test_the_one_worker_check_is_its_runs():
    """docs/local-steps.md's one-worker check: each outer step's final loss on one rank, short
    and long, and its gap to AdamW alone's, from the runs' summaries."""
    runs = RESULTS / "one-worker"
    named = {"AdamW alone (`--method fp32`, one rank)": "fp32",
             "**0.7, 0.9, Nesterov (the default)**": "fp32-sharded-local25",
             "0.7, 0.5": "fp32-sharded-local25-om0.5", "0.5, 0.9": "fp32-sharded-local25-olr0.5",
             "0.5, 0.5": "fp32-sharded-local25-olr0.5-om0.5",
             "1.0, 0 (the replica itself)": "fp32-sharded-local25-olr1-om0"}  # fmt: skip

    def loss(name: str, steps: int) -> float | None:
        path = runs / f"{name}-{steps}" / "summary.json"
        return json.loads(path.read_text())["loss"] if path.exists() else None

    _, *rows = _table("local-steps.md", "| outer lr, momentum | 300 steps |")
    assert [row[0] for row in rows] == list(named)
    for row in rows:
        cells = []
        for steps in (300, 1000):
            mine, alone = loss(named[row[0]], steps), loss("fp32", steps)
            gap = (
                ""
                if mine is None or named[row[0]] == "fp32"
                else f"{100 * (mine / alone - 1):+.2f}%"
            )
            cells += [
                "" if mine is None else f"{mine:.4f}",
                gap.replace("-0.00", "0.00").replace("+0.00", "0.00"),
            ]
        assert row[1:] == cells, row[0]
