"""The one table of methods: a name means one thing everywhere, older names still work, and an
experiment's protocol goes over a method without changing what its name says."""

import pytest

from terngrad import quantize
from terngrad.bench import perf_model, study
from terngrad.comm import Options
from terngrad.train import methods
from terngrad.train.config import TrainConfig


def test_every_method_is_a_baseline_or_valid_hook_options():
    for name, m in methods.METHODS.items():
        assert m.name == name and m.label
        assert (m.baseline is None) != (m.exchange is None), name
        if m.exchange is not None:
            assert isinstance(m.exchange, Options) and m.exchange.seed == 0
    t = methods.METHODS
    assert t["terngrad"].exchange == Options()  # the hook's defaults, nothing else
    assert t["terngrad-b512"].exchange == Options(quantizer_options={"bucket_size": 512})
    assert t["qsgd-5"].exchange.make_quantizer().options == quantize.get("qsgd").options
    assert t["signsgd"].exchange.make_quantizer().bucket_size is None
    assert t["signsgd-b512"].exchange.make_quantizer().bucket_size == 512
    assert t["powersgd"].one_bucket and not t["fp32"].one_bucket


def test_older_names_and_refusals():
    assert methods.get("qsgd") is methods.METHODS["qsgd-5"]
    assert methods.get("orq").name == "orq-5"
    with pytest.raises(ValueError, match="unknown method 'topk'; choose from: fp32, fp16"):
        methods.get("topk")
    with pytest.raises(ValueError, match="methods given twice: qsgd-5"):
        methods.select(["qsgd", "qsgd-5"])
    with pytest.raises(
        ValueError, match="fp16: not a method of this comparison; choose from: fp32"
    ):
        methods.select(["fp16"], ["fp32"])
    with pytest.raises(ValueError, match="give at least one method"):
        methods.select([])
    with pytest.raises(ValueError, match="either a baseline or exchange options"):
        methods.Method("x", "x")


def test_configure_puts_the_protocol_over_the_method():
    base = TrainConfig(out="runs/x", steps=100, seed=3)
    every_tensor = {"quantize_last": True, "min_numel": 0, "quantizer_options": {"clip": None}}
    b512 = methods.get("terngrad-b512").configure(base, "runs/x/b512", every_tensor)
    options = {"bucket_size": 512, "clip": None}
    assert b512.exchange == Options(quantize_last=True, min_numel=0, quantizer_options=options)
    assert (b512.out, b512.seed, b512.baseline) == ("runs/x/b512", 3, None)
    fp32 = methods.get("fp32").configure(base.replace(exchange=b512.exchange), "runs/x/fp32")
    assert fp32.baseline == "fp32" and fp32.exchange == Options()  # unused: the defaults
    warm = methods.get("terngrad-fp").configure(base, "runs/x/fp")
    assert warm.exchange.full_precision_steps == 20  # a fifth of the run
    assert (
        methods.get("terngrad-fp").configure(base, "o", None, 7).exchange.full_precision_steps == 7
    )
    assert methods.get("terngrad").configure(base, "o").exchange.full_precision_steps == 0


def test_the_study_and_the_performance_model_read_the_same_table():
    for name in study.METHODS:
        q_name, options = study.check_methods([name])[name]
        assert quantize.get(q_name, **options).options == methods.get(name).quantizer().options
    assert methods.get("fp16").quantizer().name == "fp16"  # PyTorch's fp16 all-reduce casts
    assert methods.get("powersgd").quantizer() is None  # low rank: not a quantizer
    assert {"fp32", "fp16", "powersgd", "terngrad", "terngrad-ps", "qsgd-5"} <= set(
        perf_model.METHODS
    )
    assert "orq-5" not in perf_model.METHODS  # levels searched per bucket: not modelled
    assert perf_model.method("qsgd") is perf_model.METHODS["qsgd-5"]


def test_the_momentum_method_freezes_adamw_after_a_fifth_and_needs_adamw():
    base = TrainConfig(out="runs/x", model="mlp", optimizer="adamw", steps=100)
    cfg = methods.get("terngrad-momentum").configure(base, "runs/x/m")
    assert (cfg.optimizer, cfg.freeze_after) == ("frozen-adamw", 20)
    assert cfg.exchange.error_feedback and cfg.exchange.quantizer_options["bucket_size"] == 512
    assert methods.get("terngrad-b512").configure(base, "o").optimizer == "adamw"  # untouched
    with pytest.raises(ValueError, match="exchanges AdamW's momentum; this run's optimizer is"):
        methods.get("terngrad-momentum").configure(base.replace(optimizer="momentum"), "o")


def test_the_local_variance_method_takes_local_adamw_and_needs_adamw():
    base = TrainConfig(out="runs/x", model="mlp", optimizer="adamw", steps=100)
    cfg = methods.get("terngrad-localvar").configure(base, "runs/x/l")
    assert (cfg.optimizer, cfg.variance_sync, cfg.freeze_after) == ("local-adamw", 100, 0)
    assert cfg.exchange.error_feedback and cfg.exchange.quantizer_options["bucket_size"] == 512
    with pytest.raises(ValueError, match="exchanges AdamW's momentum; this run's optimizer is"):
        methods.get("terngrad-localvar").configure(base.replace(optimizer="sgd"), "o")


def test_variance_sync_belongs_to_local_adamw():
    from torch import nn

    from terngrad.optim import LocalVarianceAdamW
    from terngrad.train.setup import make_optimizer

    cfg = TrainConfig(out="runs/x", model="mlp", optimizer="local-adamw", variance_sync=7)
    optimizer = make_optimizer(cfg, nn.Linear(3, 2))
    assert isinstance(optimizer, LocalVarianceAdamW) and optimizer.sync_every == 7
    default = make_optimizer(cfg.replace(variance_sync=None), nn.Linear(3, 2))
    assert default.sync_every == 100
    with pytest.raises(ValueError, match="variance-sync is local-adamw's; optimizer 'adamw'"):
        TrainConfig(out="runs/x", model="mlp", optimizer="adamw", variance_sync=7)
