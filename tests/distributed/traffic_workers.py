"""Every method of the table, trained a few steps on real ranks, with what each step moved at
each rank counted: the hook's own counters, or, for PyTorch's hooks, the tensors each of their
all-reduces was handed (``torch.distributed.all_reduce`` wrapped in the rank's process)."""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

import terngrad.ddp
from terngrad.comm.exchanges.traffic import ring_bytes
from terngrad.comm.spec import methods
from terngrad.comm.spec.methods import FrozenVariance, LocalVariance
from terngrad.diloco import DiLoCo
from terngrad.optim import FrozenVarianceAdamW, LocalVarianceAdamW
from terngrad.train import baselines, models

SHAPE = (1, 28, 28)
#: the steps of a warm-up method's full precision, and of the frozen recipe's plain AdamW
WARMUP_STEPS = 2
#: the H a local-steps method is counted at (its own H changes only which steps exchange)
COUNTED_H = 2


def counted(name: str) -> methods.Method:
    """Method ``name`` as it is counted: a local-steps one at :data:`COUNTED_H`."""
    m = methods.get(name)
    return m if m.local is None else dataclasses.replace(m, local=m.local.replace(every=COUNTED_H))


def lenet() -> nn.Module:
    torch.manual_seed(0)
    return models.build("lenet", SHAPE, 10)


class _Counted:
    """``dist.all_reduce`` wrapped: the bytes and messages a ring all-reduce of each tensor
    handed to it moves at this rank (what :class:`terngrad.comm.exchanges.link.Link` counts)."""

    def __init__(self) -> None:
        self.sent = self.messages = 0
        self._real = dist.all_reduce

    def __enter__(self):
        def all_reduce(tensor, *args, **kwargs):
            world = dist.get_world_size(kwargs.get("group"))
            self.sent += ring_bytes(tensor.numel() * tensor.element_size(), world)
            self.messages += 2 * (world - 1)
            return self._real(tensor, *args, **kwargs)

        dist.all_reduce = all_reduce
        return self

    def __exit__(self, *exc) -> None:
        dist.all_reduce = self._real


def _baseline(model: nn.Module, m: methods.Method) -> nn.parallel.DistributedDataParallel:
    """PyTorch's averaging of method ``m``; fp32 through ``allreduce_hook``, the Python form of
    DDP's built-in all-reduce (the same tensors), so its all-reduces can be counted."""
    if m.baseline == "fp32":
        ddp = nn.parallel.DistributedDataParallel(model)
        ddp.register_comm_hook(None, default_hooks.allreduce_hook)
        return ddp
    return baselines.wrap(model, m.baseline, seed=0, powersgd_rank=m.powersgd_rank)


def counted_steps(rank: int, world: int, names: list[str], steps: int) -> dict:
    """Per method, per step, ``(bytes sent, bytes received, messages sent)`` at this rank."""
    gen = torch.Generator().manual_seed(100 + rank)
    x, y = torch.randn(8, *SHAPE, generator=gen), torch.randint(0, 10, (8,), generator=gen)
    out = {}
    for name in names:
        m, model = counted(name), lenet()
        counts = []
        if m.local_steps != 1:  # DiLoCo: the outer step's exchange every local_steps steps
            ddp = nn.parallel.DistributedDataParallel(model)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
            outer = DiLoCo(ddp, optimizer, local=m.local, options=m.options())
            last = (0, 0, 0)
            for _ in range(2 * m.local_steps):
                optimizer.zero_grad()
                nn.functional.cross_entropy(ddp(x), y).backward()
                optimizer.step()
                if outer.step():
                    outer.finish()  # overlap: its exchange landed, counted at its outer step
                s = outer.stats
                now = (s.bytes_sent, s.bytes_received, s.messages_sent)
                counts.append(tuple(a - b for a, b in zip(now, last, strict=True)))
                last = now
        elif m.baseline is not None:
            ddp = _baseline(model, m)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
            for _ in range(steps):
                with _Counted() as c:
                    optimizer.zero_grad()
                    nn.functional.cross_entropy(ddp(x), y).backward()
                optimizer.step()
                counts.append((c.sent, c.sent, c.messages))
        else:
            ddp = nn.parallel.DistributedDataParallel(model)
            if isinstance(m.recipe, FrozenVariance):
                optimizer = FrozenVarianceAdamW(model.parameters(), warmup_steps=WARMUP_STEPS)
            elif isinstance(m.recipe, LocalVariance):
                optimizer = LocalVarianceAdamW(model.parameters(), sync_every=m.recipe.every)
            else:
                optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
            options = m.options(full_precision_steps=WARMUP_STEPS if m.warmup else 0)
            state = terngrad.ddp.register(
                ddp, options=options, optimizer=optimizer if m.recipe else None
            )
            for _ in range(steps):
                optimizer.zero_grad()
                nn.functional.cross_entropy(ddp(x), y).backward()
                optimizer.step()
                s = state.stats
                counts.append(
                    (s.last_step_bytes_sent, s.last_step_bytes_received, s.last_step_messages_sent)
                )
        out[name] = counts
        del ddp
    return out
