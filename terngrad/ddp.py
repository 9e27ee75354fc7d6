"""The DDP communication hook: ternary (or other quantized) gradients for DistributedDataParallel.

>>> ddp = torch.nn.parallel.DistributedDataParallel(model)
>>> state = terngrad.ddp.register(ddp, quantizer="terngrad", topology="sharded")
>>> ...train as usual...; state.stats.bytes_sent_per_step

See :mod:`terngrad.comm.hook` for what the hook does and :class:`HookState` for its options.
"""

from terngrad.comm.hook import HookState, Stats, Timing, register

__all__ = ["HookState", "Stats", "Timing", "register"]
