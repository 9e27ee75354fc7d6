"""Rank functions for test_momentum.py: a small MLP under DDP with FrozenVarianceAdamW, its
momentum exchanged by the terngrad hook after the warm-up, or with LocalVarianceAdamW, its
momentum exchanged from the first step and its variance measured on each rank."""

from __future__ import annotations

import copy

import torch
from torch import nn

import terngrad.ddp
from terngrad.optim import FrozenVarianceAdamW, LocalVarianceAdamW

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


def train_local(rank: int, world: int, quantizer: str, steps: int, sync_every: int,
                save_at: int | None = None, saved: list | None = None,
                share_dtype: torch.dtype = torch.bfloat16) -> dict:  # fmt: skip
    """``steps`` steps with LocalVarianceAdamW (from ``saved[rank]`` if given); returns the
    parameters, the agreed momentum and denominator of the first tensor, this rank's local
    variance, the bytes of each step and, at ``save_at``, the states."""
    net = model()
    ddp = nn.parallel.DistributedDataParallel(net)
    opt = LocalVarianceAdamW(net.parameters(), sync_every=sync_every, variance_floor=0,
                             share_dtype=share_dtype, **SETTINGS)  # fmt: skip
    state = terngrad.ddp.register(ddp, quantizer, error_feedback=True, min_numel=0,
                                  optimizer=opt)  # fmt: skip
    start, result = 0, {"saved": None, "bytes": []}
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
        sent = state.stats.bytes_sent
        opt.zero_grad()
        loss_of(ddp, batch(step, rank)).backward()
        if not state.last_step_skipped:
            opt.step()
        result["bytes"].append(state.stats.bytes_sent - sent)
    result["params"] = [p.detach().clone() for p in net.parameters()]
    result["momentum"] = opt.state[first]["exp_avg"].clone()
    result["denom"] = opt.state[first]["denom"].clone()
    result["variance"] = state.state_dict()["local_variance"]["variances"]
    return result


def reference_local(world: int, steps: int, sync_every: int) -> list[torch.Tensor]:
    """The same training in one process, written out: each rank's running means of its own
    gradient and of its squares, averaged over the ranks when due, ``d`` from
    ``mean(v_i) / N + (1 - 1/N) M^2``; the ranks' preconditioned momenta ``(beta1 m + (1 -
    beta1) g_i) / d`` averaged exactly."""
    net = model()
    params = list(net.parameters())
    probe = LocalVarianceAdamW(params, sync_every=sync_every)  # for its schedule only
    beta1, beta2 = SETTINGS["betas"]
    lr, wd, eps = SETTINGS["lr"], SETTINGS["weight_decay"], 1e-8
    v = [[torch.zeros_like(p) for p in params] for _ in range(world)]
    local_m = [[torch.zeros_like(p) for p in params] for _ in range(world)]
    m = [torch.zeros_like(p) for p in params]
    d = [None] * len(params)
    with torch.no_grad():
        for step in range(steps):
            t = step + 1
            grads = []
            for rank in range(world):
                net.zero_grad()
                with torch.enable_grad():
                    loss_of(net, batch(step, rank)).backward()
                grads.append([p.grad.clone() for p in params])
            for k, p in enumerate(params):
                for rank in range(world):
                    g = grads[rank][k]
                    v[rank][k].mul_(beta2).addcmul_(g, g, value=1 - beta2)
                    local_m[rank][k].lerp_(g, 1 - beta1)
                if probe.syncs_at(t):
                    mean_v = torch.stack([v[r][k] for r in range(world)]).mean(0)
                    mean_m = torch.stack([local_m[r][k] for r in range(world)]).mean(0)
                    v_hat = mean_v / (1 - beta2**t) / world
                    v_hat += (1 - 1 / world) * (mean_m / (1 - beta1**t)) ** 2
                    d[k] = v_hat.sqrt() + eps
                u = torch.stack([(beta1 * m[k] + (1 - beta1) * grads[r][k]) / d[k]
                                 for r in range(world)]).mean(0)  # fmt: skip
                m[k] = u * d[k]
                p.mul_(1 - lr * wd).add_(u, alpha=-lr / (1 - beta1**t))
    return [p.detach().clone() for p in params]
