"""The one table of methods: a method is a spec named by one rule, older names still work (with a
warning), every consumer honours a method whole or refuses it in one line, and an experiment's
protocol goes over a method without changing what its name says."""

import warnings

import pytest

from terngrad import quantize
from terngrad.bench import network, overhead, perf_model, study
from terngrad.comm import Options
from terngrad.comm.spec import methods
from terngrad.comm.spec.methods import FrozenVariance, LocalVariance, Method
from terngrad.train.config import TrainConfig
from terngrad.train.configure import configure


def test_every_name_is_the_spec_it_says_and_reads_back():
    assert len(methods.METHODS) >= 34  # the table of 4b4effb, under one rule
    for name, m in methods.METHODS.items():
        assert m.name == name and methods.parse(name) == m and m.label, name
        assert (m.baseline is None) != (m.exchange is None), name
        if m.exchange is not None:
            assert m.exchange.seed == 0 and m.exchange.timeout is None
    t = methods.METHODS
    assert t["terngrad"].exchange == Options()  # the hook's defaults, nothing else
    assert t["terngrad-b512"].exchange == Options(quantizer_options={"bucket_size": 512})
    assert t["qsgd-5"].exchange.make_quantizer().options == quantize.get("qsgd").options
    assert t["signsgd"].exchange.make_quantizer().bucket_size is None
    assert t["signsgd-b512"].exchange.make_quantizer().bucket_size == 512
    assert t["powersgd"].one_bucket and not t["fp32"].one_bucket
    assert t["fp32-sharded"].exchange == Options("fp32")  # fp32 through terngrad's exchange
    local = t["terngrad-b512-last-min0-ef-localvar100"]
    assert local.exchange == Options(
        quantize_last=True, min_numel=0, error_feedback=True,
        quantizer_options={"bucket_size": 512},
    )  # fmt: skip
    assert local.recipe == LocalVariance(100) and local.warmup == 0
    assert t["terngrad-b512-ef-frozen0.2"].recipe == FrozenVariance(0.2)
    assert t["terngrad-warmup0.2"].warmup == 0.2
    assert t["terngrad-own-scales-fused"].exchange == Options(
        topology="own-scales", fuse_buckets=True
    )
    diloco = t["terngrad-ef-local16"]  # local steps: DiLoCo with ternary outer gradients
    assert diloco.local_steps == 16 and diloco.exchange == Options(error_feedback=True)
    assert t["fp32-sharded-local16"].exchange == Options("fp32")
    overlap = t["terngrad-ef-local16-overlap"]  # the outer exchange behind the inner steps
    assert overlap.outer_overlap and overlap.local_steps == 16
    auto = methods.get("terngrad-ef-localauto")  # H chosen at run time
    assert auto.local_steps == "auto" and auto.name == "terngrad-ef-localauto"


def test_a_new_method_is_one_name_and_defaults_are_left_out():
    m = methods.get("terngrad-own-scales-b256")  # not in the table: the rule reads it
    assert m.exchange == Options(topology="own-scales", quantizer_options={"bucket_size": 256})
    assert m.label == (
        "TernGrad, each rank's own scales (one collective a bucket), a scale per 256 elements"
    )
    # one spec, one form: options at the quantizer's defaults are not part of the name
    same = Method(exchange=Options(quantizer_options={"clip": 2.5, "bucket_size": None}))
    assert same == methods.METHODS["terngrad"] and same.name == "terngrad"
    assert Method(exchange=Options("qsgd")).name == "qsgd-5"  # levels always written
    fitted = methods.get("qsgd-3-ef-fit-local8")
    assert fitted.exchange == Options(
        "qsgd", quantizer_options={"levels": 3}, error_feedback=True, fit_scale=True
    )
    assert fitted.local_steps == 8 and "digits valued by a least-squares fit" in fitted.label


@pytest.mark.parametrize(
    "name, why",
    [
        ("terngrad-sharded", "is written 'terngrad'"),  # the default topology is left out
        ("terngrad-ef-b512", r"bucket size \(b512\) comes before error feedback"),
        ("terngrad-foo", "unknown part 'foo'"),
        ("fp32-ef", "name its topology"),  # fp32 alone is PyTorch's all-reduce
        ("powersgd-b512", "PyTorch's PowerSGD takes one setting, its rank: powersgd-r<K>"),
        ("powersgd-r2", "is written 'powersgd'"),  # rank 2 is powersgd's own
        ("powersgd-r0", "powersgd_rank must be an integer >= 1, got 0"),
        ("topk", "unknown method 'topk'"),
        ("terngrad-own", "unknown part 'own'"),  # its older name is get()'s alias, not the rule's
        ("terngrad-clip2.5", "is written 'terngrad'"),
        ("terngrad-5", "levels"),  # TernGrad has no levels option
        ("bingrad-b-own-scales", "own-scales' averages the shared-grid quantizers"),
        ("terngrad-local16-ef", r"error feedback \(ef\) comes before local steps"),
        ("terngrad-fit-ef", r"error feedback \(ef\) comes before fitted scale"),
        ("terngrad-fit", "fit_scale shrinks what is sent"),
        ("qsgd-5-ef-fit", "qsgd with 5 levels is not"),
        ("terngrad-local4-localvar100", "no optimizer recipe, warm-up, fused buckets"),
        ("terngrad-fused-local4", "no optimizer recipe, warm-up, fused buckets"),
        ("terngrad-local1", "is written 'terngrad'"),
        ("terngrad-overlap", "outer_overlap overlaps the outer exchange of local steps"),
        ("terngrad-overlap-local4", r"local steps \(local4\) comes before overlap"),
        ("terngrad-localauto0", "unknown part 'localauto0'"),
    ],
)
def test_names_off_the_rule_are_refused_in_one_line(name, why):
    with pytest.raises(ValueError, match=why) as caught:
        methods.parse(name)
    assert "\n" not in str(caught.value)


