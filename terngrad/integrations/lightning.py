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

FSDP2 (``ModelParallelStrategy`` with a ``configure_model`` that calls ``fully_shard``): at
``on_fit_start`` (after ``configure_model`` and the optimizers' setup, before the first
backward) the callback puts TernGrad in the FSDP modules' reduce-scatter
(:func:`terngrad.fsdp.register`); a skipped step's gradients are dropped as under DDP. Any
other strategy that does not train through torch's DDP (``FSDPStrategy``, FSDP version 1;
DeepSpeed) reduces the gradients out of terngrad's reach: the callback fails at once rather
than let it train without terngrad.

Local steps (``TernGradCallback(local_steps=16, outer_lr=0.7, outer_momentum=0.9)``, or
``"auto"``, ``overlap=True``): at ``on_fit_start`` a :class:`terngrad.diloco.DiLoCo` is made on
the strategy's DDP model and the LightningModule's optimizer (the inner one, untouched), DDP's
per-step all-reduce becomes a no-op, and ``on_train_batch_end`` counts an inner step each time
``trainer.global_step`` advances (after accumulation), every ``H``-th the outer step;
``on_train_end`` lands an update still in flight.

Checkpoints: the callback's ``state_dict`` gathers every rank's terngrad state into Lightning's
checkpoint; ``fit(..., ckpt_path=...)`` gives each rank its own back at ``on_train_start``
(:mod:`terngrad.integrations.checkpoints`), so that the resumed run continues bit for bit.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist
from torch import nn

import terngrad.fsdp
from terngrad.comm.front.ddp_model import check_registrable
from terngrad.comm.front.hook import State, hook
from terngrad.comm.spec.methods import hook_options
from terngrad.comm.spec.options import Options
from terngrad.diloco import DiLoCo
from terngrad.integrations import checkpoints
from terngrad.integrations.common import (
    callback_local,
    drop_gradients,
    fully_sharded,
    loss_scaling_refused,
    register_sharded,
    warn_one_process,
)

try:  # the unified package, or the standalone one
    from lightning.pytorch import Callback
except ImportError:  # pragma: no cover - depends on what is installed
    from pytorch_lightning import Callback


