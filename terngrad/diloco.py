"""Local steps with ternary outer gradients: DiLoCo (Douillard et al. 2023, arXiv 2311.08105)
whose outer gradients go through terngrad's exchanges.

>>> outer = terngrad.diloco.DiLoCo(model, inner_optimizer, local_steps=16)
>>> for x, y in batches:
...     loss_fn(model(x), y).backward(); inner_optimizer.step(); inner_optimizer.zero_grad()
...     outer.step()                   # every 16th call: the outer step
>>> outer.stats.bytes_sent_per_step  # per inner step, comparable to the DDP hook's

Each rank trains its own replica with its own (inner) optimizer, untouched: AdamW with its
clipping, any schedule. Every ``H = local_steps`` inner steps, the outer step (Algorithm 1 of
the paper):

1. each rank's pseudo-gradient ``Δ_r = θ_anchor − θ_r`` (what its ``H`` steps moved);
2. ``Δ = mean_r Δ_r``, through terngrad's exchange (:class:`~terngrad.comm.Synchronizer`, the
   DDP hook's reducer): TernGrad by default — scalar sharing, the sum of N ranks' codes exact,
   worker-side error feedback on each rank's residual (``error_feedback=True`` by default:
   what ternary rounding drops from ``Δ_r`` is added to the next one), the last layer and
   tensors under ``min_numel`` elements in fp32, as the hook; ``quantizer="fp32"`` is the
   uncompressed DiLoCo baseline;
3. the outer optimizer — SGD with Nesterov momentum (``outer_lr``, ``outer_momentum``,
   DiLoCo's 0.7 and 0.9) — steps the anchor along ``Δ``, the same bits on every rank;
4. every replica restarts from the anchor (bitwise equal on every rank), and buffers
   (batch-norm statistics) are replaced by their mean over the ranks.

A rank whose pseudo-gradient is not finite makes every rank skip the outer step (counted in
``stats.skipped_outer_steps``): the anchor stays, every replica restarts from it. The bytes:
TernGrad's sharded exchange moves ~3.6 bits an element at 4 ranks once every ``H`` steps,
against DDP's 48 bits every step: at ``H = 16``, ~200x fewer bytes per inner step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from terngrad.comm.agreement import differing_ranks
from terngrad.comm.options import Options
from terngrad.comm.synchronizer import Synchronizer
from terngrad.quantize import Quantizer
from terngrad.util.settings import FRACTION, POSITIVE

__all__ = ["DiLoCo", "DiLoCoStats"]

#: what a saved state is, and what it holds
STATE_FORMAT = 1
_STATE_KEYS = ("local_steps", "inner_steps", "outer_steps", "skipped_outer_steps", "anchor",
               "outer_optimizer", "exchange", "inner_optimizer")  # fmt: skip


@dataclass(frozen=True)
class DiLoCoStats:
    """What one rank's local steps did: inner and outer steps, outer steps skipped for a
    non-finite pseudo-gradient, and the bytes and messages of the outer exchanges (as the
    exchange counts them), per inner step too."""

    inner_steps: int
    outer_steps: int
    skipped_outer_steps: int
    bytes_sent: int
    bytes_received: int
    messages_sent: int

    @property
    def bytes_sent_per_step(self) -> float:
        """Bytes sent per inner step: comparable to the DDP hook's per step."""
        return self.bytes_sent / self.inner_steps if self.inner_steps else 0.0

    @property
    def skipped_steps(self) -> int:
        """The steps whose update was dropped: the outer steps skipped (as the hook's
        ``Stats.skipped_steps``, for reports that read either)."""
        return self.skipped_outer_steps


