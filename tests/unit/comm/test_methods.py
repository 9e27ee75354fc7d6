"""The one table of methods: a method is a spec named by one rule, older names still work (with a
warning), every consumer honours a method whole or refuses it in one line, and an experiment's
protocol goes over a method without changing what its name says."""

import re
import warnings

import pytest

from terngrad import quantize
from terngrad.bench import network, overhead, perf_model, study
from terngrad.comm import Options
from terngrad.comm.spec import methods
from terngrad.comm.spec.local import LocalSteps
from terngrad.comm.spec.methods import FrozenVariance, LocalVariance, Method
from terngrad.train.config import TrainConfig


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


def test_local_steps_are_one_settings_object_named_in_full():
    """Every setting of local steps is in the name (defaults left out) and reads back."""
    m = methods.get("terngrad-ef-local8-olr0.5-om0.5-overlap")
    assert m.local == LocalSteps(8, overlap=True, outer_lr=0.5, outer_momentum=0.5)
    assert m.local.nesterov is True  # put in its one form where made
    assert "outer lr 0.5, outer momentum 0.5" in m.label
    assert methods.get("terngrad-local4-om0").local == LocalSteps(4, outer_momentum=0.0)
    assert methods.get("terngrad-local4-om0").local.nesterov is False
    heavy = methods.get("terngrad-local4-heavyball")
    assert heavy.local == LocalSteps(4, nesterov=False) and "heavy-ball" in heavy.label
    auto = methods.get("terngrad-localauto-share0.2")
    assert auto.local == LocalSteps("auto", max_comm_share=0.2)
    for local in (LocalSteps(2, outer_lr=1.0, outer_momentum=0.0), LocalSteps("auto", True),
                  LocalSteps(500, outer_lr=0.05, nesterov=False)):  # fmt: skip
        made = Method(exchange=Options(), local=local)
        assert methods.parse(made.name) == made, made.name
    with pytest.raises(ValueError, match="nesterov needs outer_momentum > 0"):
        LocalSteps(4, outer_momentum=0.0, nesterov=True)
    with pytest.raises(ValueError, match="outer-lr must be a positive finite number"):
        LocalSteps(4, outer_lr=0)


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
        ("terngrad-local1", "local steps of H = 1 are the exchange every step"),
        ("terngrad-overlap", "is written 'terngrad-local16-overlap'"),
        ("terngrad-olr0.5", "is written 'terngrad-local16-olr0.5'"),
        ("terngrad-local4-om0-heavyball", "is written 'terngrad-local4-om0'"),
        ("terngrad-local4-share0.2", "max_comm_share is the share local_steps='auto' chooses"),
        ("terngrad-local4-om0.5-olr0.5", r"outer lr \(olr0.5\) comes before outer momentum"),
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
    cfg = TrainConfig(out="x", method=m)
    assert (cfg.method.baseline, cfg.method.powersgd_rank, cfg.method.name) == (
        "powersgd", 8, "powersgd-r8")  # fmt: skip
    assert TrainConfig.from_dict(cfg.to_dict()).method == m
    with pytest.raises(ValueError, match="powersgd_rank is PowerSGD's rank; fp16 has none"):
        Method(baseline="fp16", powersgd_rank=4)
    with pytest.raises(ValueError, match="terngrad's hook has none"):
        Method(exchange=Options(), powersgd_rank=4)


def test_an_experiments_protocol_goes_over_the_method():
    base = TrainConfig(out="runs/x", steps=100, seed=3)
    every_tensor = {"quantize_last": True, "min_numel": 0, "quantizer_options": {"clip": None}}
    b512 = base.replace(
        out="runs/x/b512", method=methods.get("terngrad-b512").under(**every_tensor)
    )
    options = {"bucket_size": 512, "clip": None}
    assert b512.hook_options == Options(quantize_last=True, min_numel=0, quantizer_options=options,
                                        seed=3, timeout=base.timeout)  # fmt: skip
    assert b512.method.name == "terngrad-b512-noclip-last-min0"
    assert methods.get("fp32").under(**every_tensor) == methods.get("fp32")  # PyTorch's own
    warm = methods.get("terngrad-warmup0.2")
    assert base.replace(method=warm).full_precision_steps == 20  # a fifth of the run
    assert base.replace(method=warm, full_precision_steps=7).hook_options.full_precision_steps == 7
    assert base.replace(method="terngrad").full_precision_steps == 0
    assert base.replace(method=warm).replace(method="terngrad").full_precision_steps == 0


