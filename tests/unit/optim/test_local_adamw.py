"""LocalVarianceAdamW on one process: AdamW bit for bit where its variance is shared every step
(floor off), its schedule, its denominator from a shared variance, the step along an exchanged
momentum, and exact resume; the hook's LocalVariance room without a process group."""

import copy

import pytest
import torch
from torch import nn

from terngrad.comm.rank.momentum import LocalVariance, VarianceSource, to_local_momentum
from terngrad.optim import LocalVarianceAdamW

SETTINGS = {"lr": 1e-2, "betas": (0.9, 0.99), "eps": 1e-8, "weight_decay": 0.1}


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 2))


def _grads(model: nn.Module, step: int) -> None:
    g = torch.Generator().manual_seed(step)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=g)


def test_shared_every_step_without_a_floor_it_is_adamw_bit_for_bit():
    ours, theirs = _model(), _model()
    a = LocalVarianceAdamW(ours.parameters(), sync_every=1, variance_floor=0, **SETTINGS)
    b = torch.optim.AdamW(theirs.parameters(), foreach=False, **SETTINGS)
    for step in range(12):
        _grads(ours, step)
        _grads(theirs, step)
        a.step()
        b.step()
        for p, q in zip(ours.parameters(), theirs.parameters(), strict=True):
            assert torch.equal(p, q), step


def test_the_variance_is_shared_at_powers_of_two_below_k_then_every_kth_step():
    opt = LocalVarianceAdamW(_model().parameters(), sync_every=10)
    due = [t for t in range(1, 41) if opt.syncs_at(t)]
    assert due == [1, 2, 4, 8, 10, 20, 30, 40]


def test_between_shares_the_denominator_stays_while_the_variance_goes_on():
    model = _model()
    opt = LocalVarianceAdamW(model.parameters(), sync_every=4, variance_floor=0, **SETTINGS)
    layer = model[0].weight
    seen = []
    for step in range(6):  # shared at steps 1, 2, 4 (and 8)
        _grads(model, step)
        opt.step()
        seen.append(opt.state[layer]["denom"].clone())
    assert not torch.equal(seen[0], seen[1])
    assert torch.equal(seen[1], seen[2])  # step 3: no share
    assert not torch.equal(seen[2], seen[3])  # step 4
    assert torch.equal(seen[3], seen[4]) and torch.equal(seen[4], seen[5])
    beta2, eps = SETTINGS["betas"][1], SETTINGS["eps"]
    v = opt.state[layer]["exp_avg_sq"]  # after 6 steps; the denominator is step 4's
    assert not torch.equal(seen[5], v.sqrt() / (1 - beta2**6) ** 0.5 + eps)


def test_bound_to_a_hook_it_steps_along_the_exchanged_momentum():
    model = _model()
    opt = LocalVarianceAdamW(model.parameters(), **SETTINGS)
    opt.bind_exchange()
    beta1, beta2 = SETTINGS["betas"]
    lr, wd, eps = SETTINGS["lr"], SETTINGS["weight_decay"], SETTINGS["eps"]
    for p in model.parameters():
        assert opt.local_variance(p) == (beta1, beta2, True)  # step 1: due
        ranks_v, ranks_m = torch.full((p.numel(),), 4.0), torch.full((p.numel(),), 0.3)
        opt.share_variance(p, ranks_v, ranks_m, ranks=4)
        momentum, b1, denom = opt.exchanged_momentum(p)
        assert b1 == beta1 and (momentum == 0).all()
        # the global batch's second moment: mean(v_i) / N + (1 - 1/N) M^2, bias-corrected
        v_hat = 4.0 / (1 - beta2) / 4 + 0.75 * (0.3 / (1 - beta1)) ** 2
        torch.testing.assert_close(denom, torch.full(p.shape, v_hat**0.5 + eps))
    _grads(model, 0)  # as the hook hands them: u, agreed by every rank
    sent = {id(p): p.grad.clone() for p in model.parameters()}
    before = {id(p): p.detach().clone() for p in model.parameters()}
    opt.step()
    for p in model.parameters():
        _, _, denom = opt.exchanged_momentum(p)
        assert torch.equal(opt.state[p]["exp_avg"], sent[id(p)] * denom)
        want = before[id(p)] * (1 - lr * wd) - lr / (1 - beta1) * sent[id(p)]
        torch.testing.assert_close(p.detach(), want, rtol=1e-6, atol=1e-7)
        assert opt.local_variance(p) == (beta1, beta2, True)  # step 2: due again
    assert opt.exchanged_momentum(torch.zeros(3)) is None  # not one of its parameters
    assert opt.local_variance(torch.zeros(3)) is None


def test_a_momentum_asked_for_before_any_shared_variance_says_how_to_bind():
    model = _model()
    opt = LocalVarianceAdamW(model.parameters())
    opt.bind_exchange()
    with pytest.raises(RuntimeError, match=r"no variance was shared.*optimizer=opt"):
        opt.exchanged_momentum(next(model.parameters()))
    _grads(model, 0)
    with pytest.raises(RuntimeError, match="no variance was shared"):
        opt.step()


