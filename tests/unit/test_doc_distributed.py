"""The measured figures of docs/distributed.md that ``test_doc_figures.py`` leaves unchecked
(it reads the MLP's 11.7× and its parameter count), each read where the page states it (a
table cell, or the words around it with white space normalised) and made again with the page's
rounding: from the committed result files under ``docs/results/`` (the GPTs' runs in
``transformer/``, ``transformer-small/`` and ``transformer-local/``, the Trainer's in
``trainer-defaults/``), and for bytes from the traffic model, which
``tests/distributed/test_traffic_model.py`` holds to the hook's own counters. A figure that
drifts from its source, or a source that changes under a figure, fails here."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

from support import markdown_rows

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs" / "distributed.md").read_text()
#: the page's words with every run of white space one space (a figure may wrap)
WORDS = " ".join(PAGE.split())
RESULTS = ROOT / "docs" / "results"
SMALL = RESULTS / "transformer-small"


def _json(path: Path) -> dict:
    return json.loads(path.read_text())


def _losses(method: str, seeds: int = 3) -> list[float]:
    """gpt-small's final validation losses of ``method``, seed by seed."""
    return [_json(SMALL / f"{method}-s{s}" / "summary.json")["loss"] for s in range(seeds)]


def _gap(losses: list[float], against: list[float]) -> float:
    """The mean of ``losses`` over the mean of ``against``, minus one, in percent."""
    return 100 * (statistics.fmean(losses) / statistics.fmean(against) - 1)


def test_the_first_steps_framing_is_the_traffic_models():
    """DDP's first step in its initial buckets sends a few bytes fewer than the later ones:
    LeNet on 2 ranks, from the traffic model (its first step and a steady one)."""
    from terngrad.bench.profile import profile_model
    from terngrad.bench.traffic_model import transfers

    lenet = profile_model("lenet")
    steady, first = (
        sum(t.ranks[0].sent for t in transfers(lenet, "terngrad", 2, step=step))
        for step in (None, 1)
    )
    assert f"({steady - first} bytes fewer on LeNet at 2 ranks)" in WORDS


def test_the_topologies_bytes_are_the_traffic_models():
    """The measured table's second row: rank 0 of ``ps`` (the server) and of ``allgather``
    against PyTorch's fp32 ring all-reduce, ``examples/ddp_terngrad.py``'s MLP on 4 ranks."""
    import torch
    from torch import nn

    from terngrad.bench.profile import profile
    from terngrad.bench.traffic_model import transfers
    from terngrad.comm import ring_bytes

    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                        nn.Linear(256, 10))  # fmt: skip
    prof = profile(mlp, (784,))
    fp32 = ring_bytes(4 * prof.numel, 4)
    fewer = [
        fp32 / sum(t.ranks[0].sent * t.weight for t in transfers(prof, method, 4))
        for method in ("terngrad-ps", "terngrad-allgather")
    ]
    row = next(line for line in PAGE.splitlines() if line.startswith("| same, `ps`"))
    assert f"| {fewer[0]:.1f}× / {fewer[1]:.1f}× fewer at rank 0 |" in row


def test_the_gpts_per_step_figures_are_its_runs():
    """``terngrad-b512`` on the 3.3M-parameter GPT, 250 steps (``transformer/results.json``):
    its loss gap to fp32 and its bytes, in the methods table and the AdamW section's opening;
    ``FrozenVarianceAdamW`` on gpt-small, 3 seeds against fp32's 3 (``transformer-small``), and
    its frozen denominator as ``results/transformer.md`` measured it."""
    runs = {r["method"]: r for r in _json(RESULTS / "transformer" / "results.json")["runs"]}
    b512, fp32 = runs["terngrad-b512"], runs["fp32"]
    gap = 100 * (b512["loss"] / fp32["loss"] - 1)
    fewer = fp32["bytes_per_step"] / b512["bytes_per_step"]
    assert (
        f"250 steps: validation loss {gap:.1f}% above fp32's after 250 steps, {fewer:.1f}× fewer "
        "bytes" in WORDS
    )
    assert f"here: TernGrad + AdamW ends {gap:+.1f}% in loss on the GPT" in WORDS
    frozen = _gap(_losses("terngrad-momentum"), _losses("fp32"))
    assert f"1,000 steps, 3 seeds): {frozen:+.0f}% in loss against fp32 AdamW" in WORDS
    assert f"*Frozen after a warm-up* (the section above): {frozen:+.0f}%." in WORDS
    told = " ".join((RESULTS / "transformer.md").read_text().split())
    assert "the variance it freezes is about ten times too large" in told
    assert "Its frozen `d` was about ten times AdamW's own at the end" in WORDS


