"""``terngrad bench accuracy``: time to target, the methods' configurations, bad input refused
before anything is built, and a real 2-rank, 2-method run on the shaped testbed.

The testbed run needs root and iproute2; without them it is skipped with the reason. It uses its
own namespace prefix, so it never touches a benchmark the user may be running.
"""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from terngrad.bench import accuracy, testbed
from terngrad.cli import main
from terngrad.train import comparison, models
from terngrad.train.config import TrainConfig
from tests.test_network import WHY_NOT

PREFIX = "tgacc"


def _base(out, **changes) -> TrainConfig:
    settings = dict(
        out=str(out), model="mlp", dataset="mnist", workers=2, batch_size=64, steps=20,
        eval_every=10, progress=False, keep_checkpoints=1, timeout=120,
    )  # fmt: skip
    return TrainConfig(**{**settings, **changes})


def test_time_to_target_is_the_first_evaluation_that_reaches_it():
    curve = [
        {"step": 10, "accuracy": 0.50, "train_seconds": 1.0, "seconds": 1.5},
        {"step": 20, "accuracy": 0.81, "train_seconds": 2.0, "seconds": 3.0},
        {"step": 30, "accuracy": 0.79, "train_seconds": 3.0, "seconds": 4.5},
        {"step": 40, "accuracy": 0.90, "train_seconds": 4.0, "seconds": 6.0},
    ]
    assert accuracy.time_to_target(curve, 0.8) == {"step": 20, "train_seconds": 2.0, "seconds": 3.0}
    assert accuracy.time_to_target(curve, 0.9)["step"] == 40
    assert accuracy.time_to_target(curve, 0.95) is None


def test_every_method_gets_its_own_configuration(tmp_path):
    base = _base(tmp_path, exchange=_base(tmp_path).exchange.replace(quantize_last=True))
    plan = accuracy.AccuracyComparison(base, ("fp32", "powersgd", "terngrad-ps", "qsgd"), "1gbit",
                                       0.9)  # fmt: skip
    fp32, powersgd, ps, qsgd = (r.config for r in plan.plan())
    assert (fp32.baseline, powersgd.baseline, ps.baseline, qsgd.baseline) == (
        "fp32", "powersgd", None, None,
    )  # fmt: skip
    assert (ps.exchange.quantizer, ps.exchange.topology) == ("terngrad", "ps")
    assert (qsgd.exchange.quantizer, qsgd.exchange.quantizer_options) == ("qsgd", {"levels": 5})
    assert qsgd.out == str(tmp_path / "qsgd-5")  # the older name's method
    assert ps.exchange.quantize_last and qsgd.exchange.quantize_last  # the run's protocol
    # everything else is the same run
    assert not ps.diff(qsgd, ignore=("out", "quantizer", "quantizer_options", "topology"))


def _refused(capsys, argv, monkeypatch, tmp_path) -> str:
    built = []
    monkeypatch.setattr(testbed.Testbed, "__enter__", lambda self: built.append(self))
    out = tmp_path / "never"
    with pytest.raises(SystemExit) as exc:
        main(["bench", "accuracy", "--model", "mlp", "--workers", "2", "--out", str(out), *argv])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert not built and not out.exists()  # nothing built, nothing written
    return err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--target", "101"], "target accuracy 101% can never be reached"),
        (["--target", "0"], "can never be reached"),
        (["--target", "90", "--methods", "fp32", "nosuch"], "unknown method 'nosuch'"),
        (["--target", "90", "--methods", "fp32", "fp32"], "methods given twice: fp32"),
        (["--target", "90", "--bandwidth", "fast"], "bandwidth must be a rate"),
        (["--target", "90", "--workers", "9"], "the testbed has 2 to 8 ranks"),
    ],
)
def test_bad_input_is_one_line_and_status_2(capsys, monkeypatch, tmp_path, argv, message):
    assert message in _refused(capsys, argv, monkeypatch, tmp_path)


def test_a_bandwidth_without_root_is_refused_before_anything_is_built(
    capsys, monkeypatch, tmp_path
):
    monkeypatch.setattr(testbed.os, "geteuid", lambda: 1000)
    err = _refused(capsys, ["--target", "90"], monkeypatch, tmp_path)
    assert "--bandwidth 100mbit" in err and "needs root" in err