def test_recipes_set_the_optimizer_and_need_adamw():
    base = TrainConfig(out="runs/x", model="mlp", optimizer="adamw", steps=100)
    cfg = base.replace(method="terngrad-b512-ef-frozen0.2")
    assert (cfg.optimizer_recipe, cfg.freeze_after) == ("frozen-adamw", 20)
    assert (
        cfg.hook_options.error_feedback and cfg.hook_options.quantizer_options["bucket_size"] == 512
    )
    cfg = base.replace(method="terngrad-b512-ef-localvar100")
    assert (cfg.optimizer_recipe, cfg.freeze_after) == ("local-adamw", None)
    local = base.replace(method="terngrad-ef-local4", eval_every=20)
    assert (local.method.local_steps, local.optimizer_recipe) == (4, "adamw")
    assert base.replace(method="terngrad-b512").optimizer_recipe == "adamw"  # untouched
    for name in ("terngrad-b512-ef-frozen0.2", "terngrad-b512-ef-localvar100"):
        with pytest.raises(ValueError, match=r"exchanges AdamW.s momentum .*give optimizer adamw"):
            base.replace(method=name, optimizer="momentum")
    with pytest.raises(ValueError, match="freeze_after is the steps before a frozen variance"):
        base.replace(freeze_after=3)


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
    # (qsgd's own bucket is 512: the method with it is qsgd-5-ps)
    assert (
        methods.hook_options("qsgd", "ps", method="terngrad-b512")
        == methods.get("qsgd-5-ps").options()
    )
    # a setting the method sets otherwise is refused (the rule of every consumer), not put over
    for keywords, line in (
        ({"bucket_size": 64}, "bucket_size 64 is not what terngrad-b512 runs (bucket_size 512); "
         "the method that does is terngrad-b64: name it, or leave out bucket_size"),
        ({"quantizer": "qsgd", "levels": 9}, None),
    ):  # fmt: skip
        if line is None:
            assert methods.hook_options(method="terngrad-b512", **keywords).quantizer == "qsgd"
            continue
        with pytest.raises(ValueError, match=re.escape(line)):
            methods.hook_options(method="terngrad-b512", **keywords)
    with pytest.raises(ValueError, match=re.escape("quantizer qsgd is not what orq-5 runs")):
        methods.hook_options("qsgd", method="orq-5")
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


def test_settings_over_a_method_add_what_it_leaves_and_refuse_what_it_says():
    """The one rule (``terngrad.comm.spec.over``): a setting the method leaves at its default
    is added and named; one it sets otherwise is refused in one line naming the method that
    runs it; PyTorch's baselines take no exchange or local-steps setting."""
    from terngrad.comm.spec.over import over

    local16 = methods.get("terngrad-local16")
    assert over(local16, local={"outer_lr": 0.5}).name == "terngrad-local16-olr0.5"
    assert over(local16, local={"nesterov": False}).name == "terngrad-local16-heavyball"
    assert over(local16, local={"outer_momentum": 0.0}).name == "terngrad-local16-om0"
    assert over(methods.get("terngrad-ef"), local={"every": 8}).name == "terngrad-ef-local8"
    b512 = methods.get("terngrad-b512")
    assert over(b512, {"error_feedback": True}).name == "terngrad-b512-ef"
    assert over(b512, {"quantizer_options": {"clip": None}}).name == "terngrad-b512-noclip"
    assert over(b512, {"quantizer_options": {"bucket_size": 512}}) == b512  # the same: taken
    refused = [
        (local16, {}, {"every": 8}, "every 8 is not what terngrad-local16 runs (every 16); the "
         "method that does is terngrad-local8"),
        (methods.get("terngrad-local16-heavyball"), {}, {"nesterov": True}, "the method that "
         "does is terngrad-local16"),
        (b512, {"quantizer_options": {"bucket_size": 64}}, {}, "the method that does is "
         "terngrad-b64"),
        (methods.get("terngrad-ef"), {}, {"outer_lr": 0.5}, "outer_lr 0.5 is a setting of local "
         "steps, and terngrad-ef has none"),
        (methods.get("fp32"), {"error_feedback": True}, {}, "fp32 is PyTorch's own averaging: "
         "it takes no error_feedback"),
    ]  # fmt: skip
    for method, exchange, local, words in refused:
        with pytest.raises(ValueError) as caught:
            over(method, exchange, local)
        assert words in str(caught.value) and "\n" not in str(caught.value), words
