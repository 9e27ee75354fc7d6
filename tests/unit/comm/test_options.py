"""The exchange's options and the hook's state before any process group: ``Options`` split from
the quantizer's options, presets, differences, bad values in one line; a ``State`` made
without a collective."""

from __future__ import annotations

import pytest
import torch

import terngrad.ddp
from terngrad.comm import Options
from terngrad.comm.agreement import check_saved_config
from terngrad.quantize import get


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
        ({"own_scales": True}, "own_scales needs topology 'allgather'"),
        ({"own_scales": True, "topology": "allgather", "quantizer": "linear"}, "no shared grid"),
        ({"own_scales": True, "topology": "allgather", "policy": "auto"}, "policy 'auto'"),
        ({"own_scales": "yes"}, "own_scales must be True or False"),
    ],
)
def test_options_refuse_bad_values_in_one_line(change, message):
    with pytest.raises(ValueError, match=message) as exc:
        Options(**change)
    assert "\n" not in str(exc.value)


def test_a_hook_state_saved_before_policy_and_own_scales_existed_loads():
    """Such a state had their defaults; one saved with other values is refused by name."""
    config = {"policy": "quantize", "own_scales": False, "seed": 0}
    check_saved_config(config, {"seed": 0})
    with pytest.raises(ValueError, match="own_scales"):
        check_saved_config({**config, "own_scales": True}, {"seed": 0})
