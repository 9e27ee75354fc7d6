"""``bench accuracy --tune-lr``: the tuning's runs (every method at every rate, local steps at
every outer rate too, on a seed kept out of the race), the choice of a rate, the record that a
resumed tuning must match, the report, and the race at the rates chosen."""

import json
import math
from pathlib import Path

import pytest
from support import accuracy_base

from terngrad.comm.spec import methods
from terngrad.experiments import comparison, tuning, tuning_record
from terngrad.experiments import time_to_accuracy as tta
from terngrad.train import outputs


def _race(tmp_path, methods=("fp32", "terngrad-local5"), target=0.9, **changes):
    settings = {"seeds": 2, "stop_at_target": True, **changes}
    return tta.AccuracyComparison(accuracy_base(tmp_path), methods, "25mbit", target, **settings)


def test_every_method_at_every_rate_local_steps_at_every_outer_rate_on_the_tuning_seed(tmp_path):
    grid = tuning.LrGrid((0.01, 0.05), seed=1000, outer_lrs=(0.5, 1.0))
    tuned = tuning.LrTuning.of(_race(tmp_path), grid)
    runs = tuned.plan()
    # from the middle of the grid outwards, the larger first: a good rate early
    assert [(r.method, r.tags["lr"], r.tags["outer_lr"]) for r in runs] == [
        ("fp32", 0.05, None), ("fp32", 0.01, None),
        ("terngrad-local5", 0.05, 1.0), ("terngrad-local5", 0.05, 0.5),
        ("terngrad-local5", 0.01, 1.0), ("terngrad-local5", 0.01, 0.5),
    ]  # fmt: skip
    assert tuned.inner.bandwidth == "unlimited" and tuned.inner.seeds == 1
    assert {r.config.seed for r in runs} == {1000}
    assert [r.config.lr for r in runs] == [0.05, 0.01, 0.05, 0.05, 0.01, 0.01]
    assert [r.config.method.local.outer_lr for r in runs[2:]] == [1.0, 0.5, 1.0, 0.5]
    assert runs[3].config.method.name == "terngrad-local5-olr0.5"  # the rate, in its method
    assert runs[4].config.out == str(tmp_path / "tuning" / "terngrad-local5-lr0.01-olr1")
    assert runs[1].config.out == str(tmp_path / "tuning" / "fp32-lr0.01")
    five = tuning.LrGrid((0.08, 0.01, 0.03, 0.02, 0.05), seed=1)
    assert [lr for lr, _ in five.points(methods.get("fp32"))] == [0.03, 0.05, 0.02, 0.08, 0.01]
    assert all(r.config.stop_at_accuracy == 0.9 for r in runs)  # steps to target: the measure
    # everything but the rates is the race's recipe
    race = _race(tmp_path).plan()
    assert not runs[0].config.diff(race[0].config, ignore=("out", "lr", "seed"))
    # a loss target: every step trained (the lowest final loss chooses)
    by_loss = tuning.LrTuning.of(_race(tmp_path, target_metric="loss"), grid).plan()
    assert all(r.config.stop_at_loss is None and r.config.stop_at_accuracy is None
               for r in by_loss)  # fmt: skip
    # without outer rates a local method tunes its lr alone
    plain = tuning.LrTuning.of(_race(tmp_path), tuning.LrGrid((0.01,), seed=9)).plan()
    assert [(r.method, r.tags["outer_lr"]) for r in plain] == [
        ("fp32", None), ("terngrad-local5", None),
    ]  # fmt: skip


@pytest.mark.parametrize(
    "rates, words",
    [
        ((), "--tune-lr needs at least one learning rate"),
        ((0.01, -0.1), "-0.1 is not a learning rate"),
        ((0.0,), "0.0 is not a learning rate"),
        ((math.nan,), "nan is not a learning rate"),
        ((math.inf,), "inf is not a learning rate"),
        ((0.01, 0.01), "each rate may be given once"),
    ],
)
def test_bad_rates_are_refused_in_one_line(rates, words):
    with pytest.raises(ValueError, match=words):
        tuning.LrGrid(rates, seed=1000)


