"""Local steps on real ranks: a small MLP, each rank on its own data, AdamW inside, DiLoCo's
outer step through terngrad's exchange."""

from __future__ import annotations

import copy
import time
import warnings

import torch
import torch.distributed as dist
from torch import nn

from terngrad.diloco import DiLoCo
from terngrad.diloco.state import REPLICATED_STATE
from terngrad.util.differences import same


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 128), nn.BatchNorm1d(128), nn.ReLU(), nn.Linear(128, 10))


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(16, 64, generator=gen), torch.randint(0, 10, (16,), generator=gen)


def _params(net: nn.Module) -> list[torch.Tensor]:
    return [t.detach().clone() for t in (*net.parameters(), *net.buffers())]


def train(rank: int, world: int, steps: int, local_steps: int, settings: dict,
          ddp: bool = False, save_at: int | None = None, saved: list | None = None,
          nan_at: int | None = None) -> dict:  # fmt: skip
    """``steps`` inner steps (from ``saved[rank]`` if given); per step whether it was an outer
    step, this rank's parameters after it and the bytes sent so far; the stats; at ``save_at``
    the states; with overlap, the parameters after :meth:`DiLoCo.finish` (``final``); the
    warnings of the steps and of ``finish``."""
    net = model()
    inner = torch.optim.AdamW(net.parameters(), lr=1e-2)
    wrapped = nn.parallel.DistributedDataParallel(net) if ddp else net
    outer = DiLoCo(wrapped, inner, local_steps, **settings)
    start, out = (
        0,
        {"outer": [], "params": [], "saved": None, "before_outer": [], "bytes": [], "anchors": []},
    )
    if saved is not None:
        start = saved[rank]["step"]
        net.load_state_dict(saved[rank]["model"])
        inner.load_state_dict(saved[rank]["inner"])
        outer.load_state_dict(saved[rank]["outer"])
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        for step in range(start, steps):
            if step == save_at:
                out["saved"] = copy.deepcopy({"step": step, "model": net.state_dict(),
                                              "inner": inner.state_dict(),
                                              "outer": outer.state_dict()})  # fmt: skip
            x, y = batch(step, rank)
            inner.zero_grad()
            nn.functional.cross_entropy(wrapped(x), y).backward()
            inner.step()
            if nan_at == step and rank == world - 1:
                with torch.no_grad():
                    next(net.parameters())[0, 0] = float("nan")
            h = outer.local_steps
            if isinstance(h, int) and (step + 1) % h == 0:
                out["before_outer"].append(_params(net))
            out["outer"].append(outer.step())
            if out["outer"][-1]:
                out["anchors"].append([a.detach().clone() for a in outer.anchor])
            out["params"].append(_params(net))
            out["bytes"].append(outer.stats.bytes_sent)
    out["warnings"] = [str(x.message) for x in said]
    out["anchor"] = [a.detach().clone() for a in outer.anchor]
    out["replicated"] = {k: copy.deepcopy(outer.state_dict()[k]) for k in REPLICATED_STATE}
    out["stats"] = outer.stats
    out["local_steps"], out["auto"] = outer.local_steps, outer.auto
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        outer.finish()
    out["finish_warnings"] = [str(w.message) for w in said]
    out["final"] = _params(net)
    out["final_stats"] = outer.stats
    return out


def auto_with_a_slow_rank(rank: int, world: int, steps: int, slow: float) -> dict:
    """``"auto"`` where the last rank's inner steps take ``slow`` seconds more: the ``H`` this
    rank chose and what it measured."""
    net = model()
    inner = torch.optim.AdamW(net.parameters(), lr=1e-2)
    outer = DiLoCo(net, inner, "auto", auto_choices=[1, 2, 4, 8, 16])
    for step in range(steps):
        x, y = batch(step, rank)
        inner.zero_grad()
        nn.functional.cross_entropy(net(x), y).backward()
        inner.step()
        if rank == world - 1:
            time.sleep(slow)
        outer.step()
    return {"local_steps": outer.local_steps, "auto": outer.auto, "final": _params(net),
            "in_sync": outer.in_sync}  # fmt: skip


