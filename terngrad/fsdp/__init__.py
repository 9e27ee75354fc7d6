"""TernGrad as FSDP2's reduce-scatter: compressed gradients in sharded training.

``fully_shard`` (FSDP2) averages each parameter group's gradients with a reduce-scatter: every
rank hands in the group's flat, padded gradient of ``N * S`` elements and gets back its own
shard of ``S``. :func:`register` puts TernGrad there, through PyTorch's public setter
``FSDPModule.set_custom_reduce_scatter``, on every FSDP module of a model::

    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    state = terngrad.fsdp.register(model, quantizer="terngrad")
    ...  # train as usual; state.stats.bytes_sent_per_step, state.last_step_skipped

Each reduce-scatter (:func:`~terngrad.comm.exchanges.reduce_scatter.grid_reduce_scatter`): the
scales of every bucket shared by an all-reduce MAX (the paper's scalar sharing), the codes exchanged
all-to-all (1.6 bits an element), summed exactly as integers by each shard's owner, and decoded
into the mean — FSDP's own all-gather of the parameters does the rest, so the sharded exchange's
second half is not needed. Scales are per parameter (the flat buffer's layout is known: each
rank's chunk holds every parameter's padded shard in turn), and per bucket of ``bucket_size``
elements inside it where the quantizer has one. As in DDP, the last layer (unless
``quantize_last``) and tensors under ``min_numel`` elements travel in full precision: their
spans of the buffer go through a plain reduce-scatter in the reduce dtype. Every rank's shard
of a quantized gradient is the same function of all ranks' gradients, so the replicas' full
parameters, all-gathered from the shards, stay consistent.

Honoured: the mixed-precision policy's reduce dtype (fp32, bf16: quantized from float32, the
shard written back in the reduce dtype), uneven and padded shards, error feedback
(``error_feedback=True``), a full-precision warm-up (``full_precision_steps``), ``seed`` and
``timeout``. Refused at :func:`register`, in one line and before any collective: a model that is
not ``fully_shard``-ed, a quantizer that cannot sum exactly in the sharded layout (only the
shared-grid ones can: ``terngrad``, ``qsgd``), another topology, the auto policy or
``fuse_buckets`` (the DDP hook's), HSDP or
several meshes, a second registration. A gradient divide factor other than FSDP's default fails
at the first reduce-scatter.

A NaN or Inf in some rank's gradient is seen by every rank (it travels with the shared scales):
that group's shard is zeroed on every rank and ``state.last_step_skipped`` is True — skip
``optimizer.step()`` then, as with the DDP hook.

FSDP2's internals read at :func:`register` (torch 2.13): the module's parameter groups, their
parameters' padded shard sizes and the mesh; the reduce-scatter itself goes through the public
``ReduceScatter`` interface.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from terngrad.comm.rank.rank_state import resolve_timeout, twin_group
from terngrad.comm.spec.methods import hook_options
from terngrad.comm.spec.options import Options
from terngrad.fsdp.groups import REGISTERED, fsdp_api, fsdp_groups
from terngrad.fsdp.state import State

# the public classes' home is this package (their reprs and pickles name it)
State.__module__ = __name__

__all__ = ["State", "register"]


def _reduce_scatter_class():
    _, ReduceScatter = fsdp_api()

    class TernGradReduceScatter(ReduceScatter):
        """The reduce-scatter of one FSDP parameter group, through :class:`State`."""

        def __init__(self, state: State, index: int) -> None:
            self.state, self.index = state, index

        def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
            return torch.empty(*size, dtype=dtype, device=device)

        def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
            self.state.reduce_scatter(self.index, output_tensor, input_tensor, op)
            return None

    return TernGradReduceScatter


def register(model: nn.Module, quantizer: str | Options = "terngrad", **options: Any) -> State:
    """Put TernGrad's reduce-scatter on every FSDP module of ``model`` (``fully_shard`` first,
    ``torch.distributed`` initialised); returns the :class:`State`. ``quantizer`` and
    ``options``: as :class:`terngrad.ddp.Options` (``bucket_size=512`` among the quantizer's
    options, ``error_feedback``, ``quantize_last``, ``min_numel``, ``full_precision_steps``,
    ``seed``, ``timeout``). Every rank must call it alike (it checks, with a collective)."""
    opts = quantizer if isinstance(quantizer, Options) else hook_options(quantizer, **options)
    if isinstance(quantizer, Options) and options:
        raise TypeError("give either an Options object or keyword options, not both")
    groups, process_group = fsdp_groups(model, opts)
    if not dist.is_initialized():
        raise RuntimeError(
            "terngrad.fsdp needs torch.distributed initialised: call "
            "torch.distributed.init_process_group(...) before fully_shard and register"
        )
    opts = resolve_timeout(opts)  # unset: the default group's (said in state.options)
    state = State(opts, model, groups, twin_group(process_group, opts.timeout))
    comm = _reduce_scatter_class()
    for module, group in groups:
        module.set_custom_reduce_scatter(comm(state, group.index))
    setattr(model, REGISTERED, state)
    return state
