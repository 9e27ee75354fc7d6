"""``terngrad bench accuracy``: time to target, the methods' configurations, predictions from
matching runs only, a report of finished runs only."""

import json

import pytest
from support import accuracy_base

from terngrad.comm.spec import methods
from terngrad.experiments import comparison
from terngrad.experiments import time_to_accuracy as tta
from terngrad.experiments import time_to_accuracy_report as tta_report


def test_time_to_target_is_the_first_evaluation_that_reaches_it():
    curve = [
        {"step": 10, "accuracy": 0.50, "train_seconds": 1.0, "seconds": 1.5},
        {"step": 20, "accuracy": 0.81, "train_seconds": 2.0, "seconds": 3.0},
        {"step": 30, "accuracy": 0.79, "train_seconds": 3.0, "seconds": 4.5},
        {"step": 40, "accuracy": 0.90, "train_seconds": 4.0, "seconds": 6.0},
    ]
    first = tta_report.time_to_target(curve, 0.8)
    assert first == {"step": 20, "train_seconds": 2.0, "seconds": 3.0}
    assert tta_report.time_to_target(curve, 0.9)["step"] == 40
    assert tta_report.time_to_target(curve, 0.95) is None


def test_a_loss_target_is_the_first_evaluation_at_or_under_it(tmp_path):
    """``--target-loss``: a language model's race, to a validation loss; the runs stop at it."""
    curve = [
        {"step": 50, "loss": 2.10, "accuracy": 0.4, "train_seconds": 5.0, "seconds": 6.0},
        {"step": 100, "loss": 1.45, "accuracy": 0.5, "train_seconds": 10.0, "seconds": 12.0},
        {"step": 150, "loss": 1.46, "accuracy": 0.6, "train_seconds": 15.0, "seconds": 18.0},
    ]
    assert tta_report.time_to_target(curve, 1.45, "loss")["step"] == 100  # at it: reached
    assert tta_report.time_to_target(curve, 1.449, "loss") is None
    assert tta_report.time_to_target(curve, 0.6)["step"] == 150  # an accuracy, as before
    assert tta_report.target_words(1.4505, "loss") == "loss 1.45"
    assert tta_report.target_words(0.98) == "98%"
    plan = tta.AccuracyComparison(accuracy_base(tmp_path), ("fp32", "terngrad"), "25mbit", 1.45,
                                  stop_at_target=True, target_metric="loss")  # fmt: skip
    assert all(
        (r.config.stop_at_loss, r.config.stop_at_accuracy) == (1.45, None) for r in plan.plan()
    )
    for bad, words in ((0.0, "target loss 0 can never be reached"),
                       (float("inf"), "target loss inf can never be reached")):  # fmt: skip
        with pytest.raises(ValueError, match=words):
            tta.AccuracyComparison(accuracy_base(tmp_path), ("fp32",), "1gbit", bad,
                                   target_metric="loss").plan()  # fmt: skip
    run = {**_run("fp32", 0, 100, 10.0), "final_loss": 1.40, "best_loss": 1.39}
    results = {"model": "gpt-small", "dataset": "pydoc", "workers": 4, "bandwidth": "25mbit",
               "target": 1.45, "target_metric": "loss", "prediction": None, "seeds": [0],
               "settings": {"optimizer": "adamw", "lr": 1e-3, "lr_schedule": "cosine",
                            "momentum": 0.9, "weight_decay": 0.1, "batch_size_per_worker": 16,
                            "steps": 1000, "eval_every": 50, "seed": 0},
               "methods": [{**tta_report.method_row("fp32", [run]), "sooner_than_fp32": 1.0,
                            "sooner_than_fp16": None}]}  # fmt: skip
    text = tta_report.markdown(results)
    assert "# Time to loss 1.45: gpt-small on pydoc" in text
    assert "| seconds to loss 1.45 | vs fp32 | vs fp16 | final loss | best loss |" in text
    assert "| 1.4000 | 1.3900 |" in text