def test_predictions_must_come_from_the_same_setting(tmp_path):
    summary = {"ranks": 2, "bandwidth": "unlimited", "model": "lenet", "batch_size": 64,
               "compute_seconds": 0.1, "methods": []}  # fmt: skip
    path = tmp_path / "net.json"
    path.write_text(json.dumps(summary))
    plan = accuracy.AccuracyComparison(
        _base(tmp_path / "run"), ("fp32",), "100mbit", 0.5, predict_with=(str(path), str(path))
    )
    with pytest.raises(ValueError, match="same model, ranks, --batch-size and --input-shape"):
        accuracy._step_predictions(plan)
    summary.update(model="mlp", input_shape=[3, 32, 32])  # all else matches: the shape not
    path.write_text(json.dumps(summary))
    with pytest.raises(ValueError, match=r"'input_shape': \[3, 32, 32\]\}, this run trains"):
        accuracy._step_predictions(plan)


@pytest.mark.skipif(WHY_NOT is not None, reason=f"testbed: {WHY_NOT}")
def test_two_ranks_two_methods_on_the_shaped_testbed(tmp_path):
    plan = accuracy.AccuracyComparison(
        _base(tmp_path), ("fp32", "terngrad"), "100mbit", 0.3, time_limit=300, prefix=PREFIX
    )
    lines: list[str] = []
    comparison.run(plan, tmp_path, echo=lines.append)
    results = json.loads((tmp_path / "results.json").read_text())
    assert not [n for n in testbed._namespaces() if n.startswith(f"{PREFIX}-")]  # torn down
    fp32, tern = results["methods"]
    assert (fp32["method"], tern["method"]) == ("fp32", "terngrad")
    for row in (fp32, tern):
        assert [m["step"] for m in row["curve"]] == [10, 20]
        assert 0 < row["curve"][0]["train_seconds"] < row["curve"][1]["train_seconds"]
        assert row["train_seconds"] == row["curve"][-1]["train_seconds"]
    # a 2-rank ring all-reduce sends the MLP's gradients once in fp32, plus TCP/IP headers
    nbytes = 4 * sum(p.numel() for p in models.build("mlp", (1, 28, 28), 10).parameters())
    assert nbytes <= fp32["wire_bytes_per_step"] < 1.1 * nbytes
    assert fp32["hook_bytes_per_step"] is None  # PyTorch's own all-reduce: no hook counting
    assert (
        tern["hook_bytes_per_step"] <= tern["wire_bytes_per_step"] < fp32["wire_bytes_per_step"] / 5
    )
    assert any("fp32 step 10: test accuracy" in line for line in lines)  # progress on the way
    out = Path(tmp_path)
    table = (out / "results.md").read_text()
    assert "| fp32 |" in table and "| terngrad |" in table
    assert json.loads((out / "results.json").read_text())["methods"][1]["method"] == "terngrad"
    drawn = accuracy.plot(results, out / "again.png")
    assert drawn == (["fp32", "terngrad"], ["fp32", "terngrad"])  # every method, both panels
    assert (out / "time-to-accuracy.png").stat().st_size > 10_000
    # run again: every method is read back, nothing is trained twice
    lines.clear()
    comparison.run(plan, tmp_path, echo=lines.append)
    again = json.loads((tmp_path / "results.json").read_text())
    assert [r["train_seconds"] for r in again["methods"]] == [
        r["train_seconds"] for r in results["methods"]
    ]
    assert sum("(done before)" in line for line in lines) == 2
    # the report again, for another target, without training or building anything
    comparison.report_only(replace(plan, target=0.15), tmp_path)
    lower = json.loads((tmp_path / "results.json").read_text())
    assert [r["method"] for r in lower["methods"]] == ["fp32", "terngrad"]
    assert all(r["reached"] and r["reached"]["step"] == 10 for r in lower["methods"])
    assert "# Time to 15%" in (out / "results.md").read_text()
    other = replace(plan, base=replace(plan.base, lr=0.5))
    with pytest.raises(ValueError, match=r"fp32 \(DDP fp32 all-reduce\) has not finished"):
        comparison.report_only(other, tmp_path)


def test_a_report_needs_finished_runs(tmp_path):
    plan = accuracy.AccuracyComparison(_base(tmp_path), ("fp32",), "100mbit", 0.5)
    with pytest.raises(ValueError, match=r"fp32 .* has not finished in .*: train it first"):
        comparison.report_only(plan, tmp_path)
