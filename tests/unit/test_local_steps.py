"""The settings of local steps: the choice of H for ``local_steps="auto"`` against its formula,
the checks every entry point shares, and what the performance model says of auto."""

import pytest
import torch

from terngrad.bench import traffic_model
from terngrad.comm.spec.local import LocalSteps
from terngrad.local_steps import auto_h_choices, choose_local_steps, outer_sgd


def test_auto_takes_the_smallest_h_that_keeps_the_exchange_under_its_share():
    # exchange / (H step + exchange) <= share  <=>  H >= exchange (1 - share) / (share step)
    assert choose_local_steps(0.05, 0.5, 0.1, range(1, 501)) == 90
    assert choose_local_steps(0.05, 0.5, 0.5, range(1, 501)) == 10
    assert choose_local_steps(0.05, 0.5, 0.1, [5, 25, 125]) == 125
    assert choose_local_steps(0.05, 50.0, 0.1, [5, 25]) == 25  # none fits: the largest
    assert choose_local_steps(1.0, 0.01, 0.1, [1, 5]) == 1


@pytest.mark.parametrize(
    "bad, said",
    [
        ({"local_steps": True}, "local_steps must be an integer of at least 1"),
        ({"local_steps": "sometimes"}, "or 'auto', got 'sometimes'"),
        ({"outer_momentum": 1.0}, "outer-momentum must be a number from 0 up to"),
        ({"nesterov": True, "outer_momentum": 0.0}, "nesterov needs outer_momentum > 0"),
        ({"overlap": 1}, "overlap must be True or False, got 1"),
        ({"nesterov": "yes"}, "nesterov must be True or False, got 'yes'"),
        ({"local_steps": "auto", "max_comm_share": 0}, "max-comm-share must be a share in (0, 1)"),
        ({"local_steps": 8, "max_comm_share": 0.2}, "max_comm_share is the share local_steps="),
    ],
)
def test_bad_settings_are_one_line(bad, said):
    """:class:`LocalSteps` checks itself where it is made, from DiLoCo's keywords too."""
    with pytest.raises(ValueError) as caught:
        LocalSteps.of(**bad)
    assert said in str(caught.value) and "\n" not in str(caught.value)


def test_auto_choices_are_sorted_and_once_each():
    assert auto_h_choices([25, 5, 5, 1]) == [1, 5, 25]
    assert auto_h_choices(None)[-1] == 500
    for bad in ([], [4, 2.5]):
        with pytest.raises(ValueError, match="auto_choices must be a non-empty list"):
            auto_h_choices(bad)


def test_the_performance_model_refuses_an_h_chosen_at_run_time():
    with pytest.raises(ValueError, match="its H is chosen at run time"):
        traffic_model.transfers(None, "terngrad-ef-localauto", 4)


def test_the_outer_step_is_nesterovs_where_there_is_momentum_and_plain_sgd_without():
    anchor = [torch.zeros(2, requires_grad=True)]
    for momentum, nesterov, expected in ((0.9, None, True), (0.0, None, False),
                                         (0.9, False, False)):  # fmt: skip
        local = LocalSteps(outer_momentum=momentum, nesterov=nesterov)
        group = outer_sgd(anchor, local).param_groups[0]
        assert (group["lr"], group["momentum"], group["nesterov"]) == (0.7, momentum, expected)
    # a new momentum takes the default form with it, unless the form was given
    assert LocalSteps(4).replace(outer_momentum=0.0).nesterov is False
    assert LocalSteps(4, nesterov=False).replace(outer_momentum=0.5).nesterov is False


def test_diloco_s_defaults_are_written_once():
    """DiLoCo's outer rate, momentum and auto's share were written in five places: they are
    now :class:`LocalSteps`' defaults alone, and every entry point leaves a keyword out as
    ``None`` (the method's, else those defaults)."""
    import inspect

    from terngrad.diloco import DiLoCo

    pytest.importorskip("transformers", reason="transformers is not installed")
    pytest.importorskip("lightning")
    from terngrad.integrations import lightning, transformers

    for entry in (DiLoCo, lightning.TernGradCallback, transformers.TernGradCallback):
        for name in ("local_steps", "outer_lr", "outer_momentum", "nesterov", "overlap",
                     "max_comm_share"):  # fmt: skip
            default = inspect.signature(entry).parameters[name].default
            assert default is None, (entry.__name__, name, default)