def test_every_method_gets_its_own_configuration(tmp_path):
    base = accuracy_base(tmp_path, method="terngrad-last")  # the protocol: quantize_last
    plan = tta.AccuracyComparison(base, ("fp32", "powersgd", "terngrad-ps", "qsgd"), "1gbit",
                                       0.9)  # fmt: skip
    fp32, powersgd, ps, qsgd = (r.config for r in plan.plan())
    assert [c.method.name for c in (fp32, powersgd, ps, qsgd)] == [
        "fp32", "powersgd", "terngrad-ps-last", "qsgd-5-last",  # the run's protocol over each
    ]  # fmt: skip
    assert qsgd.out == str(tmp_path / "qsgd-5")  # the older name's method
    # everything else is the same run
    assert not ps.diff(qsgd, ignore=("out", "method"))
    # a method given as an object is the method its name says
    objects = (methods.get("terngrad-ps"), methods.parse("qsgd-5"))
    assert [r.config for r in tta.AccuracyComparison(base, objects, "1gbit", 0.9).plan()] == [
        ps,
        qsgd,
    ]


def test_a_base_method_that_would_not_run_is_refused(tmp_path):
    """A race's base holds its protocol alone (which tensors stay in fp32): a method in it
    would be dropped unsaid by every run, which takes its own; refused in one line."""
    base = accuracy_base(tmp_path, method="terngrad-ef-local5")
    with pytest.raises(ValueError, match=r"the base's method terngrad-ef-local5 would not run: "
                       r"each run takes its own method"):  # fmt: skip
        tta.AccuracyComparison(base, ("fp32", "terngrad"), "1gbit", 0.9).plan()
    from terngrad.experiments import gpt

    protocol = gpt.protocol(str(tmp_path), steps=50, eval_every=25, model="gpt-small")
    with pytest.raises(ValueError, match="the base's method terngrad-b512 would not run"):
        gpt.TransformerComparison(protocol.replace(method="terngrad-b512"), ("fp32",)).plan()


def test_predictions_must_come_from_the_same_setting(tmp_path):
    summary = {"ranks": 2, "bandwidth": "unlimited", "model": "lenet", "batch_size": 64,
               "compute_seconds": 0.1, "methods": []}  # fmt: skip
    path = tmp_path / "net.json"
    path.write_text(json.dumps(summary))
    plan = tta.AccuracyComparison(
        accuracy_base(tmp_path / "run"),
        ("fp32",),
        "100mbit",
        0.5,
        predict_with=(str(path), str(path)),
    )
    with pytest.raises(ValueError, match="same model, ranks, --batch-size and --input-shape"):
        tta_report.step_predictions(plan)
    summary.update(model="mlp", input_shape=[3, 32, 32])  # all else matches: the shape not
    path.write_text(json.dumps(summary))
    with pytest.raises(ValueError, match=r"'input_shape': \[3, 32, 32\]\}, this run trains"):
        tta_report.step_predictions(plan)


def test_a_report_needs_finished_runs(tmp_path):
    plan = tta.AccuracyComparison(accuracy_base(tmp_path), ("fp32",), "100mbit", 0.5)
    with pytest.raises(ValueError, match=r"fp32 .* has not finished in .*: train it first"):
        comparison.report_only(plan, tmp_path)


def test_every_method_runs_with_every_seed_and_stops_at_the_target_if_asked(tmp_path):
    plan = tta.AccuracyComparison(accuracy_base(tmp_path, seed=5), ("fp32", "terngrad"),
                                       "1gbit", 0.9, seeds=3, stop_at_target=True)  # fmt: skip
    runs = plan.plan()
    assert [(r.method, r.config.seed) for r in runs] == [
        ("fp32", 5), ("fp32", 6), ("fp32", 7), ("terngrad", 5), ("terngrad", 6), ("terngrad", 7),
    ]  # fmt: skip
    assert runs[4].config.out == str(tmp_path / "terngrad-s6")
    assert all(r.config.stop_at_accuracy == 0.9 for r in runs)
    one = tta.AccuracyComparison(accuracy_base(tmp_path), ("fp32",), "1gbit", 0.9).plan()
    assert one[0].config.out == str(tmp_path / "fp32") and one[0].config.stop_at_accuracy is None
    with pytest.raises(ValueError, match="seeds must be at least 1"):
        tta.AccuracyComparison(accuracy_base(tmp_path), ("fp32",), "1gbit", 0.9,
                                    seeds=0).plan()  # fmt: skip


def _run(method, seed, step, seconds):
    reached = None if step is None else {"step": step, "train_seconds": seconds, "seconds": 1.0}
    return {"method": method, "seed": seed, "label": method, "reached": reached,
            "final_accuracy": 0.98, "best_accuracy": 0.99, "step_seconds": 0.1,
            "train_seconds": 30.0 + seed, "wire_bytes_per_step": None,
            "hook_bytes_per_step": 100.0, "curve": []}  # fmt: skip


