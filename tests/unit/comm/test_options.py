"""The exchange's options and the hook's state before any process group: ``Options`` split from
the quantizer's options, presets, differences, bad values in one line; a ``State`` made
without a collective."""

from __future__ import annotations

import pytest
import torch

import terngrad.ddp
from terngrad.comm import Options
from terngrad.comm.rank.agreement import check_saved_config
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


def test_own_scales_is_a_topology_and_its_older_spelling_still_works():
    own = Options(topology="own-scales")
    with pytest.deprecated_call(match="own_scales is deprecated: use topology='own-scales'"):
        assert Options.of("terngrad", "allgather", own_scales=True) == own
    # a config or state of an earlier version, own_scales among its fields
    assert Options.from_dict({**Options(topology="allgather").to_dict(), "own_scales": True}) == own
    assert Options.from_dict({**Options().to_dict(), "own_scales": False}) == Options()
    with pytest.raises(ValueError, match="own_scales=True went with topology 'allgather' only"):
        Options.from_dict({"own_scales": True})


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
        # which settings a topology takes is said by its class (Exchange.check)
        (
            {"topology": "own-scales", "quantizer": "linear"},
            r"topology 'own-scales' averages the shared-grid quantizers \(terngrad, qsgd\); "
            "linear is not one",
        ),
        (
            {"topology": "own-scales", "policy": "auto"},
            "policy 'auto' does not model topology 'own-scales'",
        ),
        ({"aggregate": "coherent"}, "aggregate 'coherent' serves the level quantizers"),
        ({"fuse_buckets": "yes"}, "fuse_buckets must be True or False"),
        ({"fit_scale": 1, "error_feedback": True}, "fit_scale must be True or False"),
        ({"fit_scale": True}, "fit_scale shrinks what is sent .* needs error_feedback=True"),
        (
            {"fit_scale": True, "error_feedback": True, "quantizer": "qsgd"},
            r"fit_scale fits ternary digits \(terngrad, qsgd with 3 levels\); qsgd with 5 "
            "levels is not",
        ),
        (
            {"fit_scale": True, "error_feedback": True, "quantizer": "signsgd"},
            "signsgd is not: leave fit_scale off",
        ),
    ],
)
def test_options_refuse_bad_values_in_one_line(change, message):
    with pytest.raises(ValueError, match=message) as exc:
        Options(**change)
    assert "\n" not in str(exc.value)


def test_a_hook_state_saved_before_policy_and_own_scales_existed_loads():
    """Such a state had their defaults; one saved with other values is refused by name; one
    saved with own_scales is of the topology own-scales."""
    config = {"policy": "quantize", "topology": "sharded", "seed": 0}
    check_saved_config(config, {"seed": 0, "topology": "sharded"})
    check_saved_config(config, {"seed": 0, "topology": "sharded", "own_scales": False})
    own = {**config, "topology": "own-scales"}
    check_saved_config(own, {"seed": 0, "topology": "allgather", "own_scales": True})
    with pytest.raises(ValueError, match="topology='allgather' instead of 'own-scales'"):
        check_saved_config(own, {"seed": 0, "topology": "allgather", "own_scales": False})