def test_the_tuning_seed_is_never_a_race_seed(tmp_path):
    race = _race(tmp_path, seeds=3)  # seeds 0, 1, 2
    for seed in (0, 2):
        with pytest.raises(ValueError, match=rf"--tune-seed {seed} is one of the seeds compared"):
            tuning.LrTuning.of(race, tuning.LrGrid((0.01,), seed=seed))
    tuning.LrTuning.of(race, tuning.LrGrid((0.01,), seed=3))


def _point(lr, step=None, final=0.95, best=0.96, loss=0.3, outer=None, diverged=False):
    reached = None if step is None else {"step": step, "train_seconds": 1.0, "seconds": 1.0}
    return {"lr": lr, "outer_lr": outer, "diverged": diverged, "reached": reached,
            "final_accuracy": final, "best_accuracy": best, "final_loss": loss,
            "steps": 100}  # fmt: skip


def test_the_rate_chosen():
    # accuracy: the fewest steps to target; a tie: the higher final accuracy, then the smaller
    pts = [_point(0.01, 400), _point(0.03, 200, final=0.97), _point(0.05, 200, final=0.98),
           _point(0.08, None), _point(0.12, diverged=True)]  # fmt: skip
    assert tuning_record.choose(pts, "accuracy") == {
        "lr": 0.05, "outer_lr": None, "why": "target at step 200, the fewest",
    }  # fmt: skip
    tie = [_point(0.05, 200, outer=1.0), _point(0.03, 200, outer=0.5)]
    assert tuning_record.choose(tie, "accuracy")["lr"] == 0.03
    # none reached: the highest best accuracy, said so
    none = [_point(0.01, None, best=0.90), _point(0.03, None, best=0.93)]
    chosen = tuning_record.choose(none, "accuracy")
    assert chosen["lr"] == 0.03 and "no rate reached the target" in chosen["why"]
    # a loss target: the lowest final loss of the runs that did not diverge
    losses = [_point(1e-3, loss=1.6), _point(4e-3, loss=1.3), _point(8e-3, loss=math.nan,
              diverged=True)]  # fmt: skip
    assert tuning_record.choose(losses, "loss")["lr"] == 4e-3
    every = [_point(0.1, diverged=True), _point(0.2, diverged=True)]
    assert tuning_record.choose(every, "loss") == {
        "lr": 0.1, "outer_lr": None, "why": "every rate diverged; the smallest",
    }  # fmt: skip


def _finish(cfg, accuracies, loss=0.5):
    """A run's files as the trainer leaves them: an evaluation every 10 steps, the summary."""
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    for i, acc in enumerate(accuracies, start=1):
        outputs.append_metrics(out / outputs.METRICS, {
            "step": 10 * i, "accuracy": acc, "loss": loss, "train_seconds": float(i),
            "seconds": float(i),
        })  # fmt: skip
    summary = {"config": cfg.to_dict(), "accuracy": accuracies[-1],
               "best_accuracy": max(accuracies), "loss": loss, "best_loss": loss,
               "steps": 10 * len(accuracies), "train_seconds": float(len(accuracies)),
               "wire_bytes_per_step": None, "bytes_sent_per_step": None}  # fmt: skip
    (out / outputs.SUMMARY).write_text(json.dumps(summary))