class TernGradCallback(Callback):
    """Puts the terngrad hook on ``trainer.strategy.model`` when fitting starts.

    Give the hook's settings (``quantizer``, ``topology``, any :class:`~terngrad.ddp.Options`
    field or quantizer option), or a ready ``state``; with neither, the strategy's own
    ``ddp_comm_state`` is used if it is a terngrad State (else the default settings).
    ``local_steps`` (an integer above 1 or ``"auto"``), ``outer_lr``, ``outer_momentum``,
    ``overlap``, ``max_comm_share``: local steps, as :class:`terngrad.diloco.DiLoCo` (error
    feedback on by default there).
    """

    def __init__(self, quantizer: str = "terngrad", topology: str = "sharded", *,
                 state: State | None = None, local_steps: int | str | None = None,
                 outer_lr: float | None = None, outer_momentum: float | None = None,
                 nesterov: bool | None = None, overlap: bool | None = None,
                 max_comm_share: float | None = None, **settings: Any) -> None:  # fmt: skip
        super().__init__()
        #: DiLoCo's settings, when training with local steps (``None``: the hook every step)
        self.local = callback_local(settings, local_steps=local_steps, outer_lr=outer_lr,
                                    outer_momentum=outer_momentum, nesterov=nesterov,
                                    overlap=overlap, max_comm_share=max_comm_share)  # fmt: skip
        if self.local is not None and state is not None:
            raise ValueError("local steps make their own exchange: give no state=... with them")
        defaults = not settings and (quantizer, topology) == ("terngrad", "sharded")
        if state is not None and not defaults:
            raise ValueError("give TernGradCallback either state=... or the settings, not both")
        if self.local is not None:
            defaults = False  # (DiLoCo takes the options made here)
        self._options = None if defaults else hook_options(quantizer, topology, **settings)
        #: the hook's state (bytes in ``state.stats``), or the DiLoCo with local steps, or
        #: terngrad.fsdp's under FSDP2; made when fitting starts unless given
        self.state: State | DiLoCo | terngrad.fsdp.State | None = state
        self._global_step = 0
        self._saved: dict[str, Any] | None = None  # the checkpoint's ranks' states, to load

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        strategy = trainer.strategy
        model = strategy.model
        if getattr(trainer.precision_plugin, "scaler", None) is not None:
            raise loss_scaling_refused("precision='16-mixed'", "precision='bf16-mixed' or 32")
        if fully_sharded(model):  # FSDP2: fully_shard in configure_model
            self._register_sharded(trainer, model)
            return
        own = getattr(strategy, "_ddp_comm_state", None)
        if isinstance(own, State) and own is not self.state:
            if self.state is not None or self._options is not None:
                raise ValueError(
                    "terngrad: the strategy has a terngrad State (ddp_comm_state) and the "
                    "callback was given settings too: give them in one place only"
                )
            self.state = own
        if self.state is None and self.local is None:
            self.state = State(options=self._options or Options())
        if not isinstance(model, nn.parallel.DistributedDataParallel):
            if trainer.world_size == 1:
                warn_one_process()
                return
            raise RuntimeError(
                f"terngrad: the {type(strategy).__name__} strategy does not train through "
                "torch's DistributedDataParallel, so it takes no communication hook and would "
                "train without terngrad: use strategy='ddp' (or DDPStrategy(...)), or "
                "ModelParallelStrategy with fully_shard in configure_model (FSDP2)"
            )
        if self.local is not None:
            if model._comm_hooks:
                raise ValueError(
                    "terngrad: local steps replace DDP's all-reduce with their own, and the "
                    "strategy was given a ddp_comm_hook: give the strategy no hook"
                )
            optimizer = trainer.optimizers[0]
            optimizer = getattr(optimizer, "_optimizer", optimizer)  # a LightningOptimizer
            self.state = DiLoCo(model, optimizer, options=self._options, local=self.local)
            self._global_step = trainer.global_step
            return
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

    def state_dict(self) -> dict[str, Any]:
        """Every rank's terngrad state, for Lightning's checkpoint (called on every rank, which
        ``trainer.save_checkpoint`` requires; Lightning writes rank 0's return alone): gathered
        with an object all-gather into one list, rank by rank, so that they live and die with
        the one file ModelCheckpoint names, keeps and removes."""
        if self.state is None or not _several_ranks():
            return {}
        every: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(every, checkpoints.rank_entry(self.state))
        return {"ranks": every}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Keep the checkpoint's states until training starts (:meth:`on_train_start`)."""
        self._saved = state_dict

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        """Resuming (``fit(..., ckpt_path=...)``), after Lightning restored its model,
        optimizer, schedule and loops: each rank loads its own terngrad state (a checkpoint
        made without the callback: a warning, and terngrad starts afresh)."""
        self._global_step = trainer.global_step  # (restored after on_fit_start)
        saved, self._saved = self._saved, None
        if self.state is None or trainer.ckpt_path is None or not _several_ranks():
            return
        ranks = (saved or {}).get("ranks") or []
        rank = dist.get_rank()
        entry = ranks[rank] if rank < len(ranks) else None
        if checkpoints.agree_saved(entry, f"checkpoint {trainer.ckpt_path}"):
            checkpoints.load_entry(self.state, entry)

    def _register_sharded(self, trainer: Any, model: nn.Module) -> None:
        """FSDP2: TernGrad as the reduce-scatter of the FSDP modules ``configure_model`` made
        (a later fit of the same model keeps it)."""
        if isinstance(self.state, terngrad.fsdp.State):
            return
        if self.state is not None:
            raise ValueError(
                "terngrad: state=... is the DDP hook's, and this strategy shards the model with "
                "FSDP2: give TernGradCallback the settings instead"
            )
        if trainer.world_size == 1:
            warn_one_process()
            return
        self.state = register_sharded(model, self._options, self.local)

    def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
        """Local steps: an inner step done when the optimizer stepped (``global_step`` moved:
        not on an accumulation micro-batch); every ``H``-th, the outer step."""
        if isinstance(self.state, DiLoCo) and trainer.global_step != self._global_step:
            self._global_step = trainer.global_step
            self.state.step()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        """Local steps with overlap: the outer update in flight lands."""
        if isinstance(self.state, DiLoCo):
            self.state.finish()

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        if self.state is not None and self.state.last_step_skipped:  # zeroed everywhere: no-op
            drop_gradients(optimizer)


def _several_ranks() -> bool:
    """Whether the hook is in use: a process group of more than one rank."""
    return dist.is_initialized() and dist.get_world_size() > 1