def refusals(rank: int, world: int) -> list[str]:
    """What DiLoCo refuses, each one line."""
    said = []
    net = model()
    inner = torch.optim.AdamW(net.parameters())
    for make in (
        lambda: DiLoCo(net, inner, 0),
        lambda: DiLoCo(net, inner, "automatic"),
        lambda: DiLoCo(net, inner, 2.5),
        lambda: DiLoCo(net, torch.optim.AdamW(list(net.parameters())[:2]), 4),
        lambda: DiLoCo(net, torch.optim.AdamW([*net.parameters(), nn.Parameter(torch.ones(2))]), 4),
        lambda: DiLoCo(net, inner, 4, outer_lr=0),
        lambda: DiLoCo(net, inner, 4, outer_momentum=1.5),
        lambda: DiLoCo(net, inner, 4, quantizer="nope"),
        lambda: DiLoCo(net, inner, 4 + rank),  # the ranks disagree
        lambda: DiLoCo(net, inner, 4, overlap="yes"),
        lambda: DiLoCo(net, inner, "auto", max_comm_share=1.5),
        lambda: DiLoCo(net, inner, "auto", auto_choices=[4, 0]),
        lambda: DiLoCo(net, inner, 4, overlap=rank == 0),  # the ranks disagree
        lambda: DiLoCo(net, inner, 8, method="terngrad-local4"),  # not the method's H
        lambda: DiLoCo(net, inner, method="terngrad-local4-overlap", overlap=False),
    ):
        try:
            make()
            said.append("accepted")
        except (ValueError, TypeError) as exc:
            said.append(str(exc))
    ddp = nn.parallel.DistributedDataParallel(model())
    import terngrad.ddp

    terngrad.ddp.register(ddp)
    try:
        DiLoCo(ddp, torch.optim.AdamW(ddp.module.parameters()), 4)
        said.append("accepted")
    except ValueError as exc:
        said.append(str(exc))
    dist.barrier()
    return said


def refused_loads(rank: int, world: int) -> list[tuple[str, bool]]:
    """Forged states loaded into a DiLoCo that has trained: each refusal's line, and whether
    the DiLoCo (its state and its model) is bitwise as it was after it."""
    net = model()
    inner = torch.optim.AdamW(net.parameters(), lr=1e-2)
    outer = DiLoCo(net, inner, 2)
    for step in range(4):
        x, y = batch(step, rank)
        inner.zero_grad()
        nn.functional.cross_entropy(net(x), y).backward()
        inner.step()
        outer.step()
    good = copy.deepcopy(outer.state_dict())
    params = _params(net)
    sgd = torch.optim.SGD(model().parameters(), lr=0.1, momentum=0.9)
    for p in sgd.param_groups[0]["params"]:
        p.grad = torch.ones_like(p)
    sgd.step()

    def forged(change):
        state = copy.deepcopy(good)
        change(state)
        return state

    cases = [
        lambda s: s["outer_optimizer"]["state"][0].update(momentum_buffer=torch.zeros(3)),
        lambda s: s.update(pending=[a.clone() for a in s["anchor"]]),
        lambda s: s.update(inner_optimizer=sgd.state_dict()),
        lambda s: s.update(inner_optimizer={"state": {0: "garbage"}, "param_groups": []}),
        lambda s: s.update(inner_steps=-1),
        lambda s: s["outer_optimizer"]["param_groups"][0].update(lr=123.0),
        lambda s: s["exchange"].update(rank=1 - rank),
    ]
    said = []
    for change in cases:
        try:
            outer.load_state_dict(forged(change))
            said.append(("accepted", False))
        except ValueError as exc:
            unchanged = same(outer.state_dict(), good) and same(_params(net), params)
            said.append((str(exc), unchanged))
    return said