def test_the_record_the_report_and_the_race_at_the_rates_chosen(tmp_path):
    race = _race(tmp_path)
    tuned = tuning.LrTuning.of(race, tuning.LrGrid((0.01, 0.02, 0.05), seed=1000))
    runs = {(r.method, r.tags["lr"]): r.config for r in tuned.plan()}
    _finish(runs["fp32", 0.02], [0.5, 0.91])  # step 20
    _finish(runs["fp32", 0.05], [0.92])  # step 10
    _finish(runs["fp32", 0.01], [0.5])  # stopped at step 10: 0.05 was there at 10
    stopped = {"stopped": "not at 90% by step 10", "config": runs["fp32", 0.01].to_dict()}
    (Path(runs["fp32", 0.01].out) / tuning.STOPPED_FILE).write_text(json.dumps(stopped))
    _finish(runs["terngrad-local5", 0.01], [0.5, 0.8])  # not reached
    _finish(runs["terngrad-local5", 0.02], [0.5, 0.7])  # not reached
    diverged = {"diverged": "stopped", "config": runs["terngrad-local5", 0.05].to_dict()}
    Path(runs["terngrad-local5", 0.05].out).mkdir(parents=True)
    (Path(runs["terngrad-local5", 0.05].out) / tuning.DIVERGED_FILE).write_text(
        json.dumps(diverged)
    )
    (Path(runs["fp32", 0.01].out) / outputs.SUMMARY).unlink()  # a stopped run has no summary
    text = comparison.report_only(tuned, tuned.out)
    record = json.loads((tmp_path / "tuning" / tuning_record.RECORD).read_text())
    assert record["methods"]["fp32"]["chosen"]["lr"] == 0.05
    assert record["methods"]["fp32"]["chosen"]["why"].endswith(
        "the largest rate tried: a larger one may be better"
    )  # the best may lie beyond the grid
    local = record["methods"]["terngrad-local5"]
    assert local["chosen"]["lr"] == 0.01 and "no rate reached" in local["chosen"]["why"]
    assert [p["lr"] for p in local["points"]] == [0.01, 0.02, 0.05]  # in order, as trained or not
    assert local["points"][2]["diverged"]
    assert "| fp32 | > 10 (stopped) | 20 | **10** |" in text
    assert (
        "| terngrad-local5 | **not reached (80.0% best)** | not reached (70.0% best) | diverged |"
        in text
    )
    assert "seed 1000 (kept out of the race)" in text
    assert (tmp_path / "tuning" / "tuning.png").stat().st_size > 10_000
    assert tuning_record.plot(record, tmp_path / "again.png") == [
        "fp32",
        "terngrad-local5",
    ]  # a panel each
    # the race: each method at its own rate, on the race's seeds
    fair = tuning.raced(race, record)
    assert [(r.method, r.config.seed, r.config.lr) for r in fair.plan()] == [
        ("fp32", 0, 0.05), ("fp32", 1, 0.05),
        ("terngrad-local5", 0, 0.01), ("terngrad-local5", 1, 0.01),
    ]  # fmt: skip
    assert fair.tuned_on == 1000
    # a resumed tuning: the same recipe with more rates is the same tuning...
    more = tuning.LrTuning.of(race, tuning.LrGrid((0.01, 0.02, 0.05, 0.08), seed=1000))
    more.check_record()
    again = {(r.method, r.tags["lr"]): more.finished(r) for r in more.plan()}
    assert again["terngrad-local5", 0.05]["diverged"] == "stopped"  # read back, not retrained
    assert again["fp32", 0.01]["stopped"] == "not at 90% by step 10"
    assert again["fp32", 0.08] is None  # the new rate: to train
    # ... another recipe, target or seed is refused in one line
    for other in (
        tuning.LrTuning.of(_race(tmp_path, target=0.95), tuning.LrGrid((0.01,), seed=1000)),
        tuning.LrTuning.of(race, tuning.LrGrid((0.01,), seed=1001)),
        tuning.LrTuning.of(tta.AccuracyComparison(accuracy_base(tmp_path, momentum=0.5),
                           race.methods, "25mbit", 0.9), tuning.LrGrid((0.01,), seed=1000)),
    ):  # fmt: skip
        with pytest.raises(ValueError, match=r"tuning.json was made for another tuning \("):
            other.check_record()


def test_a_tuning_made_over_several_calls_reports_every_method_tuned(tmp_path):
    """A sweep tunes some methods in one call and others in the next (same folder, same
    recipe): the last call's record, table and plot keep the earlier methods."""
    grid = tuning.LrGrid((0.01, 0.02), 1000)
    first = tuning.LrTuning.of(_race(tmp_path, methods=("fp32",)), grid)
    for r in first.plan():
        _finish(r.config, [0.5, 0.91])
    comparison.report_only(first, first.out)
    then = tuning.LrTuning.of(_race(tmp_path, methods=("terngrad-local5",)),
                              tuning.LrGrid((0.02, 0.05), 1000))  # fmt: skip
    for r in then.plan():
        _finish(r.config, [0.92])
    text = comparison.report_only(then, then.out)
    record = json.loads((then.out / tuning_record.RECORD).read_text())
    assert list(record["methods"]) == ["terngrad-local5", "fp32"]
    assert record["lrs"] == [0.01, 0.02, 0.05]  # every rate either call tuned
    assert "| fp32 | **20** | 20 | - |" in text  # (a tie: the smaller rate)
    assert "| terngrad-local5 | - | **10** | 10 |" in text
    assert tuning_record.chosen_settings(record) == {
        "terngrad-local5": {"lr": 0.02},
        "fp32": {"lr": 0.01},
    }