def test_older_names_warn_and_are_the_methods_they_always_were():
    renamed = {
        "qsgd": "qsgd-5", "orq": "orq-5", "terngrad-own": "terngrad-own-scales",
        "terngrad-own-fused": "terngrad-own-scales-fused", "terngrad-fp": "terngrad-warmup0.2",
        "terngrad-b512-fp": "terngrad-b512-warmup0.2",
        "terngrad-momentum": "terngrad-b512-ef-frozen0.2",
        "fp32-localvar": "fp32-sharded-localvar100",
        "terngrad-localvar": "terngrad-b512-ef-localvar100",
        "terngrad-localvar-all": "terngrad-b512-last-min0-ef-localvar100",
        "terngrad-localvar-all-noclip": "terngrad-b512-noclip-last-min0-ef-localvar100",
        "transformer": "terngrad-b512",
    }  # fmt: skip
    assert dict(methods.ALIASES) == renamed
    for old, new in renamed.items():
        with pytest.warns(FutureWarning, match=f"method {old} is now called {new}"):
            assert methods.get(old) is methods.METHODS[new]
        assert methods.canonical(old) == new  # results written before: read quietly
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert methods.canonical("terngrad") == "terngrad"


def test_select_refusals():
    with pytest.warns(FutureWarning), pytest.raises(ValueError, match="given twice: qsgd-5"):
        methods.select(["qsgd", "qsgd-5"])
    with pytest.raises(ValueError, match="fp16: not a method of this comparison; choose from"):
        methods.select(["fp16"], ["fp32"])
    with pytest.raises(ValueError, match="give at least one method"):
        methods.select([])
    with pytest.raises(ValueError, match="either a PyTorch baseline or terngrad's exchange"):
        Method()
    with pytest.raises(ValueError, match="leaves the run's settings at their defaults"):
        Method(exchange=Options(seed=3))


def test_powersgd_names_its_rank_and_the_run_takes_it():
    """``powersgd-r8``: PyTorch's PowerSGD of rank 8, in the name, the words, the run's config
    and its summary's method; the rank belongs to PowerSGD alone."""
    m = methods.parse("powersgd-r8")
    assert (m.baseline, m.powersgd_rank, m.name) == ("powersgd", 8, "powersgd-r8")
    assert m.one_bucket and "rank 8" in m.label and "rank 2" in methods.get("powersgd").label
    cfg = configure(m, TrainConfig(out="x"), "out")
    assert (cfg.baseline, cfg.powersgd_rank, cfg.method) == ("powersgd", 8, "powersgd-r8")
    hooked = configure(methods.get("terngrad"), cfg, "out")  # the rank does not follow
    assert hooked.powersgd_rank == methods.POWERSGD_RANK and hooked.baseline is None
    with pytest.raises(ValueError, match="powersgd_rank is PowerSGD's rank; fp16 has none"):
        Method(baseline="fp16", powersgd_rank=4)
    with pytest.raises(ValueError, match="terngrad's hook has none"):
        Method(exchange=Options(), powersgd_rank=4)
    with pytest.raises(ValueError, match="powersgd-rank is PowerSGD's rank: give --baseline"):
        TrainConfig(out="x", powersgd_rank=4)


def test_configure_puts_the_protocol_over_the_method():
    base = TrainConfig(out="runs/x", steps=100, seed=3)
    every_tensor = {"quantize_last": True, "min_numel": 0, "quantizer_options": {"clip": None}}
    b512 = configure(methods.get("terngrad-b512"), base, "runs/x/b512", every_tensor)
    options = {"bucket_size": 512, "clip": None}
    assert b512.exchange == Options(quantize_last=True, min_numel=0, quantizer_options=options)
    assert (b512.out, b512.seed, b512.baseline) == ("runs/x/b512", 3, None)
    fp32 = configure(methods.get("fp32"), base.replace(exchange=b512.exchange), "runs/x/fp32")
    assert fp32.baseline == "fp32" and fp32.exchange == Options()  # unused: the defaults
    warm = methods.get("terngrad-warmup0.2")
    assert configure(warm, base, "o").exchange.full_precision_steps == 20  # a fifth of the run
    assert configure(warm, base, "o", None, 7).exchange.full_precision_steps == 7
    assert configure(methods.get("terngrad"), base, "o").exchange.full_precision_steps == 0


