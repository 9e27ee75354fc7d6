"""``terngrad bench overhead``: the summary of the ranks' clocks (slowest rank, median over
steps, mean over ranks; the glue is what the parts leave of the hook thread's time)."""

import pytest

from terngrad.bench import overhead


def _rank(step, parts, exposed):
    return [{"step": s, "parts": parts, "calls": {p: 1 for p in parts},
             "bytes": {"all_to_all": 1000}, "exposed": exposed} for s in step]  # fmt: skip


def test_the_summary_takes_the_slowest_rank_and_leaves_the_glue():
    parts = {"grid_pack": 0.002, "all_to_all": 0.003, "hook thread": 0.010, "hand-off": 0.004}
    raw = [
        {"compute": [{"step": 0.05}, {"step": 0.06}, {"step": 0.05}],
         "fp32": [{"step": 0.07}] * 3,
         "terngrad": _rank([0.09, 0.10, 0.08], parts, 0.004)},
        {"compute": [{"step": 0.06}, {"step": 0.05}, {"step": 0.07}],
         "fp32": [{"step": 0.08}] * 3,
         "terngrad": _rank([0.11, 0.09, 0.09], parts, 0.002)},
    ]  # fmt: skip
    summary = overhead.summarise(raw, {"model": "mlp", "methods": ["fp32", "terngrad"],
                                       "batch_size": 8})  # fmt: skip
    assert summary["compute_seconds"] == 0.06  # per step the slowest: 0.06, 0.06, 0.07
    tern = summary["methods"]["terngrad"]
    assert tern["step_seconds"] == 0.10  # slowest per step: 0.11, 0.10, 0.09
    assert tern["extra_seconds"] == pytest.approx(0.04)
    assert tern["exposed_seconds"] == pytest.approx(0.003)  # mean over ranks of the medians
    assert tern["parts"]["glue"] == pytest.approx(0.010 - 0.002 - 0.003)  # not hand-off
    assert tern["bytes"] == {"all_to_all": 1000}
    text = overhead.table(summary)
    assert "| terngrad | 100.0 | 1.25x | 40.0 | 10.0 | 3.0 |" in text
    assert "| grid_pack | 2.00 | 1 |  |" in text and "| glue | 5.00 | 0 |  |" in text


def test_methods_other_than_the_hooks_are_refused():
    with pytest.raises(ValueError, match="bench overhead cannot run method powersgd"):
        overhead.measure("mlp", methods=["fp32", "powersgd"])