def test_a_loss_target_from_fp32s_tuned_loss():
    record = {"methods": {"fp32": {
        "chosen": {"lr": 4e-3, "outer_lr": None, "why": ""},
        "points": [_point(1e-3, loss=1.44), _point(4e-3, loss=1.30)],
    }}}  # fmt: skip
    assert tuning_record.tuned_loss_target(record, "fp32", 1.0) == pytest.approx(1.313)
    with pytest.raises(ValueError, match="needs fp16 among --methods"):
        tuning_record.tuned_loss_target(record, "fp16", 1.0)


def test_the_transformer_comparison_tunes_by_the_final_loss_and_compares_at_its_rates(tmp_path):
    """``reproduce transformer --tune-lr``: every step trained on the tuning seed, then the
    comparison's seeds at each method's rate."""
    from terngrad.experiments import gpt

    base = gpt.protocol(str(tmp_path), steps=50, eval_every=25, model="gpt-small")
    experiment = gpt.TransformerComparison(base, ("fp32", "terngrad-local25"), seeds=2)
    tuned = tuning.LrTuning.of(experiment, tuning.LrGrid((1e-3, 4e-3), seed=7, outer_lrs=(0.5,)))
    runs = tuned.plan()
    assert [(r.method, r.config.lr, _outer_lr(r), r.config.seed) for r in runs] == [
        ("fp32", 4e-3, None, 7), ("fp32", 1e-3, None, 7),
        ("terngrad-local25", 4e-3, 0.5, 7), ("terngrad-local25", 1e-3, 0.5, 7),
    ]  # fmt: skip
    assert tuned.target_metric == "loss" and tuned.target is None
    assert all(r.config.stop_at_loss is None for r in runs)
    assert runs[0].config.out == str(tmp_path / "tuning" / "fp32-lr0.004")
    record = {"seed": 7, "methods": {
        "fp32": {"chosen": {"lr": 4e-3, "outer_lr": None}},
        "terngrad-local25": {"chosen": {"lr": 1e-3, "outer_lr": 0.5}},
    }}  # fmt: skip
    fair = tuning.raced(experiment, record)
    assert [(r.method, r.config.seed, r.config.lr, _outer_lr(r)) for r in fair.plan()] == [
        ("fp32", 0, 4e-3, None), ("fp32", 1, 4e-3, None),
        ("terngrad-local25", 0, 1e-3, 0.5), ("terngrad-local25", 1, 1e-3, 0.5),
    ]  # fmt: skip
    with pytest.raises(ValueError, match="--tune-seed 1 is one of the seeds compared"):
        tuning.LrTuning.of(experiment, tuning.LrGrid((1e-3,), seed=1))


def test_a_tuning_whose_session_launches_runs_makes_its_folder_and_records_what_ends_early(
    tmp_path,
):
    """The transformer's session (plain launches, no testbed) is given no folder: the tuning
    makes it; a run the trainer stops on NaN/Inf gradients is a diverged point."""
    import contextlib

    from terngrad.experiments import gpt
    from terngrad.train.loop import DIVERGED

    class Launches(gpt.TransformerComparison):
        @contextlib.contextmanager
        def session(self, runs, echo, observe=None):
            def train(r):
                if r.config.lr > 0.01:  # as a worker's failure reads
                    raise RuntimeError(f"TrainingFailed: 10 consecutive steps {DIVERGED}")
                _finish(r.config, [0.1], loss=1.5)
                return json.loads((Path(r.config.out) / outputs.SUMMARY).read_text())

            yield train

    base = gpt.protocol(str(tmp_path / "new"), steps=20, eval_every=10, model="gpt-small")
    tuned = tuning.LrTuning.of(Launches(base, ("fp32",)), tuning.LrGrid((1e-3, 0.1), seed=7))
    record, text = tuning.tune(tuned, lambda line: None)
    fp32 = record["methods"]["fp32"]
    assert [(p["lr"], p["diverged"]) for p in fp32["points"]] == [(1e-3, False), (0.1, True)]
    assert fp32["chosen"]["lr"] == 1e-3 and "| fp32 | **1.5000** | diverged |" in text
    assert (tmp_path / "new" / "tuning" / "fp32-lr0.1" / tuning.DIVERGED_FILE).exists()
    with pytest.raises(RuntimeError, match="another failure"):  # any other error is re-raised

        class Fails(Launches):
            @contextlib.contextmanager
            def session(self, runs, echo, observe=None):
                yield lambda r: (_ for _ in ()).throw(RuntimeError("another failure"))

        base = gpt.protocol(str(tmp_path / "other"), steps=20, eval_every=10, model="gpt-small")
        tuning.tune(tuning.LrTuning.of(Fails(base, ("fp32",)), tuning.LrGrid((1e-3,), seed=7)),
                    lambda line: None)  # fmt: skip