def test_a_method_over_its_seeds():
    row = tta_report.method_row("terngrad", [_run("terngrad", s, 100 * (s + 1), 10.0 * (s + 1))
                                                  for s in range(3)])  # fmt: skip
    assert row["reached"] == {"step": 200, "train_seconds": 20.0} and row["reached_runs"] == 3
    assert row["steps_to_target_sd"] == pytest.approx(100.0)
    assert row["seeds"] == [0, 1, 2] and row["hook_bytes_per_step"] == 100.0
    assert row["train_seconds"] == 31.0  # the mean of the runs' whole training
    partly = tta_report.method_row("fp32", [_run("fp32", 0, 100, 9.0), _run("fp32", 1, None, 0)])
    assert partly["reached"] is None and partly["reached_runs"] == 1  # not every seed: no mean


def test_the_sweep_sets_every_bandwidth_side_by_side(tmp_path):
    from terngrad.experiments import sweep

    def results(bandwidth, fp32, tern):
        def method(name, seconds):
            return {"method": name, "reached": {"step": 500, "train_seconds": seconds},
                    "seconds_to_target_sd": 1.0, "steps_to_target_sd": 10.0, "reached_runs": 2,
                    "seeds": [0, 1], "step_seconds": seconds / 500,
                    "sooner_than_fp32": fp32 / seconds, "sooner_than_fp16": None}  # fmt: skip

        return {"model": "lenet", "dataset": "mnist", "workers": 4, "target": 0.98,
                "seeds": [0, 1], "bandwidth": bandwidth,
                "methods": [method("fp32", fp32), method("terngrad", tern)]}  # fmt: skip

    found = sweep.summarise([results("25mbit", 800.0, 100.0), results("unlimited", 50.0, 60.0)])
    slow, free = found["points"]
    assert free["communication_over_compute"] is None and free["mbit_per_s"] is None
    assert found["compute_seconds"] == 0.1  # fp32's step on the fastest link
    # LeNet's 431,080 parameters in fp32 over a 4-rank ring: 2 (N-1)/N x 4 bytes each
    assert found["fp32_ring_bytes_per_step"] == 2 * 3 * 4 * 431_080 / 4
    assert slow["communication_over_compute"] == pytest.approx(
        found["fp32_ring_bytes_per_step"] / (25e6 / 8) / 0.1
    )
    assert slow["methods"]["terngrad"]["sooner_than_fp32"] == 8.0
    # the race: PyTorch's fastest against terngrad's, and the slow link against the fastest
    assert slow["fastest_pytorch"] == {"method": "fp32", "seconds": 800.0}
    assert slow["fastest_terngrad"] == {"method": "terngrad", "seconds": 100.0}
    assert slow["terngrad_sooner_than_pytorch"] == 8.0
    assert found["fastest_on_fastest_link"] == {"method": "fp32", "seconds": 50.0}
    assert slow["terngrad_over_fastest_on_fastest_link"] == 2.0
    assert free["terngrad_sooner_than_pytorch"] == pytest.approx(50 / 60)
    text = sweep.write(tmp_path, [results("25mbit", 800.0, 100.0), results("unlimited", 50, 60)])
    assert "| 25mbit | 8.28 | 800 ± 1 s (1.00x / -) | 100 ± 1 s (8.00x / -) |" in text
    assert "| 25mbit | fp32 800 s | terngrad 100 s | 8.00x | 2.00x |" in text
    assert "fastest link swept (fp32 50 s)" in text
    assert (tmp_path / "sweep.png").stat().st_size > 10_000
    # a link that ran fewer methods: every method still has its column
    fewer = results("10mbit", 2000.0, 90.0)
    fewer["methods"] = fewer["methods"][1:]
    text = sweep.write(tmp_path, [results("unlimited", 50, 60), fewer])
    row = next(line for line in text.splitlines() if line.startswith("| 10mbit |"))
    assert " | - | 90 ± 1 s (" in row  # fp32 not run there: '-'; terngrad in its column
    # swept fast link first: the lines still run from the slowest link to 'unlimited'
    out_of_order = sweep.summarise(
        [results("100mbit", 200.0, 70.0), results("25mbit", 800.0, 100.0),
         results("unlimited", 50.0, 60.0)]
    )  # fmt: skip
    drawn, missed = sweep.plot(out_of_order, tmp_path / "again.png")
    assert drawn == {"fp32": [25.0, 100.0, 400.0], "terngrad": [25.0, 100.0, 400.0]}
    assert missed == {}
    # a link where a seed never got there: a cross, and no line drawn through it
    gap = results("100mbit", 200.0, 70.0)
    gap["methods"][1]["reached"] = None
    gapped = sweep.summarise([gap, results("25mbit", 800.0, 100.0), results("unlimited", 50, 60)])
    drawn, missed = sweep.plot(gapped, tmp_path / "gap.png")
    assert drawn["terngrad"] == [25.0, 400.0] and missed == {"terngrad": [100.0]}
    for r in gapped["points"]:  # a method no seed ever got there with: crosses alone
        r["methods"]["terngrad"]["seconds_to_target"] = None
    drawn, missed = sweep.plot(gapped, tmp_path / "gap.png")
    assert list(drawn) == ["fp32"] and missed == {"terngrad": [25.0, 100.0, 400.0]}
    plan = tta.AccuracyComparison(accuracy_base(tmp_path), ("fp32",), "1gbit", 0.9)
    assert [p.base.out for p in sweep.comparisons(plan, ["1gbit", "25mbit"])] == [
        str(tmp_path / "1gbit"), str(tmp_path / "25mbit"),
    ]  # fmt: skip
    with pytest.raises(ValueError, match="each bandwidth may be given once"):
        sweep.comparisons(plan, ["1gbit", "1gbit"])
    # a tuned sweep says each method's rate (the outer rate in brackets)
    tuned = [results("25mbit", 800.0, 100.0), results("unlimited", 50.0, 60.0)]
    for r in tuned:
        r["tuned_on"] = 1000
        r["methods"][0]["lr"], r["methods"][1]["lr"] = 0.08, 0.05
        r["methods"][1]["outer_lr"] = 0.7
    text = sweep.write(tmp_path, tuned)
    assert (
        "tuned on seed 1000, kept out of the race (tuning/tuning.md): fp32 0.08, terngrad " in text
    )
    assert "terngrad 0.05 (0.7)." in text
    # a sweep run a call a link: the links of earlier calls of the same sweep join the report
    for r in (*tuned, results("100mbit", 200.0, 70.0)):
        (tmp_path / r["bandwidth"]).mkdir(exist_ok=True)
        (tmp_path / r["bandwidth"] / "results.json").write_text(json.dumps(r))
    other = {**results("10mbit", 9.0, 9.0), "target": 0.5, "tuned_on": 1000}  # another sweep's
    (tmp_path / "10mbit").mkdir()
    (tmp_path / "10mbit" / "results.json").write_text(json.dumps(other))
    # PowerSGD at any rank is PyTorch's
    ranked = results("100mbit", 200.0, 70.0)
    ranked["methods"].append({**ranked["methods"][0], "method": "powersgd-r4"})
    ranked["methods"][-1]["reached"] = {"step": 300, "train_seconds": 50.0}
    point = sweep.summarise([ranked])["points"][0]
    assert point["fastest_pytorch"] == {"method": "powersgd-r4", "seconds": 50.0}
    merged = sweep.with_earlier_links(tmp_path, [tuned[0]])
    assert [r["bandwidth"] for r in merged] == ["unlimited", "25mbit"]  # fastest first
    assert sweep.with_earlier_links(tmp_path / "25mbit", [tuned[0]]) == [tuned[0]]


def test_a_finished_run_is_read_back_whatever_its_checkpoint(tmp_path, monkeypatch):
    """A race read back checks only the folders of the runs still to train: a finished run's
    newest checkpoint (here not one at all; in the race, a PowerSGD run that diverged to NaN,
    which no run may resume from) is never read again."""
    from terngrad.bench import testbed

    monkeypatch.setattr(testbed, "check_host", lambda: None)
    plan = tta.AccuracyComparison(accuracy_base(tmp_path), ("fp32",), "100mbit", 0.9)
    (run,) = plan.plan()
    out = tmp_path / "fp32"
    out.mkdir()
    (out / "checkpoint-00000010.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="checkpoint"):
        plan.check([run])  # not finished: the checkpoint it would resume from is refused
    (out / "summary.json").write_text(json.dumps({"config": run.config.to_dict()}))
    plan.check([run])
