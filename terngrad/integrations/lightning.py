"""PyTorch Lightning: the terngrad hook on the DDP model, on CPU and GPU alike.

>>> trainer = lightning.pytorch.Trainer(strategy="ddp", devices=2,
...                                     callbacks=[TernGradCallback(quantizer="terngrad")])

Lightning registers ``DDPStrategy(ddp_comm_hook=...)`` on CUDA devices only and ignores it on
CPU, silently. The callback registers the hook itself when training starts (``on_fit_start``,
after the strategy wrapped the model in DDP), or takes over a terngrad pair the strategy already
registered. Under automatic optimization backward runs inside ``optimizer.step(closure)``, so
``if not state.last_step_skipped: optimizer.step()`` cannot be written; the callback drops the
gradients of a skipped step instead (``on_before_optimizer_step``: parameters without a
gradient are left alone by every torch optimizer: no update, no momentum, no weight decay).
A strategy that does not train through torch's DDP (FSDP, DeepSpeed) takes no communication
hook: the callback fails at once rather than let it train without terngrad.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from terngrad.comm.hook import State, check_registrable, hook
from terngrad.comm.methods import hook_options
from terngrad.comm.options import Options
from terngrad.integrations.common import drop_gradients, loss_scaling_refused, warn_one_process

try:  # the unified package, or the standalone one
    from lightning.pytorch import Callback
except ImportError:  # pragma: no cover - depends on what is installed
    from pytorch_lightning import Callback


class TernGradCallback(Callback):
    """Puts the terngrad hook on ``trainer.strategy.model`` when fitting starts.

    Give the hook's settings (``quantizer``, ``topology``, any :class:`~terngrad.ddp.Options`
    field or quantizer option), or a ready ``state``; with neither, the strategy's own
    ``ddp_comm_state`` is used if it is a terngrad State (else the default settings).
    """

    def __init__(self, quantizer: str = "terngrad", topology: str = "sharded", *,
                 state: State | None = None, **settings: Any) -> None:  # fmt: skip
        super().__init__()
        defaults = not settings and (quantizer, topology) == ("terngrad", "sharded")
        if state is not None and not defaults:
            raise ValueError("give TernGradCallback either state=... or the settings, not both")
        self._options = None if defaults else hook_options(quantizer, topology, **settings)
        #: the hook's state (bytes in ``state.stats``); made when fitting starts unless given
        self.state = state

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        strategy = trainer.strategy
        model = strategy.model
        own = getattr(strategy, "_ddp_comm_state", None)
        if isinstance(own, State) and own is not self.state:
            if self.state is not None or self._options is not None:
                raise ValueError(
                    "terngrad: the strategy has a terngrad State (ddp_comm_state) and the "
                    "callback was given settings too: give them in one place only"
                )
            self.state = own
        if self.state is None:
            self.state = State(options=self._options or Options())
        if getattr(trainer.precision_plugin, "scaler", None) is not None:
            raise loss_scaling_refused("precision='16-mixed'", "precision='bf16-mixed' or 32")
        if not isinstance(model, nn.parallel.DistributedDataParallel):
            if trainer.world_size == 1:
                warn_one_process()
                return
            raise RuntimeError(
                f"terngrad: the {type(strategy).__name__} strategy does not train through "
                "torch's DistributedDataParallel, so it takes no communication hook and would "
                "train without terngrad: use strategy='ddp' (or DDPStrategy(...))"
            )
        if any(s is self.state for _, s in model._comm_hooks):
            self.state.bind(model)  # the strategy registered this pair (CUDA): keep it
            return
        if getattr(strategy, "_ddp_comm_hook", None) not in (None, hook) and not model._comm_hooks:
            raise RuntimeError(
                "terngrad: the strategy was given another ddp_comm_hook, which Lightning ignores "
                "on CPU; give the strategy no hook and let TernGradCallback put terngrad's on"
            )
        check_registrable(model)
        self.state.bind(model)
        self.state.build()
        model.register_comm_hook(self.state, hook)

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        if self.state is not None and self.state.last_step_skipped:  # zeroed everywhere: no-op
            drop_gradients(optimizer)