def test_a_choice_at_the_grids_edge_says_a_rate_beyond_may_be_better():
    grid = tuning.LrGrid((0.01, 0.05, 0.08), seed=1, outer_lrs=(0.5, 0.7))
    inside = {"lr": 0.05, "outer_lr": None, "why": "w"}
    assert tuning_record.at_edge(inside, grid) == inside
    outer = tuning_record.at_edge({"lr": 0.05, "outer_lr": 0.5, "why": "w"}, grid)
    assert outer["why"] == "w; the smallest outer rate tried: a smaller one may be better"
    both = tuning_record.at_edge({"lr": 0.08, "outer_lr": 0.7, "why": "w"}, grid)["why"]
    assert both == (
        "w; the largest rate tried: a larger one may be better; the largest outer rate tried: "
        "a larger one may be better"
    )


def test_a_watched_run_is_stopped_once_it_can_no_longer_be_chosen_or_its_loss_is_not_finite(
    tmp_path,
):
    """Where the session shows each evaluation (the testbed's): a run past the fewest steps to
    target of its method's finished rates is stopped there, one whose test loss is NaN is a
    diverged point (PyTorch's hooks train on through NaN); the choice stays the grid's."""
    import contextlib

    curves = {0.05: [0.5, 0.95], 0.08: [0.5, 0.6, 0.7], 0.03: [math.nan]}

    class Watched(tta.AccuracyComparison):
        @contextlib.contextmanager
        def session(self, runs, echo, observe=None):
            def train(r):
                out = Path(r.config.out)
                out.mkdir(parents=True)
                for i, acc in enumerate(curves[r.config.lr], start=1):
                    loss = math.nan if math.isnan(acc) else 0.5
                    record = {"step": 10 * i, "accuracy": acc, "loss": loss,
                              "train_seconds": float(i), "seconds": float(i)}  # fmt: skip
                    outputs.append_metrics(out / outputs.METRICS, record)
                    observe(r, record)
                summary = {"config": r.config.to_dict(), "accuracy": acc, "best_accuracy": acc,
                           "loss": loss, "best_loss": loss, "steps": 10 * i,
                           "train_seconds": float(i), "wire_bytes_per_step": None,
                           "bytes_sent_per_step": None}  # fmt: skip
                (out / outputs.SUMMARY).write_text(json.dumps(summary))
                return summary

            yield train

    race = Watched(accuracy_base(tmp_path), ("fp32",), "25mbit", 0.9, seeds=1)
    record, text = tuning.tune(tuning.LrTuning.of(race, tuning.LrGrid((0.03, 0.05, 0.08), 7)),
                               lambda line: None)  # fmt: skip
    fp32 = {p["lr"]: p for p in record["methods"]["fp32"]["points"]}
    assert fp32[0.05]["reached"]["step"] == 20  # trained first: the middle of the grid
    assert fp32[0.08]["stopped"] and fp32[0.08]["steps"] == 20  # at 0.05's 20 steps, not there
    assert fp32[0.03]["diverged"]
    assert record["methods"]["fp32"]["chosen"]["lr"] == 0.05
    assert "| fp32 | diverged | **20** | > 20 (stopped) |" in text


def _outer_lr(run) -> float | None:
    local = run.config.method.local
    return None if local is None else local.outer_lr