def test_a_saved_diloco_state_has_one_check_in_one_wording():
    """``DiLoCo.load_state_dict`` and the trainer's checkpoint check (before any worker starts)
    run the same ``check_state``: each refusal one line, in the same words."""
    from terngrad.diloco.state import STATE_FORMAT, STATE_KEYS, check_state

    shapes = [(4, 3), (4,)]
    good = {"format": STATE_FORMAT, "local_steps": 8, "inner_steps": 16, "outer_steps": 2,
            "skipped_outer_steps": 0, "anchor": [torch.zeros(4, 3), torch.zeros(4)],
            "outer_optimizer": {}, "exchange": {}, "inner_optimizer": {}, "overlap": False,
            "pending": None, "auto": None}  # fmt: skip
    assert set(STATE_KEYS) <= set(good)
    check_state(good, shapes, 8, False)
    chose = {**good, "local_steps": 5, "outer_steps": 3, "auto": {"local_steps": 5}}
    check_state(chose, shapes, "auto", False, auto_choices=[1, 5, 25])
    bad = [
        ([1, 2], {}, "not a terngrad.diloco state: a list, not a dict"),
        ({**good, "format": 1}, {}, "not a terngrad.diloco state (or one of another format"),
        ({k: v for k, v in good.items() if k != "anchor"}, {}, "this terngrad.diloco state "
         "lacks anchor"),
        (good, {"local_steps": 16}, "saved with local_steps=8, not 16"),
        ({**good, "local_steps": 7}, {"local_steps": "auto"},
         "saved with local_steps=7, not 'auto'"),
        (good, {"overlap": True}, "saved with overlap=False, not True"),
        ({**good, "outer_steps": -1}, {}, "its 'outer_steps' is -1, not a whole number >= 0"),
        ({**good, "anchor": [torch.zeros(4, 3)]}, {}, "anchor is not one tensor per parameter"),
        ({**good, "anchor": [torch.zeros(3, 4), torch.zeros(4)]}, {},
         "anchor 0 has shape (3, 4), the parameter's (4, 3): saved from another model"),
        ({**good, "overlap": True,
          "pending": [torch.zeros(4, 3), torch.zeros(4, dtype=torch.long)]},
         {"overlap": True}, "pending 1 is torch.int64, not floating-point"),
        ({**good, "pending": [torch.zeros(4, 3), torch.zeros(4)]}, {}, "holds an outer exchange "
         "in flight (pending), which only a run with overlap keeps"),
        ({**good, "skipped_outer_steps": 3}, {}, "counts 3 skipped outer steps in 2 outer steps"),
        ({**good, "outer_steps": 1}, {}, "counts 1 outer steps in 16 inner steps, where H = 8 "
         "makes 2"),
        ({**good, "auto": [5]}, {}, "auto record is a list"),
    ]  # fmt: skip
    for state, settings, words in bad:
        run = {"local_steps": 8, "overlap": False, **settings}
        with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
            check_state(state, shapes, run["local_steps"], run["overlap"], [1, 5, 25])
    # the outer step's settings: the run's, not the file's (a resumed run would take the file's)
    fixed = {"lr": 0.7, "momentum": 0.9, "nesterov": True}
    saved = {**good, "outer_optimizer": {"param_groups": [{**fixed, "params": [0, 1]}]}}
    check_state(saved, shapes, 8, False, outer=fixed)
    forged = {"param_groups": [{**fixed, "lr": 123.0, "params": [0, 1]}]}
    with pytest.raises(ValueError, match=r"outer optimizer has lr=123\.0, this run lr=0\.7"):
        check_state({**good, "outer_optimizer": forged}, shapes, 8, False, outer=fixed)
