"""The terngrad exchange for training loops without DDP.

>>> sync = Synchronizer(model, quantizer="terngrad", topology="sharded")
>>> loss.backward(); skipped = sync.step(); optimizer.step()

``Synchronizer`` broadcasts rank 0's parameters when it is made (parameter localization:
identical replicas from the start), and ``step()`` averages every parameter's ``.grad`` over
the ranks with the same :class:`~terngrad.comm.rank.reducer.Reducer` as the DDP hook, in buckets of
``bucket_cap_mb``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from terngrad.comm.errors import explain
from terngrad.comm.rank.plans import last_layer_names
from terngrad.comm.rank.reducer import Reducer
from terngrad.comm.rank.stats import Stats, Timing
from terngrad.comm.spec.methods import hook_options
from terngrad.comm.spec.options import Options
from terngrad.quantize import Quantizer


class Synchronizer:
    """Averages ``.grad`` of ``params`` over all ranks through quantized messages.

    ``params``: an ``nn.Module`` (its last layer is the one kept in full precision unless
    ``quantize_last``) or an iterable of parameters or ``(name, parameter)`` pairs (then the
    last tensor is the last layer, unless ``last_layer`` names it). Other settings as for
    :func:`terngrad.ddp.register`, or ``options``, a ready :class:`~terngrad.comm.Options`.
    """

    #: bytes this rank sent to the other ranks of its node (:class:`~terngrad.comm.front.nodes.
    #: NodeExchange`); a flat exchange has no node
    node_bytes_sent = 0

    def __init__(
        self,
        params: nn.Module | Iterable[nn.Parameter] | Iterable[tuple[str, nn.Parameter]],
        quantizer: str | Quantizer = "terngrad",
        topology: str = "sharded",
        *,
        bucket_cap_mb: float = 25.0,
        options: Options | None = None,
        last_layer: Iterable[str] | None = None,
        **settings: Any,
    ) -> None:
        if isinstance(params, nn.Module):
            named, last = list(params.named_parameters()), last_layer_names(params)
        else:
            items = list(params)
            named = [x if isinstance(x, tuple) else (str(i), x) for i, x in enumerate(items)]
            last = {named[-1][0]} if named else set()
        if last_layer is not None:
            last = set(last_layer)
        if not bucket_cap_mb > 0:
            raise ValueError(f"bucket_cap_mb must be positive, got {bucket_cap_mb!r}")
        extra = {k: settings.pop(k) for k in ("estimate", "group") if k in settings}
        if options is not None and (settings or quantizer != "terngrad" or topology != "sharded"):
            raise ValueError("give either options=Options(...) or the settings, not both")
        options = options or hook_options(quantizer, topology, **settings)
        if options.fuse_buckets:
            raise ValueError(
                "fuse_buckets is the DDP hook's: the Synchronizer exchanges its buckets of "
                "bucket_cap_mb, so raise bucket_cap_mb for fewer exchanges a step"
            )
        self.reducer = Reducer(options, named, last, **extra)
        self.params = [p for _, p in named if p.requires_grad]
        self.from_first(p.data for p in self.params)  # identical replicas, as DDP makes them
        self.buckets: list[list[nn.Parameter]] = []
        cap, size = bucket_cap_mb * 2**20, float("inf")
        for p in self.params:
            nbytes = p.numel() * p.element_size()
            if size + nbytes > cap:
                self.buckets.append([])
                size = 0
            self.buckets[-1].append(p)
            size += nbytes

    @property
    def stats(self) -> Stats:
        return self.reducer.stats

    @property
    def timing(self) -> Timing:
        return self.reducer.timing

    def step(self) -> bool:
        """Average the gradients (a missing ``.grad`` counts as zeros). Returns True if some
        rank's gradient was not finite: then every gradient is zero on every rank, and the
        caller should skip ``optimizer.step()``."""
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        return self.average([p.grad for p in self.params])

    def average(self, tensors: list[torch.Tensor], warn: bool = True) -> bool:
        """Average ``tensors`` (one per parameter, in :attr:`params` order, each of its shape)
        over the ranks, in place, as one step of the exchange: the gradients for :meth:`step`,
        the pseudo-gradients of an outer step (:class:`terngrad.diloco.DiLoCo`). Returns True
        if some rank's values were not finite: then every tensor is zero on every rank. A
        collective that times out or loses its peer raises
        :class:`~terngrad.comm.errors.CollectiveFailed` in one line, as the hook's does.
        ``warn=False``: no warning of a skipped step (the caller says it in its own terms)."""
        start = 0
        try:
            for bucket in self.buckets:
                mine = tensors[start : start + len(bucket)]
                start += len(bucket)
                flat = torch.cat([t.reshape(-1) for t in mine])
                self.reducer.reduce_bucket(flat, bucket)
                for t, part in zip(mine, flat.split([t.numel() for t in mine]), strict=True):
                    t.copy_(part.view_as(t))
        except BaseException as exc:
            self.reducer.abandon_step()
            failed = explain(exc, self.reducer.link.rank, self.reducer.timeout)
            if failed is exc:
                raise
            raise failed from exc
        self.reducer.finish_step(warn)
        if self.reducer.last_step_skipped:  # a later bucket found it: zero the earlier ones too
            for t in tensors:
                t.zero_()
        return self.reducer.last_step_skipped

    def from_first(self, tensors: Iterable[torch.Tensor]) -> None:
        """Every rank's ``tensors`` replaced by rank 0's, in place (not counted: the start)."""
        link = self.reducer.link
        for t in tensors:
            dist.broadcast(t, src=link._global(0), group=link.group)

    def average_floats(self, tensors: list[torch.Tensor]) -> None:
        """Each tensor replaced by its mean over the ranks, in place: one fp32 all-reduce, in
        each tensor's dtype after (floating-point buffers: batch-norm statistics), counted with
        the exchange's bytes."""
        if not tensors:
            return
        link = self.reducer.link
        flat = torch.cat([t.reshape(-1).to(torch.float32) for t in tensors])
        link.all_reduce(flat)
        flat /= link.size
        for t, part in zip(tensors, flat.split([t.numel() for t in tensors]), strict=True):
            t.copy_(part.view_as(t))

    def agree_max(self, values: torch.Tensor) -> torch.Tensor:
        """``values`` replaced by their maximum over every rank of the run, in place."""
        dist.all_reduce(values, op=dist.ReduceOp.MAX, group=self.reducer.link.group)
        return values

    def state_dict(self) -> dict[str, Any]:
        return self.reducer.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.reducer.load_state_dict(state)