def test_its_state_resumes_exactly_and_refuses_another_schedule():
    model = _model()
    opt = LocalVarianceAdamW(model.parameters(), sync_every=3, **SETTINGS)
    for step in range(4):
        _grads(model, step)
        opt.step()
    twin = copy.deepcopy(model)
    again = LocalVarianceAdamW(twin.parameters(), sync_every=3, **SETTINGS)
    again.load_state_dict(copy.deepcopy(opt.state_dict()))
    for step in range(4, 9):
        for m in (model, twin):
            _grads(m, step)
        opt.step()
        again.step()
    assert all(
        torch.equal(p, q) for p, q in zip(model.parameters(), twin.parameters(), strict=True)
    )
    other = LocalVarianceAdamW(_model().parameters(), sync_every=5, **SETTINGS)
    with pytest.raises(ValueError, match="saved with sync_every=3, and this optimizer has 5"):
        other.load_state_dict(opt.state_dict())


@pytest.mark.parametrize(
    "changes, says",
    [({"sync_every": 0}, "sync_every must be an integer of at least 1"),
     ({"sync_every": True}, "sync_every must be an integer"),
     ({"lr": -1.0}, "lr must be a finite number >= 0"),
     ({"variance_floor": -0.1}, "variance_floor must be a number in [0, 1]")],
)  # fmt: skip
def test_bad_settings_are_one_line(changes, says):
    with pytest.raises(ValueError) as exc:
        LocalVarianceAdamW(_model().parameters(), **changes)
    assert says in str(exc.value) and "\n" not in str(exc.value)


class _OneRank:
    """A Link of one rank: the all-reduce is the identity, its calls counted."""

    size = 1

    def __init__(self) -> None:
        self.calls: list[int] = []

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        self.calls.append(tensor.numel())
        return tensor


def test_the_hooks_local_variance_is_the_running_mean_of_this_ranks_squares():
    """Fed the buffers a DDP bucket holds, the room keeps v <- beta2 v + (1 - beta2) g^2 and
    m <- beta1 m + (1 - beta1) g per parameter, shares them when due (one all-reduce of the
    bucket's), and the optimizer's denominator is made from them before the momentum is
    formed."""
    model = _model()
    params = list(model.parameters())
    opt = LocalVarianceAdamW(params, sync_every=4, variance_floor=0, **SETTINGS)
    opt.bind_exchange()
    assert isinstance(opt, VarianceSource)
    room = LocalVariance(opt, {id(p): n for n, p in model.named_parameters()})
    link = _OneRank()
    beta1, beta2 = SETTINGS["betas"]
    want = {n: torch.zeros(p.numel()) for n, p in model.named_parameters()}
    want_m = {n: torch.zeros(p.numel()) for n, p in model.named_parameters()}
    for step in range(5):
        _grads(model, step)
        buffer = torch.cat([p.grad.reshape(-1) for p in params])
        for (n, _), g in zip(model.named_parameters(), buffer.split([p.numel() for p in params]),
                             strict=True):  # fmt: skip
            want[n] = beta2 * want[n] + (1 - beta2) * g * g
            want_m[n] = beta1 * want_m[n] + (1 - beta1) * g
        room.observe(params, buffer, link)
        to_local_momentum(opt, params, buffer)
        for p, u in zip(params, buffer.split([p.numel() for p in params]), strict=True):
            p.grad = u.reshape(p.shape).clone()
        opt.step()
    assert link.calls == [2 * sum(p.numel() for p in params)] * 3  # steps 1, 2, 4
    saved = room.state_dict()
    for n, v in saved["variances"].items():
        torch.testing.assert_close(v, want[n], rtol=1e-6, atol=0)
        torch.testing.assert_close(saved["momenta"][n], want_m[n], rtol=1e-6, atol=1e-7)
    twin = LocalVariance(opt, room.names)
    twin.load_state_dict(saved)
    assert all(torch.equal(twin.variances[n], v) for n, v in room.variances.items())
    assert all(torch.equal(twin.momenta[n], m) for n, m in room.momenta.items())
    with pytest.raises(ValueError, match="not a terngrad local-variance state"):
        twin.load_state_dict({"variances": {}})
    sizes = {n: p.numel() for n, p in model.named_parameters()}
    bad = {**saved, "momenta": {**saved["momenta"], "0.weight": torch.zeros(2)}}
    with pytest.raises(ValueError) as exc:
        twin.load_state_dict(bad, sizes)
    assert str(exc.value) == (
        "terngrad local-variance state: momenta['0.weight'] has shape (2,), not (30,) as this "
        "model's: saved from another model"
    )


def test_a_bucket_with_a_non_finite_value_folds_nothing():
    model = _model()
    params = list(model.parameters())
    opt = LocalVarianceAdamW(params)
    opt.bind_exchange()
    room = LocalVariance(opt, {id(p): n for n, p in model.named_parameters()})
    _grads(model, 0)
    buffer = torch.cat([p.grad.reshape(-1) for p in params])
    room.observe(params, buffer, _OneRank())
    before = room.state_dict()
    buffer[3] = float("nan")
    room.observe(params, buffer, _OneRank())
    assert all(torch.equal(before["variances"][n], v) for n, v in room.variances.items())
    assert all(torch.equal(before["momenta"][n], m) for n, m in room.momenta.items())


def test_float16_is_refused_for_sharing_the_variance():
    with pytest.raises(ValueError, match=r"share_dtype must be torch\.float32 or torch\.bfloat16"):
        LocalVarianceAdamW(_model().parameters(), share_dtype=torch.float16)
