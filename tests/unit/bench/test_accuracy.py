"""``terngrad bench accuracy``: time to target, the methods' configurations, predictions from
matching runs only, a report of finished runs only."""

import json

import pytest
from support import accuracy_base

from terngrad.bench import accuracy
from terngrad.train import comparison


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
    base = accuracy_base(
        tmp_path, exchange=accuracy_base(tmp_path).exchange.replace(quantize_last=True)
    )
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


def test_predictions_must_come_from_the_same_setting(tmp_path):
    summary = {"ranks": 2, "bandwidth": "unlimited", "model": "lenet", "batch_size": 64,
               "compute_seconds": 0.1, "methods": []}  # fmt: skip
    path = tmp_path / "net.json"
    path.write_text(json.dumps(summary))
    plan = accuracy.AccuracyComparison(
        accuracy_base(tmp_path / "run"),
        ("fp32",),
        "100mbit",
        0.5,
        predict_with=(str(path), str(path)),
    )
    with pytest.raises(ValueError, match="same model, ranks, --batch-size and --input-shape"):
        accuracy._step_predictions(plan)
    summary.update(model="mlp", input_shape=[3, 32, 32])  # all else matches: the shape not
    path.write_text(json.dumps(summary))
    with pytest.raises(ValueError, match=r"'input_shape': \[3, 32, 32\]\}, this run trains"):
        accuracy._step_predictions(plan)


def test_a_report_needs_finished_runs(tmp_path):
    plan = accuracy.AccuracyComparison(accuracy_base(tmp_path), ("fp32",), "100mbit", 0.5)
    with pytest.raises(ValueError, match=r"fp32 .* has not finished in .*: train it first"):
        comparison.report_only(plan, tmp_path)
