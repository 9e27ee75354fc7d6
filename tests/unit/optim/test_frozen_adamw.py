"""FrozenVarianceAdamW on one process: AdamW bit for bit through the warm-up, then the variance
frozen; bound to a hook, the gradient taken as the exchanged momentum."""

import copy

import pytest
import torch
from torch import nn

from terngrad.optim import FrozenVarianceAdamW

SETTINGS = {"lr": 1e-2, "betas": (0.9, 0.99), "eps": 1e-8, "weight_decay": 0.1}


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 2))


def _grads(model: nn.Module, step: int) -> None:
    g = torch.Generator().manual_seed(step)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=g)


def test_the_warm_up_is_adamw_bit_for_bit():
    ours, theirs = _model(), _model()
    a = FrozenVarianceAdamW(ours.parameters(), warmup_steps=5, **SETTINGS)
    b = torch.optim.AdamW(theirs.parameters(), foreach=False, **SETTINGS)
    for step in range(5):
        _grads(ours, step)
        _grads(theirs, step)
        a.step()
        b.step()
        for p, q in zip(ours.parameters(), theirs.parameters(), strict=True):
            assert torch.equal(p, q), step


def test_after_the_warm_up_the_variance_stays_and_the_momentum_goes_on():
    model = _model()
    opt = FrozenVarianceAdamW(model.parameters(), warmup_steps=3, **SETTINGS)
    for step in range(3):
        _grads(model, step)
        opt.step()
    frozen = {id(p): opt.state[p]["exp_avg_sq"].clone() for p in model.parameters()}
    before = {id(p): opt.state[p]["exp_avg"].clone() for p in model.parameters()}
    _grads(model, 3)
    grads = {id(p): p.grad.clone() for p in model.parameters()}
    params = {id(p): p.detach().clone() for p in model.parameters()}
    opt.step()
    beta1, beta2 = SETTINGS["betas"]
    lr, eps, wd = SETTINGS["lr"], SETTINGS["eps"], SETTINGS["weight_decay"]
    for p in model.parameters():
        state = opt.state[p]
        assert torch.equal(state["exp_avg_sq"], frozen[id(p)])
        m = before[id(p)].lerp(grads[id(p)], 1 - beta1)
        assert torch.equal(state["exp_avg"], m)
        floored = torch.maximum(frozen[id(p)], 0.01 * frozen[id(p)].mean())
        denom = floored.sqrt() / (1 - beta2**3) ** 0.5 + eps
        want = params[id(p)] * (1 - lr * wd) - lr / (1 - beta1**4) * m / denom
        torch.testing.assert_close(p.detach(), want, rtol=1e-6, atol=1e-7)


def test_bound_to_a_hook_the_gradient_is_the_exchanged_momentum():
    model = _model()
    opt = FrozenVarianceAdamW(model.parameters(), warmup_steps=2, **SETTINGS)
    opt.bind_exchange()
    for step in range(2):
        _grads(model, step)
        assert all(opt.exchanged_momentum(p) is None for p in model.parameters())  # warm-up
        opt.step()
    beta1, beta2 = SETTINGS["betas"]
    denominators = {}
    for p in model.parameters():
        momentum, b1, denom = opt.exchanged_momentum(p)
        assert momentum is opt.state[p]["exp_avg"] and b1 == beta1
        v = torch.maximum(opt.state[p]["exp_avg_sq"], 0.01 * opt.state[p]["exp_avg_sq"].mean())
        assert torch.equal(denom, (v.sqrt() / (1 - beta2**2) ** 0.5).add_(SETTINGS["eps"]))
        denominators[id(p)] = denom.clone()
    _grads(model, 2)  # as the hook hands them: u = m / d, agreed by every rank
    sent = {id(p): p.grad.clone() for p in model.parameters()}
    before = {id(p): p.detach().clone() for p in model.parameters()}
    opt.step()
    lr, wd = SETTINGS["lr"], SETTINGS["weight_decay"]
    for p in model.parameters():
        assert torch.equal(opt.state[p]["exp_avg"], sent[id(p)] * denominators[id(p)])
        want = before[id(p)] * (1 - lr * wd) - lr / (1 - beta1**3) * sent[id(p)]
        torch.testing.assert_close(p.detach(), want, rtol=1e-6, atol=1e-7)
    assert opt.exchanged_momentum(torch.zeros(3)) is None  # not one of its parameters


def test_an_element_the_warm_up_saw_no_gradient_for_gets_the_floor_not_eps():
    """A ReLU unit dead during the warm-up: its variance is 0, and dividing its first gradient
    by eps alone would be a step of 1e7 learning rates."""
    layer = nn.Linear(4, 3)
    opt = FrozenVarianceAdamW(layer.parameters(), warmup_steps=2, **SETTINGS)
    for step in range(2):
        _grads(layer, step)
        layer.weight.grad[0] = 0.0  # row 0 never gets a gradient in the warm-up
        opt.step()
    _, _, denom = opt.exchanged_momentum(layer.weight)
    v = opt.state[layer.weight]["exp_avg_sq"]
    assert (v[0] == 0).all()
    floor = (0.01 * v.mean() / (1 - SETTINGS["betas"][1] ** 2)).sqrt() + SETTINGS["eps"]
    torch.testing.assert_close(denom[0], floor.expand(4))
    assert bool((denom[1:] >= floor).all())


def test_its_state_resumes_exactly_and_refuses_another_warm_up():
    model = _model()
    opt = FrozenVarianceAdamW(model.parameters(), warmup_steps=2, **SETTINGS)
    for step in range(3):
        _grads(model, step)
        opt.step()
    twin = copy.deepcopy(model)
    again = FrozenVarianceAdamW(twin.parameters(), warmup_steps=2, **SETTINGS)
    again.load_state_dict(copy.deepcopy(opt.state_dict()))  # as saved and read back
    for step in range(3, 6):
        for m in (model, twin):
            _grads(m, step)
        opt.step()
        again.step()
    assert all(
        torch.equal(p, q) for p, q in zip(model.parameters(), twin.parameters(), strict=True)
    )
    other = FrozenVarianceAdamW(_model().parameters(), warmup_steps=3, **SETTINGS)
    with pytest.raises(ValueError, match="saved with warmup_steps=2, and this optimizer has 3"):
        other.load_state_dict(opt.state_dict())


@pytest.mark.parametrize(
    "changes, says",
    [({"warmup_steps": 0}, "warmup_steps must be an integer of at least 1"),
     ({"warmup_steps": 2.5}, "warmup_steps must be an integer"),
     ({"lr": float("nan")}, "lr must be a finite number >= 0"),
     ({"betas": (0.9, 1.0)}, "betas must be two numbers in [0, 1)"),
     ({"eps": 0}, "eps must be a finite number > 0"),
     ({"variance_floor": 2}, "variance_floor must be a number in [0, 1]")],
)  # fmt: skip
def test_bad_settings_are_one_line(changes, says):
    with pytest.raises(ValueError) as exc:
        FrozenVarianceAdamW(_model().parameters(), **{"warmup_steps": 2, **changes})
    assert says in str(exc.value) and "\n" not in str(exc.value)


def test_only_an_optimizer_with_a_frozen_variance_can_have_its_momentum_exchanged():
    from terngrad.comm.front.hook import State

    with pytest.raises(TypeError, match=r"terngrad\.optim\.FrozenVarianceAdamW"):
        State(optimizer=torch.optim.AdamW(_model().parameters()))
