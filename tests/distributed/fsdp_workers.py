"""Rank functions for test_fsdp.py: a small model of odd layer sizes, ``fully_shard``-ed per
block and at the root, trained with FSDP2's own reduce-scatter or terngrad's."""

from __future__ import annotations

import copy
import warnings

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

import terngrad.fsdp
from terngrad.comm import Link, ShardedExchange
from terngrad.comm.exchanges.reduce_scatter import grid_reduce_scatter
from terngrad.kernels import resolve
from terngrad.quantize import Layout, get


class Net(nn.Module):
    """Odd sizes, so that every shard is padded; ``head`` is the last layer, ``norm`` small."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(23, 37), nn.Linear(37, 41)])
        self.norm = nn.LayerNorm(41)
        self.head = nn.Linear(41, 7)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = torch.tanh(block(x))
        return self.head(self.norm(x))


def build(reduce_dtype: torch.dtype | None = None) -> Net:
    torch.manual_seed(0)
    net = Net()
    policy = MixedPrecisionPolicy(reduce_dtype=reduce_dtype)
    for block in net.blocks:
        fully_shard(block, mp_policy=policy)
    fully_shard(net, mp_policy=policy)
    return net


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(12, 23, generator=g), torch.randint(0, 7, (12,), generator=g)


def local(net: nn.Module) -> dict[str, torch.Tensor]:
    """This rank's shards of the parameters."""
    return {n: p.to_local().detach().clone() for n, p in net.named_parameters()}


def full(net: nn.Module) -> dict[str, torch.Tensor]:
    """The full parameters, all-gathered from the shards."""
    return {n: p.full_tensor().detach().clone() for n, p in net.named_parameters()}


def train(rank: int, world: int, options: dict | None, steps: int, extra: dict | None = None):
    """``steps`` SGD steps with momentum (FSDP's own reduce-scatter if ``options`` is None).
    ``extra``: ``saved`` (start from ``saved[rank]``), ``nan_at`` (a NaN in rank 1's loss at
    that step), ``reduce_dtype``, ``save_at``. Returns the losses, the gradients' shards after
    the first step, the full parameters, the byte counts and, at ``save_at``, the states."""
    extra = extra or {}
    nan_at, reduce_dtype = extra.get("nan_at"), extra.get("reduce_dtype")
    save_at, saved = extra.get("save_at"), extra.get("saved")
    net = build(reduce_dtype)
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    state = terngrad.fsdp.register(net, **options) if options is not None else None
    out: dict = {"losses": [], "skipped": [], "saved": None}
    start = 0
    if saved is not None:
        mine = saved[rank]
        start = mine["step"]
        for n, p in net.named_parameters():
            p.to_local().detach().copy_(mine["shards"][n])
        opt.load_state_dict(mine["optimizer"])
        state.load_state_dict(mine["terngrad"])
    for step in range(start, steps):
        if step == save_at:
            out["saved"] = copy.deepcopy({
                "step": step, "shards": local(net), "optimizer": opt.state_dict(),
                "terngrad": state.state_dict(),
            })  # fmt: skip
        x, y = batch(step, rank)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(net(x), y)
        if step == nan_at and rank == 1:
            loss = loss * float("nan")
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            loss.backward()
        skipped = state is not None and state.last_step_skipped
        out["skipped"].append(skipped)
        if step == start:
            out["grads"] = {n: p.grad.to_local().clone() for n, p in net.named_parameters()}
        if not skipped:
            opt.step()
        out["losses"].append(float(loss.detach()))
    out["full"] = full(net)
    out["shards"] = local(net)
    if state is not None:
        out["stats"] = state.stats
        out["fp32_bytes_sent"] = state.fp32_bytes_sent
        out["excluded"] = sorted(state.excluded)
    return out


def refusals(rank: int, world: int) -> list[str]:
    """What register says to what it cannot serve, each before any collective."""
    said = []

    def attempt(fn) -> None:
        try:
            fn()
            said.append("accepted")
        except (ValueError, TypeError) as e:
            said.append(str(e))

    torch.manual_seed(0)
    attempt(lambda: terngrad.fsdp.register(Net()))  # not sharded
    attempt(lambda: terngrad.fsdp.register(build(), quantizer="linear"))
    attempt(lambda: terngrad.fsdp.register(build(), topology="ps"))
    attempt(lambda: terngrad.fsdp.register(build(), fuse_buckets=True))
    attempt(lambda: terngrad.fsdp.register(build(), error_feedback=True, fit_scale=True))
    net = build()
    terngrad.fsdp.register(net)
    attempt(lambda: terngrad.fsdp.register(net))  # twice
    return said


def reduce_scatter_against_the_exchange(rank: int, world: int, numel: int) -> dict:
    """grid_reduce_scatter's chunk against the sharded exchange's mean of the same gradient,
    the same layout and the same draws: bit for bit."""
    g = torch.Generator().manual_seed(rank)
    flat = torch.randn(numel, generator=g) * (1 + rank)
    layout = Layout.of(numel, [numel // 3, numel - numel // 3], 16)
    draws = torch.rand(numel, generator=g)
    q, kernels = get("terngrad"), resolve("auto")
    chunk = numel // world
    out = torch.empty(chunk)
    own = torch.empty(numel)
    assert grid_reduce_scatter(Link(), kernels, q, flat, layout, draws, out, own)
    result = ShardedExchange(q, Link(), kernels=kernels).reduce(flat, layout, draws, None)
    mine = slice(rank * chunk, (rank + 1) * chunk)
    bad = torch.full((numel,), float("nan")) if rank == 1 else flat
    skipped = not grid_reduce_scatter(Link(), kernels, q, bad, layout, draws, out.clone())
    beside = not grid_reduce_scatter(
        Link(), kernels, q, flat, layout, draws, out.clone(), also_finite=rank != 2
    )
    dist.barrier()
    return {
        "same": torch.equal(out, result.mean[mine]),
        "own": torch.equal(own, result.own),
        "skipped": skipped,
        "beside": beside,
    }


def divide_factor(rank: int, world: int, factor: float) -> str:
    """One backward with ``set_gradient_divide_factor(factor)``: what it raised, in its last
    line."""
    net = build()
    terngrad.fsdp.register(net)
    net.set_gradient_divide_factor(factor)
    x, y = batch(0, rank)
    try:
        nn.functional.cross_entropy(net(x), y).backward()
    except Exception as exc:  # whatever FSDP lets through
        return f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1]}"
    return "accepted"