class DiLoCo:
    """Local steps on ``model`` (a module, or a DDP model whose every-step all-reduce is then
    replaced by a no-op hook) with ``inner_optimizer`` (owning every trainable parameter of
    the model, and no other), an outer step every ``local_steps`` calls of :meth:`step`.

    ``quantizer``, ``topology`` and any other keyword: the exchange of the pseudo-gradients,
    as for :func:`terngrad.ddp.register` (``error_feedback`` defaults to True here), or
    ``options``, a ready :class:`~terngrad.comm.Options`;
    ``outer_lr``, ``outer_momentum``, ``nesterov``: the outer SGD. Every rank must make it
    alike (checked, in one line naming the ranks, before any exchange). Rank 0's parameters
    and buffers are every replica's start (broadcast here, as DDP does).
    """

    def __init__(
        self,
        model: nn.Module,
        inner_optimizer: torch.optim.Optimizer,
        local_steps: int = 16,
        quantizer: str | Quantizer = "terngrad",
        topology: str = "sharded",
        *,
        outer_lr: float = 0.7,
        outer_momentum: float = 0.9,
        nesterov: bool = True,
        options: Options | None = None,
        **settings: Any,
    ) -> None:
        module = _plain_module(model)
        if isinstance(local_steps, bool) or not isinstance(local_steps, int) or local_steps < 1:
            raise ValueError(
                f"local_steps must be an integer of at least 1 (inner steps between outer "
                f"steps), got {local_steps!r}"
            )
        for name, value, rule in (("outer_lr", outer_lr, POSITIVE), ("outer_momentum",
                                  outer_momentum, FRACTION)):  # fmt: skip
            if not rule.accepts(value):
                raise ValueError(f"{name} must be {rule.words}, got {value!r}")
        if not isinstance(nesterov, bool):
            raise ValueError(f"nesterov must be True or False, got {nesterov!r}")
        if nesterov and outer_momentum == 0:
            raise ValueError("nesterov needs outer_momentum > 0 (DiLoCo's is 0.9)")
        _check_owner(module, inner_optimizer)
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError(
                "terngrad.diloco needs torch.distributed initialised: call "
                "torch.distributed.init_process_group(...) first (torchrun sets its environment)"
            )
        mine = {"local_steps": local_steps, "outer_lr": float(outer_lr),
                "outer_momentum": float(outer_momentum), "nesterov": nesterov}  # fmt: skip
        problems = differing_ranks(mine)
        if problems:
            raise ValueError(
                "terngrad.diloco: the ranks made DiLoCo with different settings (compared with "
                "rank 0) — " + " | ".join(problems)
            )
        if options is None:
            settings.setdefault("error_feedback", True)
        self.model, self.module, self.inner_optimizer = model, module, inner_optimizer
        self.local_steps = local_steps
        #: the exchange of the pseudo-gradients (rank 0's parameters broadcast when made)
        self.exchange = Synchronizer(module, quantizer, topology, options=options, **settings)
        self.params = self.exchange.params
        self._buffers = [b for b in module.buffers() if b.is_floating_point()]
        link = self.exchange.reducer.link
        for b in module.buffers():
            dist.broadcast(b, src=link._global(0), group=link.group)
        if isinstance(model, nn.parallel.DistributedDataParallel):
            model.register_comm_hook(None, _local_gradients)
        #: the outer model: where every replica restarts from
        self.anchor = [p.detach().clone() for p in self.params]
        for a in self.anchor:
            a.requires_grad_(True)
        self.outer_optimizer = torch.optim.SGD(
            self.anchor, lr=outer_lr, momentum=outer_momentum, nesterov=nesterov
        )
        self.inner_steps = self.outer_steps = self.skipped_outer_steps = 0

    @property
    def stats(self) -> DiLoCoStats:
        s = self.exchange.stats
        return DiLoCoStats(
            self.inner_steps, self.outer_steps, self.skipped_outer_steps, s.bytes_sent,
            s.bytes_received, s.messages_sent,
        )  # fmt: skip

    #: an inner step is never skipped (a non-finite replica is caught at the outer step)
    last_step_skipped = False

    @torch.no_grad()
    def step(self) -> bool:
        """Count an inner step (call it after ``inner_optimizer.step()``); every
        ``local_steps``-th, the outer step. Returns whether this was an outer step."""
        self.inner_steps += 1
        if self.inner_steps % self.local_steps:
            return False
        deltas = [a - p.detach() for a, p in zip(self.anchor, self.params, strict=True)]
        skipped = self.exchange.average(deltas)
        self.outer_steps += 1
        if skipped:
            self.skipped_outer_steps += 1
        else:
            for a, d in zip(self.anchor, deltas, strict=True):
                a.grad = d
            self.outer_optimizer.step()
        for p, a in zip(self.params, self.anchor, strict=True):
            p.copy_(a)
        self._average_buffers()
        return True

    def _average_buffers(self) -> None:
        """Every floating-point buffer replaced by its mean over the ranks (fp32 all-reduce,
        in the buffer's dtype); integer buffers (batch counts) are left as they are."""
        if not self._buffers:
            return
        link = self.exchange.reducer.link  # counted with the exchange's bytes
        flat = torch.cat([b.reshape(-1).to(torch.float32) for b in self._buffers])
        link.all_reduce(flat)
        flat /= link.size
        for b, part in zip(self._buffers, flat.split([b.numel() for b in self._buffers]),
                           strict=True):  # fmt: skip
            b.copy_(part.view_as(b))

    # --- checkpoints

    def state_dict(self) -> dict[str, Any]:
        """This rank's state: the anchor, the outer optimizer, the step counts, the
        exchange's (generator, error-feedback residuals, counters) and this rank's inner
        optimizer (each rank's own moments: a checkpoint that keeps rank 0's optimizer alone
        would give every rank rank 0's). Save one per rank."""
        return {
            "format": STATE_FORMAT,
            "local_steps": self.local_steps,
            "inner_steps": self.inner_steps,
            "outer_steps": self.outer_steps,
            "skipped_outer_steps": self.skipped_outer_steps,
            "anchor": [a.detach().clone() for a in self.anchor],
            "outer_optimizer": self.outer_optimizer.state_dict(),
            "exchange": self.exchange.state_dict(),
            "inner_optimizer": self.inner_optimizer.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` of the same rank and settings; ``ValueError`` with one
        line naming what does not fit."""
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise ValueError("not a terngrad.diloco state (or one of another format version)")
        missing = [k for k in _STATE_KEYS if k not in state]
        if missing:
            raise ValueError(f"this terngrad.diloco state lacks {', '.join(missing)}")
        if state["local_steps"] != self.local_steps:
            raise ValueError(
                f"this terngrad.diloco state was saved with local_steps={state['local_steps']}, "
                f"not {self.local_steps}"
            )
        anchor = state["anchor"]
        shapes = [tuple(a.shape) for a in self.anchor]
        if (
            not isinstance(anchor, list)
            or [tuple(getattr(a, "shape", ())) for a in anchor] != shapes
        ):
            raise ValueError(
                "this terngrad.diloco state's anchor does not fit the model's parameters"
            )
        self.exchange.load_state_dict(state["exchange"])
        self.outer_optimizer.load_state_dict(state["outer_optimizer"])
        self.inner_optimizer.load_state_dict(state["inner_optimizer"])
        with torch.no_grad():
            for a, saved in zip(self.anchor, anchor, strict=True):
                a.copy_(saved)
        self.inner_steps = int(state["inner_steps"])
        self.outer_steps = int(state["outer_steps"])
        self.skipped_outer_steps = int(state["skipped_outer_steps"])


def _local_gradients(_, bucket):  # DDP checks real annotations; these would be strings
    """A DDP communication hook that averages nothing: each replica keeps its own gradient
    (its inner steps are local)."""
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future


def _plain_module(model: nn.Module) -> nn.Module:
    """The module whose parameters DiLoCo steps; one line for what it cannot serve."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"DiLoCo trains an nn.Module, got {type(model).__name__}")
    if isinstance(model, nn.parallel.DistributedDataParallel):
        hooks = getattr(model, "_comm_hooks", [])
        if hooks:
            raise ValueError(
                "this DDP model already has a communication hook (a terngrad hook?): DiLoCo "
                "replaces DDP's all-reduce with its own, so give it a DDP model without one, "
                "or the plain module"
            )
        return model.module
    if any(type(m).__name__.startswith("FSDP") for m in model.modules()):
        raise ValueError(
            "DiLoCo does not serve FSDP models: its outer step needs each rank's whole replica"
        )
    return model


def _check_owner(module: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """The inner optimizer must step exactly the model's trainable parameters."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(
            f"inner_optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}"
        )
    owned = {id(p) for g in optimizer.param_groups for p in g["params"]}
    trainable = {id(p) for p in module.parameters() if p.requires_grad}
    if owned != trainable:
        raise ValueError(
            f"the inner optimizer must own the model's trainable parameters, and only those: "
            f"{len(trainable - owned)} of the model's are not in it, {len(owned - trainable)} of "
            "its are not the model's"
        )