def test_recipes_set_the_optimizer_and_need_adamw():
    base = TrainConfig(out="runs/x", model="mlp", optimizer="adamw", steps=100)
    cfg = configure(methods.get("terngrad-b512-ef-frozen0.2"), base, "runs/x/m")
    assert (cfg.optimizer, cfg.freeze_after) == ("frozen-adamw", 20)
    assert cfg.exchange.error_feedback and cfg.exchange.quantizer_options["bucket_size"] == 512
    cfg = configure(methods.get("terngrad-b512-ef-localvar100"), base, "runs/x/l")
    assert (cfg.optimizer, cfg.variance_sync, cfg.freeze_after) == ("local-adamw", 100, 0)
    local = configure(methods.get("terngrad-ef-local4"), base.replace(eval_every=20), "o")
    assert (local.local_steps, local.optimizer) == (4, "adamw") and local.exchange.error_feedback
    assert configure(methods.get("fp32"), local, "o").local_steps == 1  # PyTorch's: every step
    assert configure(methods.get("terngrad-b512"), base, "o").optimizer == "adamw"  # untouched
    for name in ("terngrad-b512-ef-frozen0.2", "terngrad-b512-ef-localvar100"):
        with pytest.raises(ValueError, match="exchanges AdamW's momentum; this run's optimizer"):
            configure(methods.get(name), base.replace(optimizer="momentum"), "o")


# --------------------------------------------------------------------------- the consumers


def test_bench_network_runs_baselines_and_the_hook_and_refuses_the_rest():
    assert network.honoured(methods.get("powersgd")).name == "powersgd"
    assert network.honoured(methods.get("terngrad-own-scales-fused")).name
    with pytest.raises(ValueError, match=r"bench network cannot run method terngrad-warmup0\.2: "
                       "it does not run a full-precision warm-up"):  # fmt: skip
        network.honoured(methods.get("terngrad-warmup0.2"))
    with pytest.raises(ValueError, match="does not run the optimizer recipe"):
        network.honoured(methods.get("terngrad-b512-ef-localvar100"))
    with pytest.raises(ValueError, match="does not run local steps"):
        network.honoured(methods.get("terngrad-ef-local16"))


def test_bench_overhead_refuses_powersgd_recipes_and_warm_ups():
    for name in (
        "powersgd",
        "terngrad-warmup0.2",
        "terngrad-b512-ef-frozen0.2",
        "terngrad-ef-local16",
    ):
        with pytest.raises(ValueError, match=f"bench overhead cannot run method {name}"):
            overhead.measure("mlp", methods=["fp32", name])
    assert overhead.honoured(methods.get("fp16")).name == "fp16"


def test_the_study_measures_a_quantizer_alone_and_refuses_more():
    for name in study.DEFAULT_METHODS:
        q_name, options = study.check_methods([name])[name]
        assert quantize.get(q_name, **options).options == methods.get(name).quantizer().options
    for name, why in (
        ("powersgd", "it does not run PyTorch's powersgd"),
        ("terngrad-ef", "it measures the quantizer alone, not error_feedback=True"),
        ("terngrad-ps", "it measures the quantizer alone, not topology='ps'"),
        ("terngrad-warmup0.2", "it does not run a full-precision warm-up"),
        ("terngrad-local16", "it does not run local steps"),
    ):
        with pytest.raises(ValueError, match=f"the study cannot run method {name}: {why}"):
            study.check_methods([name])


def test_the_performance_model_covers_every_method_of_the_table():
    for name in methods.METHODS:
        assert perf_model.modelled(name), name
    with pytest.raises(ValueError, match="the performance model cannot run method "
                       "terngrad-auto: policy 'auto' chooses per bucket"):  # fmt: skip
        perf_model.method("terngrad-auto")
    with pytest.raises(ValueError, match="coherent levels"):
        perf_model.method("orq-5-coherent")


def test_the_hook_takes_a_method_of_its_own_with_settings_over_it():
    opts = methods.hook_options(method="terngrad-b512", seed=3, clip=2.0)
    assert opts == Options(seed=3, quantizer_options={"bucket_size": 512, "clip": 2.0})
    assert methods.hook_options("qsgd", "ps", method="terngrad-b512") == Options(
        "qsgd", topology="ps", quantizer_options={"bucket_size": 512}
    )
    with pytest.warns(FutureWarning, match="preset= is deprecated: use method="):
        assert methods.hook_options(preset="transformer") == methods.hook_options(
            method="terngrad-b512"
        )
    for name, why in (
        ("fp16", "it does not run PyTorch's fp16"),
        ("terngrad-b512-ef-localvar100", "it does not run the optimizer recipe"),
        ("terngrad-warmup0.2", "it does not run a full-precision warm-up"),
        ("terngrad-ef-local16", "it does not run local steps"),
    ):
        with pytest.raises(ValueError, match=f"the terngrad hook cannot run method {name}: {why}"):
            methods.hook_options(method=name)
