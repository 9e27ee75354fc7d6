"""The DDP communication hook: ternary (or other quantized) gradients for DistributedDataParallel.

PyTorch's convention, a ``(state, hook)`` pair; the state may be made before
``init_process_group`` (its collectives happen at first use)::

    state = terngrad.ddp.State(quantizer="terngrad", topology="sharded")
    ddp.register_comm_hook(state, terngrad.ddp.hook)

or in one line, ``state = terngrad.ddp.register(ddp, quantizer="terngrad")``. Then train as
usual and read ``state.stats.bytes_sent_per_step``; skip ``optimizer.step()`` when
``state.last_step_skipped``. The options: :class:`Options`. Lightning, accelerate and the
Hugging Face Trainer: :mod:`terngrad.integrations`.
"""

from terngrad.comm.errors import CollectiveFailed
from terngrad.comm.front.hook import State, hook, register
from terngrad.comm.rank.stats import Stats, Timing
from terngrad.comm.spec.options import Options

__all__ = ["CollectiveFailed", "Options", "State", "Stats", "Timing", "hook", "register"]
