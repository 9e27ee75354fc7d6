"""Rank functions for test_momentum.py: a small MLP under DDP with FrozenVarianceAdamW, its
momentum exchanged by the terngrad hook after the warm-up."""

from __future__ import annotations

import copy

import torch
from torch import nn

import terngrad.ddp
from terngrad.optim import FrozenVarianceAdamW

SETTINGS = {"lr": 3e-3, "betas": (0.9, 0.99), "weight_decay": 0.01}


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 10))


def batch(step: int, rank: int) -> torch.Tensor:
    return torch.randn(16, 32, generator=torch.Generator().manual_seed(1000 * step + rank))


def loss_of(net: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return (net(x) - 0.5).square().mean()


def train(rank: int, world: int, quantizer: str, steps: int, warmup: int,
          save_at: int | None = None, saved: list | None = None) -> dict:  # fmt: skip
    """``steps`` steps (from ``saved[rank]``'s step if given: the optimizer's and the hook's
    states); returns the parameters, each step's phase (momentum exchanged or not) and, at
    ``save_at``, the states."""
    net = model()
    ddp = nn.parallel.DistributedDataParallel(net)
    opt = FrozenVarianceAdamW(net.parameters(), warmup_steps=warmup, **SETTINGS)
    state = terngrad.ddp.register(ddp, quantizer, error_feedback=True, min_numel=0,
                                  optimizer=opt)  # fmt: skip
    start, result = 0, {"phases": [], "saved": None}
    if saved is not None:
        start = saved[rank]["step"]
        net.load_state_dict(saved[rank]["model"])
        opt.load_state_dict(saved[rank]["optimizer"])
        state.load_state_dict(saved[rank]["hook"])
    first = next(net.parameters())
    for step in range(start, steps):
        if step == save_at:
            result["saved"] = copy.deepcopy({"step": step, "model": net.state_dict(),
                                             "optimizer": opt.state_dict(),
                                             "hook": state.state_dict()})  # fmt: skip
        result["phases"].append(opt.exchanged_momentum(first) is not None)
        opt.zero_grad()
        loss_of(ddp, batch(step, rank)).backward()
        if not state.last_step_skipped:
            opt.step()
    result["params"] = [p.detach().clone() for p in net.parameters()]
    result["momentum"] = opt.state[first]["exp_avg"].clone()
    result["bytes_per_step"] = state.stats.bytes_sent_per_step
    return result


def reference(world: int, steps: int, warmup: int) -> list[torch.Tensor]:
    """The same training in one process, unbound: the optimizer fed the ranks' mean gradient,
    its momentum computed from it (no exchange, no compression)."""
    net = model()
    opt = FrozenVarianceAdamW(net.parameters(), warmup_steps=warmup, **SETTINGS)
    for step in range(steps):
        grads = []
        for rank in range(world):
            net.zero_grad()
            loss_of(net, batch(step, rank)).backward()
            grads.append([p.grad.clone() for p in net.parameters()])
        for p, *gs in zip(net.parameters(), *grads, strict=True):
            p.grad = torch.stack(gs).mean(0)
        opt.step()
    return [p.detach().clone() for p in net.parameters()]