def test_the_local_variance_derivation_is_its_runs():
    """How ``LocalVarianceAdamW`` was derived: the uncorrected variance against fp32's seed 0
    and plain AdamW over TernGrad (3 seeds); the one-process simulation at step 200 (its figures
    as ``results/transformer.md`` gives them) against the distributed run's gap then (the runs'
    ``metrics.jsonl``); the corrected optimizer over 3 seeds, its bytes, and its seed 0 against
    the same optimizer uncompressed (``transformer-small``)."""
    fp32 = _losses("fp32")
    uncorrected = _losses("localvar-uncorrected", 1)
    plain = _gap(_losses("terngrad-b512"), fp32)
    assert (
        f"`d = sqrt(mean_i v_i)`: {_gap(uncorrected, fp32[:1]):+.1f}% against fp32's seed 0 (one "
        f"seed; plain AdamW over TernGrad's gradient: {plain:+.1f}% over 3 seeds)" in WORDS
    )

    told = " ".join((RESULTS / "transformer.md").read_text().split())
    found = re.search(r"at step 200, AdamW ([\d.]+) bits/char, the ranks' mean of their own "
                      r"squares ([\d.]+) .*? M\^2` ([\d.]+)", told)  # fmt: skip
    adamw, own, corrected = (float(x) for x in found.groups())

    def at_200(run: str) -> float:
        lines = (SMALL / run / "metrics.jsonl").read_text().splitlines()
        return next(r["loss"] for r in map(json.loads, lines) if r.get("step") == 200)

    distributed = 100 * (at_200("localvar-uncorrected-s0") / at_200("fp32-s0") - 1)
    assert (
        f"gave the same gap ({100 * (own / adamw - 1):+.1f}% at step 200, where the distributed "
        f"run was {distributed:+.1f}%)" in WORDS
    )
    assert f"Simulated: {100 * (corrected / adamw - 1):+.1f}% against AdamW at step 200." in WORDS

    local = [_json(SMALL / f"terngrad-localvar-s{s}" / "summary.json") for s in range(3)]
    below = -_gap([r["loss"] for r in local], fp32)
    header, *rows = markdown_rows((SMALL / "results.md").read_text(), "| method | seeds |")
    fp32_row = next(row for row in rows if row[0] == "fp32")
    fp32_bytes = float(fp32_row[header.index("bytes / step / rank (whole run)")].replace(",", ""))
    fewer = fp32_bytes / local[0]["bytes_sent_per_step"]
    exact = _json(SMALL / "fp32-localvar-s0" / "summary.json")["loss"]
    cost = 100 * (local[0]["loss"] / exact - 1)
    assert (
        f"3 seeds: {below:.1f}% *below* fp32 AdamW at {fewer:.1f}× fewer bytes, and {cost:.1f}% "
        "above the same optimizer uncompressed" in WORDS
    )


def test_fit_scale_in_training_is_its_runs():
    """What ``fit_scale`` does to training: the Trainer's GPT-2 per step and with H = 16, seed 0
    against DDP's seed 0 (``trainer-defaults``); the project's GPT with DiLoCo at H = 25, seed 0,
    final losses and, where the fitted run was stopped, the losses at its last evaluation
    (``transformer-local``)."""
    folder = RESULTS / "trainer-defaults"

    def loss(setting: str) -> float:
        return _json(folder / f"gpt2-{setting}-s0.json")["eval_loss"]

    ddp = loss("ddp")

    def said(setting: str, gap: bool = True) -> str:
        return f"{loss(setting):.4f}" + (
            f" ({100 * (loss(setting) / ddp - 1):+.1f}%)" if gap else ""
        )

    assert (
        f"seed 0, eval loss against DDP's {ddp:.4f}): per-step hook without error feedback "
        f"{said('hook')}, with plain error feedback {said('hook-ef')}, with `fit_scale` "
        f"{said('hook-ef-fit')}; local steps H = 16: without {said('local16-noef', False)}, plain "
        f"{said('local16', False)}, fitted {said('local16-fit')}." in WORDS
    )

    local = RESULTS / "transformer-local"

    def curve(run: str) -> dict[int, float]:
        lines = (local / run / "metrics.jsonl").read_text().splitlines()
        return {r["step"]: r["loss"] for r in map(json.loads, lines) if "loss" in r}

    runs = ("terngrad-local25-s0", "fp32-sharded-local25-s0", "terngrad-ef-local25-s0")
    final = {run: _json(local / run / "summary.json")["loss"] for run in runs}
    fitted = curve("terngrad-ef-fit-local25-s0")
    stop = max(fitted)
    assert (local / "terngrad-ef-fit-local25-s0" / "STOPPED.txt").exists()
    assert (
        f"without error feedback {final['terngrad-local25-s0']:.4f} (fp32 outer gradients: "
        f"{final['fp32-sharded-local25-s0']:.4f}), plain {final['terngrad-ef-local25-s0']:.4f}, "
        f"fitted {fitted[stop]:.3f} at step {stop} (plain "
        f"{curve('terngrad-ef-local25-s0')[stop]:.3f}, without "
        f"{curve('terngrad-local25-s0')[stop]:.3f}; stopped there)" in WORDS
    )
