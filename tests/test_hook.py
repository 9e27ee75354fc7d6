"""The (state, hook) pair in PyTorch's convention, its options, and the full-precision path's
dtypes: real gloo ranks."""

from __future__ import annotations

import hook_workers as w
import pytest
import torch
from distributed import run

import terngrad.ddp
from terngrad.comm import Options
from terngrad.quantize import get


def test_an_unbound_pair_trains_like_register():
    ranks = run(w.pair_against_register, 2)
    for r in ranks:
        assert r["pair_built_at_first_use"]
        a, b = r["register"], r["pair"]
        assert a["stats"] == b["stats"] and a["stats"].steps == 6
        assert a["excluded"] == b["excluded"] == ["0.bias", "2.bias", "2.weight"]
        for x, y in zip(a["params"], b["params"], strict=True):
            assert torch.equal(x, y)
    for x, y in zip(ranks[0]["pair"]["params"], ranks[1]["pair"]["params"], strict=True):
        assert torch.equal(x, y)  # identical replicas


def test_a_second_registration_is_refused_before_anything_is_built():
    for r in run(w.second_registration, 2):
        assert "already has a communication hook (hook)" in r["errors"][0]
        assert "(BuiltinCommHookType.FP16_COMPRESS)" in r["errors"][1]  # a C++ hook too
        assert r["groups_made"] == 0


def test_a_failed_first_use_fails_again_without_building_twice():
    for r in run(w.failed_first_use, 2):
        first, second = r["errors"]
        assert "saved with another configuration" in first
        assert second != "no error"  # (DDP itself may fail first: its reducer saw the error)
        assert r["groups_made"] == 1  # the state was not built a second time


def test_full_precision_keeps_the_parameters_dtype():
    for r in run(w.full_precision_dtypes, 2):
        bf16, fp32, fp64 = r["torch.bfloat16"], r["torch.float32"], r["torch.float64"]
        assert bf16["bytes_per_step"] == bf16["expected"]  # 2 bytes an element, not 4
        assert fp64["bytes_per_step"] == fp64["expected"]
        assert fp32["bytes_per_step"] == fp32["expected"]
        assert bf16["bytes_per_step"] * 2 == fp32["bytes_per_step"]
        assert fp64["drift"] < 1e-13  # against PyTorch's own DDP (float32 would be ~1e-9)
        assert bf16["param_dtypes"] == {"torch.bfloat16"}


def test_a_state_loaded_before_first_use_goes_on_from_it():
    for r in run(w.load_before_first_use, 2):
        assert r["pending_kept"]
        assert r["steps"] == 5
        assert r["residuals"]  # error feedback restored and updated


def test_compiled_ddp_python_reducer_is_refused_clearly():
    for r in run(w.python_reducer, 1):
        for how in ("register", "pair"):
            assert "python_reducer" in r[how] and "optimize_ddp=True" in r[how], r[how]


def test_a_state_no_gradient_went_through_says_so():
    for messages in run(w.unused_state_warns, 2):
        assert len(messages) == 1  # the dropped one; not the one that trained


def test_the_state_is_made_without_a_process_group():
    state = terngrad.ddp.State(quantizer="qsgd", levels=5, error_feedback=True)
    assert state.options == Options(
        quantizer="qsgd", quantizer_options={"levels": 5}, error_feedback=True
    )
    assert state.reducer is None and state.stats.steps == 0 and not state.last_step_skipped
    with pytest.raises(RuntimeError, match="has not been used yet"):
        state.state_dict()
    with pytest.raises(ValueError, match="unknown topology 'ring'"):
        terngrad.ddp.State(topology="ring")
    with pytest.raises(ValueError, match="not both"):
        terngrad.ddp.State("qsgd", options=Options())
    with pytest.raises(TypeError, match=r"takes a terngrad\.ddp\.State"):
        terngrad.ddp.hook(object(), None)
    with pytest.raises(TypeError, match="DistributedDataParallel"):
        terngrad.ddp.register(torch.nn.Linear(2, 2))


def test_binding_a_state_to_a_second_model_is_refused():
    state = terngrad.ddp.State(model=torch.nn.Linear(3, 3))
    with pytest.raises(RuntimeError, match="one State per model"):
        state.bind(torch.nn.Linear(3, 3))


# --------------------------------------------------------------------------- options


def test_options_split_fields_from_quantizer_options():
    opts = Options.of("terngrad", "ps", clip=2.0, bucket_size=512, min_numel=0, seed=7)
    assert opts.quantizer_options == {"clip": 2.0, "bucket_size": 512}
    assert (opts.topology, opts.min_numel, opts.seed) == ("ps", 0, 7)
    assert Options(**opts.to_dict()) == opts
    assert Options.of(get("qsgd", levels=9)) == Options(
        quantizer="qsgd", quantizer_options=get("qsgd", levels=9).options
    )
    with pytest.deprecated_call():
        assert Options.of(exclude_last=False).quantize_last


def test_presets_are_options_with_settings_over_them():
    from terngrad.comm.options import PRESETS

    preset = PRESETS["transformer"]
    opts = Options.preset("transformer")
    assert Options(**{**Options().to_dict(), **preset}) == opts  # exactly the preset's fields
    # settings go over it: fields by name, other keywords into the quantizer's options
    over = Options.preset("transformer", seed=3, clip=2.0, bucket_size=2048)
    assert (over.seed, over.quantizer_options["clip"], over.quantizer_options["bucket_size"]) == (
        3, 2.0, 2048)  # fmt: skip
    assert over.diff(opts, ignore=("seed", "quantizer_options")) == []
    # the hook's flat keywords (register, State, Lightning, accelerate) take preset= too
    assert Options.of(preset="transformer") == opts
    assert Options.of("terngrad", "ps", preset="transformer") == opts.replace(topology="ps")
    with pytest.raises(ValueError, match="unknown preset 'bert'; choose one of: transformer"):
        Options.preset("bert")
    with pytest.raises(ValueError, match="give the quantizer by name"):
        Options.of(get("qsgd"), preset="transformer")


def test_options_say_how_they_differ():
    a = Options()
    b = Options.of("terngrad", "ps", clip=2.0, error_feedback=True)
    assert a.diff(b) == [
        "error_feedback=True instead of False",
        "quantizer_options.clip=2.0 instead of None",
        "topology='ps' instead of 'sharded'",
    ]
    assert a.diff(a.replace(kernels="torch"), ignore=("kernels",)) == []


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"quantizer": "ternary"}, "unknown quantizer 'ternary'"),
        ({"quantizer_options": {"levels": 3}}, "has no option 'levels'"),
        ({"topology": "ring"}, "unknown topology"),
        ({"kernels": "cuda"}, "unknown kernels"),
        ({"policy": "always"}, "unknown policy"),
        ({"quantizer": "linear", "policy": "auto"}, "shared-grid"),
        ({"aggregate": "fp8"}, "unknown aggregate"),
        ({"error_feedback": 1}, "error_feedback must be True or False"),
        ({"min_numel": -1}, "min-numel must be an integer >= 0"),
        ({"min_numel": 1.5}, "min-numel"),
        ({"seed": 2**63}, "seed must be an integer"),
        ({"seed": -(2**63) - 1}, "seed"),
        ({"timeout": 0}, "timeout must be a positive number"),
        ({"timeout": float("inf")}, "timeout"),
        ({"timeout": float("nan")}, "timeout"),
    ],
)
def test_options_refuse_bad_values_in_one_line(change, message):
    with pytest.raises(ValueError, match=message) as exc:
        Options(**change)
    assert "\n" not in str(exc.value)
