"""A run's settings: ``TrainConfig`` checked where it is made (the Python API refuses what the
command line does), read back from this and older versions' files, the warm-up in epochs."""

import json
import math

import pytest
from support import REPO

from terngrad.comm import Options
from terngrad.comm.spec.method_spec import Method
from terngrad.train.config import TrainConfig


def test_config_validation():
    for bad in (0, 1.5, -0.1):
        with pytest.raises(ValueError, match="stop-at-accuracy must be a fraction above 0"):
            TrainConfig(out="x", stop_at_accuracy=bad)
    assert TrainConfig(out="x", stop_at_accuracy=0.98).stop_at_accuracy == 0.98
    for bad in (0, -1.0, math.inf):
        with pytest.raises(ValueError, match="stop-at-loss must be a positive number"):
            TrainConfig(out="x", stop_at_loss=bad)
    with pytest.raises(ValueError, match=r"one of batch-size .* and total-batch-size, not both"):
        TrainConfig(out="x", batch_size=8, total_batch_size=64)
    assert TrainConfig(out="x").batch_size == 64  # neither: 64 a worker, said once
    with pytest.raises(ValueError, match="a method's exchange leaves the run's settings"):
        TrainConfig(out="x", method=Method(exchange=Options(seed=3)))
    with pytest.raises(ValueError, match="method must be a name or a Method"):
        TrainConfig(out="x", method=Options())
    with pytest.raises(ValueError, match="unknown optimizer"):
        TrainConfig(out="x", optimizer="lbfgs")
    cfg = TrainConfig(out="x", total_batch_size=64, batch_size=None, workers=4)
    assert cfg.worker_batch == 16
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg


def test_the_config_carries_its_method_and_reads_the_older_layouts():
    saved = json.loads((REPO / "docs/results/lenet/terngrad-2w/summary.json").read_text())[
        "config"
    ]  # written by terngrad 0.1: the exchange's options beside the run's
    cfg = TrainConfig.from_dict(saved)
    assert cfg.method == Method(exchange=Options(quantize_last=True, min_numel=0))
    assert cfg.method.name == "terngrad-last-min0"
    assert (cfg.seed, cfg.timeout) == (0, 300.0)  # the run's own, read from the exchange's
    assert (cfg.lr, cfg.total_batch_size, cfg.steps) == (0.01, 64, 10000)
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg
    written = cfg.to_dict()
    assert written["method"] == "terngrad-last-min0"  # the name is the spec
    assert written["method_settings"]["exchange"]["quantize_last"] is True  # every setting
    other = TrainConfig(out="y", method=cfg.method.under(topology="ps"), lr=0.5)
    assert cfg.diff(other, ignore=("out",)) == [
        "batch_size=64 instead of None",
        "lr=0.5 instead of 0.01",
        "lr_schedule='constant' instead of 'poly'",
        "method='terngrad-ps-last-min0' instead of 'terngrad-last-min0'",
        "steps=1000 instead of 10000",
        "total_batch_size=None instead of 64",
        "weight_decay=0.0 instead of 0.0005",
        "workers=4 instead of 2",
    ]
    assert TrainConfig(out="x").hook_options.timeout == 300.0
    # as 0.3 wrote them: the exchange nested, the seed and timeout in its options
    old = {
        k: v
        for k, v in written.items()
        if k not in ("method", "method_settings", "seed", "timeout", "full_precision_steps")
    }
    old["exchange"] = {**cfg.method.exchange.to_dict(), "seed": 7, "timeout": 60}
    moved = TrainConfig.from_dict(old)
    assert (moved.seed, moved.timeout, moved.method) == (7, 60, cfg.method)
    assert moved.hook_options.seed == 7
    # as the last version wrote them: the method's parts as fields of the run
    local = {**old, "exchange": {"error_feedback": True}, "local_steps": 8, "outer_lr": 0.5,
             "outer_momentum": 0.9, "outer_overlap": True, "max_comm_share": 0.1, "steps": 80,
             "eval_every": 8, "baseline": None, "powersgd_rank": 2}  # fmt: skip
    assert TrainConfig.from_dict(local).method.name == "terngrad-ef-local8-olr0.5-overlap"
    frozen = {**old, "exchange": {"quantizer_options": {"bucket_size": 512}, "error_feedback":
              True}, "optimizer": "frozen-adamw", "freeze_after": 2000}  # fmt: skip
    read = TrainConfig.from_dict(frozen)
    assert (read.method.name, read.freeze_after, read.optimizer) == (
        "terngrad-b512-ef-frozen0.2", 2000, "adamw")  # fmt: skip
    powersgd = {**old, "baseline": "powersgd", "powersgd_rank": 8}
    assert TrainConfig.from_dict(powersgd).method.name == "powersgd-r8"


def test_warmup_epochs_count_the_training_set_over_all_workers():
    from terngrad.train import schedule

    epoch = schedule.steps_per_epoch(60_000, workers=4, worker_batch=64)
    assert epoch == 235  # ceil(60000 / 256)
    assert schedule.warmup_length(0, 5.0, epoch) == 1175
    assert schedule.warmup_length(7, 0.0, epoch) == 7
    factor = schedule.lr_factor("constant", steps=2000, power=0.5, warmup=1175)
    assert factor(0) == pytest.approx(0.1)
    assert factor(1175 // 2) == pytest.approx(0.1 + 0.9 * 587 / 1175)
    assert factor(1175) == factor(1999) == 1.0
    poly = schedule.lr_factor("poly", steps=10, power=1.0, warmup=4)  # the two multiply
    assert [poly(k) for k in (0, 2, 4, 8)] == pytest.approx([0.1, 0.55 * 0.8, 0.6, 0.2])
    with pytest.raises(ValueError, match="not both"):
        TrainConfig(out="x", warmup_steps=10, warmup_epochs=1.0)
    for bad in ({"warmup_steps": -1}, {"warmup_steps": 2.5}, {"warmup_epochs": float("nan")}):
        with pytest.raises(ValueError, match="warmup"):
            TrainConfig(out="x", **bad)


def test_bad_values_are_refused_by_the_python_api_too():
    from terngrad.ddp import Options
    from terngrad.train.config import TrainConfig

    for field, value in [("lr", math.inf), ("lr", math.nan), ("momentum", -1.0),
                         ("weight_decay", math.inf), ("lr_power", math.inf), ("dropout", 1.5),
                         ("dropout", math.nan), ("out", "")]:  # fmt: skip
        with pytest.raises(ValueError, match=field.replace("_", "-")):
            TrainConfig(**{"out": "x", field: value})
    for timeout in (math.inf, 1e30, math.nan):
        with pytest.raises(ValueError, match="timeout must be a positive number of seconds"):
            Options(timeout=timeout)


def test_a_run_of_each_method_says_that_method_whole():
    """``summary.json``'s ``method`` held the quantizer's name alone (``terngrad`` for
    ``terngrad-ef-local16``): the run carries its whole method, and writes its name."""
    from terngrad.comm.spec import methods

    base = TrainConfig(optimizer="adamw", steps=1200, eval_every=400, out="x")
    for name in methods.METHODS:
        cfg = base.replace(method=name)
        assert cfg.to_dict()["method"] == name and TrainConfig.from_dict(cfg.to_dict()) == cfg
