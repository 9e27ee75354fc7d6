"""Hugging Face accelerate: the terngrad hook on the model ``prepare`` wrapped in DDP.

>>> model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
>>> state = terngrad.integrations.accelerate.register(accelerator, model, quantizer="terngrad")
>>> for x, y in loader:
...     with accelerator.accumulate(model):
...         accelerator.backward(loss_fn(model(x), y))
...         if not state.last_step_skipped:
...             optimizer.step()
...         optimizer.zero_grad()

accelerate's ``DistributedDataParallelKwargs(comm_hook=...)`` takes only its own enum of
PyTorch hooks and ignores anything else, silently; :func:`register` refuses such a handler.
Gradient accumulation works as with plain DDP: ``accumulate`` runs the micro-batches under
``no_sync``, so the hook exchanges once per optimizer step, the accumulated gradient.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from terngrad.comm.front.hook import State
from terngrad.comm.front.hook import register as register_ddp


def register(accelerator: Any, model: nn.Module, quantizer: str = "terngrad",
             topology: str = "sharded", **settings: Any) -> State:  # fmt: skip
    """Install the terngrad hook on ``model`` (what ``accelerator.prepare`` returned) and
    return its state; settings as for :func:`terngrad.ddp.register`."""
    from accelerate.utils import DDPCommunicationHookType

    handler = getattr(accelerator, "ddp_handler", None)
    asked = getattr(handler, "comm_hook", DDPCommunicationHookType.NO)
    if not isinstance(asked, DDPCommunicationHookType):
        raise ValueError(
            f"accelerate ignores DistributedDataParallelKwargs(comm_hook={asked!r}): it takes "
            "only its own DDPCommunicationHookType; leave comm_hook out and call "
            "terngrad.integrations.accelerate.register(accelerator, model) after prepare"
        )
    model = getattr(model, "_orig_mod", model)  # torch.compile's wrapper around the DDP model
    if not isinstance(model, nn.parallel.DistributedDataParallel):
        raise TypeError(
            f"terngrad's hook goes on the DDP model accelerator.prepare returns; got "
            f"{type(model).__name__} ({accelerator.num_processes} process(es), distributed type "
            f"{accelerator.distributed_type}): prepare the model first, and launch more than "
            "one process (accelerate launch or torchrun)"
        )
    return register_ddp(model, quantizer, topology, **settings)
