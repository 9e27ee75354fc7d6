"""Both optimizers refuse what AdamW refuses: in the constructor, in each
parameter group, in ``add_param_group``, and in a loaded state — each in one line."""

import copy
import math

import pytest
import torch
from torch import nn

from terngrad.optim import FrozenVarianceAdamW, LocalVarianceAdamW

KINDS = {
    "frozen": lambda params, **kw: FrozenVarianceAdamW(params, warmup_steps=1, **kw),
    "local": lambda params, **kw: LocalVarianceAdamW(params, sync_every=2, **kw),
}


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2))


def _one_line(exc: pytest.ExceptionInfo, says: str) -> None:
    assert says in str(exc.value) and "\n" not in str(exc.value), str(exc.value)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "changes, says",
    [({"weight_decay": -0.1}, "weight_decay must be a finite number >= 0, got -0.1"),
     ({"lr": math.nan}, "lr must be a finite number >= 0, got nan"),
     ({"betas": (0.9, 1.0)}, "betas must be two numbers in [0, 1)"),
     ({"eps": 0.0}, "eps must be a finite number > 0")],
)  # fmt: skip
def test_the_constructor_a_group_and_add_param_group_refuse_alike(kind, changes, says):
    model = _model()
    with pytest.raises(ValueError) as exc:
        KINDS[kind](model.parameters(), **changes)
    _one_line(exc, says)
    with pytest.raises(ValueError) as exc:  # a group of the constructor's
        KINDS[kind]([{"params": model[0].parameters(), **changes}])
    _one_line(exc, "param group 0: " + says)
    opt = KINDS[kind](model[0].parameters())
    with pytest.raises(ValueError) as exc:
        opt.add_param_group({"params": model[2].parameters(), **changes})
    _one_line(exc, "param group 1: " + says)
    assert len(opt.param_groups) == 1  # nothing added
    before = [p.clone() for p in model.parameters()]
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.step()  # the refused group's parameters are untouched, the others finite
    assert torch.equal(model[2].weight, before[2]) and torch.isfinite(model[0].weight).all()


def _trained(kind: str) -> tuple[nn.Module, torch.optim.Optimizer]:
    model = _model()
    opt = KINDS[kind](model.parameters())
    for _ in range(3):
        for p in model.parameters():
            p.grad = torch.ones_like(p)
        opt.step()
    return model, opt


def _bad_states(saved: dict) -> list[tuple[object, str]]:
    out: list[tuple[object, str]] = [([], "state: a list"), ({"state": {}}, "not a")]
    s = copy.deepcopy(saved)
    s["param_groups"][0]["lr"] = math.nan
    out.append((s, "the saved state's param group 0: lr must be a finite number >= 0, got nan"))
    s = copy.deepcopy(saved)
    s["param_groups"].append(copy.deepcopy(s["param_groups"][0]))
    out.append((s, "state has 2 parameter groups, this optimizer 1"))
    s = copy.deepcopy(saved)
    s["state"][0]["exp_avg"] = torch.zeros(5)
    out.append((s, "group 0 parameter 0: exp_avg has shape (5,), the parameter (3, 4)"))
    s = copy.deepcopy(saved)
    s["state"][1]["exp_avg"] = torch.zeros(3, dtype=torch.int64)
    out.append((s, "group 0 parameter 1: exp_avg is torch.int64, not a floating-point tensor"))
    s = copy.deepcopy(saved)
    s["state"][1]["step"] = "three"
    out.append((s, "group 0 parameter 1: its step is 'three', not a number"))
    s = copy.deepcopy(saved)
    s["state"][2] = [1, 2]
    out.append((s, "group 0 parameter 2: a list, not a dict"))
    return out


@pytest.mark.parametrize("kind", KINDS)
def test_a_loaded_state_is_checked_before_it_is_taken(kind):
    _, opt = _trained(kind)
    saved = opt.state_dict()
    for bad, says in _bad_states(saved):
        fresh = KINDS[kind](_model().parameters())
        with pytest.raises(ValueError) as exc:
            fresh.load_state_dict(bad)
        _one_line(exc, says)
        assert fresh.param_groups[0]["lr"] == 1e-3  # nothing taken
    again = KINDS[kind](_model().parameters())
    again.load_state_dict(saved)  # its own state still loads
    assert again.state_dict()["state"].keys() == saved["state"].keys()
