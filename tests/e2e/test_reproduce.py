"""`terngrad reproduce orq` trained for real: a two-run smoke version (2 workers, MLP on
synthetic data, 4 steps), read back when run again."""

import json

import pytest

from terngrad.cli import main

SMOKE = ["reproduce", "orq", "--model", "mlp", "--workers", "2", "--steps", "4",
         "--methods", "fp32", "orq-5", "--variants", "clip", "--seeds", "1",
         "--no-algorithm2"]  # fmt: skip


@pytest.mark.slow  # a whole experiment: make test-slow
def test_a_two_run_smoke_reproduction(tmp_path, capsys, monkeypatch):
    out = tmp_path / "orq"
    assert main([*SMOKE, "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert [(r["method"], r["variant"]) for r in results["runs"]] == [
        ("fp32", "clip"), ("orq-5", "clip"),
    ]  # fmt: skip
    fp32, orq = results["runs"]
    assert fp32["bits_per_element"] == 32.0 and 2.6 < orq["bits_per_element"] < 2.8
    assert orq["bytes_per_step"] < fp32["bytes_per_step"] / 8  # the hook's real bytes
    assert [step for step, _ in orq["curve"]] == [1, 2, 3, 4]
    text = (out / "results.md").read_text()
    assert "| orq-5 | clip | allgather | 1 |" in text
    assert "orq-5 − fp32:" in text and "one seed" in text
    assert (out / "curves-clip.png").stat().st_size > 10_000
    printed = capsys.readouterr().out
    assert "[2/2] orq-5 clip seed 0 (allgather): final" in printed
    # run again: both runs are read back, none is trained
    from terngrad.experiments import comparison

    monkeypatch.setattr(comparison, "launch", lambda cfg: pytest.fail("retrained"))
    assert main([*SMOKE, "--out", str(out)]) == 0
    assert "(done before)" in capsys.readouterr().out
