"""Hugging Face transformers: the terngrad hook on the DDP model a ``Trainer`` trains.

>>> trainer = Trainer(model=model, args=args, train_dataset=data,
...                   callbacks=[TernGradCallback()])
>>> trainer.train()  # torchrun --nproc-per-node 2 train.py

The default (:data:`DEFAULT_METHOD`: the per-step hook, QSGD's 5 levels with a scale per 64
elements, a tied output projection quantized too) was chosen by measurement with the Trainer's
defaults — AdamW, clipping at 1.0, warm-up, cosine — on two untuned models
(docs/integrations.md, "The default, measured"): within 1% of DDP's eval loss on both at over
8x fewer bytes, where TernGrad per tensor lost 1.1-1.7% at 6.9x and local steps 9% on a
BERT-style encoder.

The Trainer wraps the model in DDP inside ``train()`` (``accelerator.prepare``) and hands its
callbacks the unwrapped model, never the Trainer or ``trainer.model_wrapped``. The callback
therefore finds the Trainer whose event it serves on the call stack (every event comes from a
Trainer method) and, at ``on_train_begin`` — after ``prepare``, before the first forward —
registers the hook on ``trainer.model_wrapped`` through
:func:`terngrad.integrations.accelerate.register`. Then, at each step:

* ``on_pre_optimizer_step``: a step the hook skipped (a NaN or Inf gradient on some rank,
  zeroed on every rank) has its gradients dropped, so ``optimizer.step()`` is a no-op on
  every rank (the learning-rate schedule still advances, as it does for every step);
* ``on_log``: ``terngrad/bytes_sent_per_step``, ``terngrad/fp32_bytes_per_step`` (what
  DDP's fp32 ring all-reduce would send), ``terngrad/compression`` (their ratio) and
  ``terngrad/skipped_steps`` join the Trainer's logs, ``trainer.state.log_history`` and every
  ``report_to`` integration (the callback moves itself to the front of the Trainer's
  callbacks, so that the reporters see what it adds).

Local steps (``TernGradCallback(local_steps=16, outer_lr=0.7, outer_momentum=0.9)``, or
``"auto"``, ``overlap=True``): at ``on_train_begin`` a :class:`terngrad.diloco.DiLoCo` is made
on the Trainer's DDP model and its optimizer (the inner one: the Trainer's AdamW with its
clipping and schedule, untouched), DDP's per-step all-reduce becomes a no-op, and
``on_step_end`` (once per optimizer step, after accumulation) counts the inner step, every
``H``-th the outer step; ``on_train_end`` lands an update still in flight. Evaluate at multiples
of ``H`` (``eval_steps``): between outer steps each rank holds its own replica; a run whose
``max_steps`` is not a multiple of ``H`` (fixed, or as ``"auto"`` chose it) ends with the
replicas apart by its last steps (:meth:`DiLoCo.finish` warns at ``on_train_end``).

A :class:`terngrad.optim.LocalVarianceAdamW` or ``FrozenVarianceAdamW`` given to the Trainer
(``optimizers=(opt, None)``) has its momentum exchanged by the per-step hook; the Trainer's
gradient clipping would rescale that momentum in ``p.grad`` as if it were a gradient, so it
is refused unless ``max_grad_norm=0``.

Checkpoints: at ``on_save`` each rank writes its terngrad state (the hook's, or the DiLoCo's)
into the checkpoint folder as ``terngrad-rank{r}.pt``; ``train(resume_from_checkpoint=...)``
loads it at ``on_train_begin`` (:mod:`terngrad.integrations.checkpoints`), so that the resumed
run continues bit for bit.


FSDP2 (``TrainingArguments(fsdp=True, fsdp_config={"fsdp_version": 2})``): ``prepare``
``fully_shard``-s the model instead, and at ``on_train_begin`` the callback puts TernGrad in
its FSDP modules' reduce-scatter (:func:`terngrad.fsdp.register`); the logs then compare with
FSDP's fp32 reduce-scatter. accelerate 1.15 runs FSDP on GPUs only: on CPU the Trainer trains
through DDP, and the callback warns and hooks that.

Loud, not silent: DeepSpeed, FSDP version 1, XLA's FSDP and loss scaling (``fp16=True``) are
refused when the Trainer is made (``on_init_end``; at ``on_train_begin`` for a callback added
later), as is a run of several processes whose model the Trainer wrapped in neither torch's DDP
nor FSDP2; one process warns and trains without the hook.
"""

from __future__ import annotations

import os
import sys
import warnings
from types import FrameType
from typing import Any

from torch import nn
from transformers import Trainer, TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

import terngrad.fsdp
from terngrad.comm.exchanges.traffic import ring_bytes
from terngrad.comm.front.hook import State
from terngrad.comm.rank.momentum import MomentumSource
from terngrad.comm.spec.methods import default_options, hook_options
from terngrad.diloco import DiLoCo
from terngrad.integrations import accelerate, checkpoints
from terngrad.integrations.common import (
    callback_local,
    drop_gradients,
    fully_sharded,
    loss_scaling_refused,
    register_sharded,
    warn_one_process,
)

__all__ = ["DEFAULT_METHOD", "TernGradCallback"]

#: what ``TernGradCallback()`` sends when given neither a quantizer nor a method: QSGD's 5
#: levels ``{-1, -1/2, 0, 1/2, 1}`` times a scale per 64 elements (the bucket's max), every
#: layer but the tensors under 1,024 elements (a tied output projection included), sharded
#: with exact sums — chosen by measurement with the Trainer's defaults on two untuned models
#: (docs/integrations.md, "The default, measured")
DEFAULT_METHOD = "qsgd-5-b64-last"


class TernGradCallback(TrainerCallback):
    """Trains a ``transformers.Trainer``'s DDP model with the terngrad hook:
    ``Trainer(..., callbacks=[TernGradCallback()])``.

    ``quantizer``, ``topology``, ``method`` and any other setting as for
    :func:`terngrad.ddp.register` (an :class:`~terngrad.ddp.Options` field or a quantizer
    option). Given neither a quantizer nor a method, the callback runs :data:`DEFAULT_METHOD`
    with the settings given in place of its own (``TernGradCallback(quantize_last=False)``);
    a ``method`` given takes settings by the rule of every consumer (one the method sets
    otherwise is refused); a ``quantizer`` given (``"terngrad"``: TernGrad as the paper has
    it) starts from :func:`terngrad.ddp.register`'s defaults instead. ``local_steps`` (an
    integer above 1 or ``"auto"``), ``outer_lr``, ``outer_momentum`` (0: plain SGD as the
    outer step, else Nesterov's), ``overlap``,
    ``max_comm_share``: local steps, as :class:`terngrad.diloco.DiLoCo` (no error feedback
    unless given). They are checked here, before any process group or collective.
    :attr:`state` is the hook's state, or the DiLoCo, once training has started
    (``state.stats`` for the bytes).
    """

    def __init__(self, quantizer: str | None = None, topology: str = "sharded", *,
                 local_steps: int | str | None = None, outer_lr: float | None = None,
                 outer_momentum: float | None = None, nesterov: bool | None = None,
                 overlap: bool | None = None, max_comm_share: float | None = None,
                 **settings: Any) -> None:  # fmt: skip
        #: DiLoCo's settings, when training with local steps (``None``: the hook every step)
        self.local = callback_local(settings, local_steps=local_steps, outer_lr=outer_lr,
                                    outer_momentum=outer_momentum, nesterov=nesterov,
                                    overlap=overlap, max_comm_share=max_comm_share)  # fmt: skip
        if quantizer is None and not {"method", "preset"} & set(settings):
            self.options = default_options(DEFAULT_METHOD, topology, **settings)
        else:
            self.options = hook_options(quantizer or "terngrad", topology, **settings)
        #: the hook's state (or the DiLoCo, or terngrad.fsdp's under FSDP2), made when training
        #: starts (``None`` before, or in one process)
        self.state: State | DiLoCo | terngrad.fsdp.State | None = None
        self._fp32_bytes = 0

    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """At ``Trainer(...)``: refuse what the callback cannot serve, before any collective;
        go first among the callbacks."""
        trainer = _calling_trainer()
        _refuse_unservable(trainer)
        self._exchanged_momentum(trainer)
        _go_first(trainer, self)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """After the Trainer wrapped the model in DDP, before its first forward: register."""
        trainer = _calling_trainer()
        _refuse_unservable(trainer)
        momentum = self._exchanged_momentum(trainer)
        _go_first(trainer, self)
        wrapped = trainer.model_wrapped
        ddp = getattr(wrapped, "_orig_mod", wrapped)  # torch.compile's wrapper around DDP
        hooks = getattr(ddp, "_comm_hooks", ())  # DDP's (hook, state) pairs
        if self.state is not None and (
            any(s is self.state for _, s in hooks)
            or isinstance(self.state, DiLoCo | terngrad.fsdp.State)
        ):
            self._load_saved(trainer)
            return  # a later train() on the same model: terngrad is on already
        world = trainer.accelerator.num_processes
        if world == 1:
            warn_one_process()
            return
        if trainer.is_fsdp_enabled and fully_sharded(ddp):  # FSDP2 (version 1 was refused)
            self.state = register_sharded(ddp, self.options, self.local)
            self._fp32_bytes = self.state.fp32_bytes_per_step
            self._load_saved(trainer)
            return
        if _fsdp_version(trainer) == 2:
            warnings.warn(
                "terngrad: TrainingArguments asks for FSDP, which accelerate runs on GPUs only; "
                "on CPU this Trainer trains through DDP, and terngrad's DDP hook serves it",
                RuntimeWarning,
                stacklevel=2,
            )
        if not isinstance(ddp, nn.parallel.DistributedDataParallel):
            raise RuntimeError(
                f"terngrad: the Trainer trains a {type(wrapped).__name__}, not torch's "
                f"DistributedDataParallel nor FSDP2 ({world} processes, distributed type "
                f"{trainer.accelerator.distributed_type}), so there is no communication hook to "
                "put terngrad on: train without tp_plan/parallelism_config/DataParallel, one "
                "process per device (torchrun or accelerate launch)"
            )
        if self.local is not None:
            optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)  # accelerate's
            self.state = DiLoCo(ddp, optimizer, options=self.options, local=self.local)
        else:
            self.state = accelerate.register(
                trainer.accelerator, wrapped, options=self.options, optimizer=momentum
            )
        numel = sum(p.numel() for p in ddp.module.parameters() if p.requires_grad)
        self._fp32_bytes = ring_bytes(4 * numel, world)
        self._load_saved(trainer)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Each rank's terngrad state into the checkpoint folder the Trainer just wrote, as
        ``terngrad-rank{r}.pt`` beside its ``rng_state_{r}.pth`` (one file per rank, written
        atomically: no collective, no rank holding the others' state, and the Trainer's
        rotation of checkpoints removes them with the folder)."""
        if self.state is None:
            return
        trainer = _calling_trainer()
        run_dir = trainer._get_output_dir(trial=getattr(trainer, "_trial", None))
        folder = os.path.join(run_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
        checkpoints.save_file(folder, checkpoints.rank_entry(self.state))

    def _load_saved(self, trainer: Trainer) -> None:
        """At ``on_train_begin`` (the Trainer has loaded its model, optimizer and schedule;
        terngrad's hook or DiLoCo is made): a ``train(resume_from_checkpoint=...)`` resumes
        terngrad's state too, each rank its own file (:mod:`terngrad.integrations.checkpoints`)."""
        path = _resumed_from()
        if path is None:
            if trainer.state.global_step:  # resumed, and the Trainer no longer says from where
                warnings.warn(
                    "terngrad: this Trainer resumes at step "
                    f"{trainer.state.global_step} from a checkpoint terngrad cannot find: "
                    "terngrad's state starts afresh",
                    RuntimeWarning,
                    stacklevel=2,
                )
            return
        entry = checkpoints.read_file(path)
        if checkpoints.agree_saved(entry, f"checkpoint {path}"):
            checkpoints.load_entry(self.state, entry)

    def _exchanged_momentum(self, trainer: Trainer) -> MomentumSource | None:
        """The Trainer's optimizer when the per-step hook is to exchange its momentum (a
        :class:`terngrad.optim.LocalVarianceAdamW` or ``FrozenVarianceAdamW``), else ``None``;
        refused with the Trainer's gradient clipping, which would rescale that momentum."""
        optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)  # accelerate's
        if self.local is not None or not isinstance(optimizer, MomentumSource):
            return None  # (inside local steps it steps on its own gradient, as AdamW)
        if trainer.args.max_grad_norm:
            raise RuntimeError(
                f"terngrad: {type(optimizer).__name__} takes the momentum the ranks exchanged "
                "from p.grad, and the Trainer's gradient clipping "
                f"(max_grad_norm={trainer.args.max_grad_norm}) would rescale it as a gradient "
                "(training diverges): give TrainingArguments(max_grad_norm=0) with it"
            )
        return optimizer

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any,
                              optimizer: Any = None, **kwargs: Any) -> None:  # fmt: skip
        """A step the hook skipped: drop its (zeroed) gradients, so the step changes nothing."""
        if self.state is not None and self.state.last_step_skipped:
            drop_gradients(optimizer)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Local steps: an inner step done (after the optimizer and the schedule); every
        ``H``-th, the outer step."""
        if isinstance(self.state, DiLoCo):
            self.state.step()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Local steps with overlap: the outer update in flight lands."""
        if isinstance(self.state, DiLoCo):
            self.state.finish()

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, float] | None = None,
               **kwargs: Any) -> None:  # fmt: skip
        """terngrad's bytes in the Trainer's logs (and in the entry ``log`` just appended to
        ``state.log_history``)."""
        if self.state is None or logs is None:
            return
        stats = self.state.stats
        sent = stats.bytes_sent_per_step
        ours = {
            "terngrad/bytes_sent_per_step": sent,
            "terngrad/fp32_bytes_per_step": float(self._fp32_bytes),
            "terngrad/compression": self._fp32_bytes / sent if sent else 0.0,
            "terngrad/skipped_steps": float(stats.skipped_steps),
        }
        logs.update(ours)
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1].update(ours)  # Trainer.log appended a copy before on_log


def _calling_trainer() -> Trainer:
    """The Trainer whose callback event is running. Callbacks are handed the unwrapped model,
    not the Trainer nor its DDP wrapper; every event is called by a Trainer method (through
    its CallbackHandler), so the Trainer is the ``self`` of a frame further up the stack."""
    return _trainer_frame().f_locals["self"]


def _resumed_from() -> str | None:
    """The checkpoint folder the running ``train()`` resumes from, if any: the
    ``resume_from_checkpoint`` of the Trainer method that fires ``on_train_begin``
    (``_inner_training_loop``, ``True`` already made the newest checkpoint's folder); the
    Trainer keeps it nowhere else."""
    path = _trainer_frame().f_locals.get("resume_from_checkpoint")
    return None if path is None else str(path)


def _trainer_frame() -> FrameType:
    """The frame of the Trainer method that called the running callback event."""
    frame = sys._getframe(1)
    while frame is not None:
        owner = frame.f_locals.get("self")
        if issubclass(type(owner), Trainer):  # type(): no proxy is asked for its __class__
            return frame
        frame = frame.f_back
    raise RuntimeError(
        "terngrad: TernGradCallback serves a transformers.Trainer and none is running here: "
        "pass it to Trainer(..., callbacks=[TernGradCallback()])"
    )


def _fsdp_version(trainer: Trainer) -> int | None:
    """The FSDP version the Trainer runs, or was asked for (None: no FSDP). accelerate 1.15
    keeps its FSDP plugin on GPUs only (``accelerate/state.py``, the distributed types it
    lists there) and trains through DDP on CPU; the arguments still say what was asked."""
    plugin = getattr(trainer.accelerator.state, "fsdp_plugin", None)
    if plugin is not None:
        return plugin.fsdp_version
    asked = getattr(trainer.args, "fsdp_plugin_args", None)
    return asked["fsdp_version"] if asked else None


def _refuse_unservable(trainer: Trainer) -> None:
    """Raise for a Trainer that reduces gradients through neither DDP nor FSDP2, or scales the
    loss. FSDP2 is served (:func:`terngrad.fsdp.register` on the model ``prepare`` sharded);
    FSDP version 1 (on CPU too, where accelerate would train through DDP), XLA's FSDP and
    DeepSpeed are refused: they reduce the gradients themselves, out of terngrad's reach."""
    version = _fsdp_version(trainer)
    for engine, used in (
        ("DeepSpeed", trainer.is_deepspeed_enabled),
        ("XLA's FSDP", trainer.is_fsdp_xla_enabled),
        ("FSDP version 1", version == 1),
    ):
        if used:
            raise RuntimeError(
                f"terngrad: this Trainer runs {engine}, which reduces the gradients itself, out "
                "of terngrad's reach: use FSDP version 2 (TrainingArguments(fsdp=True, "
                "fsdp_config={'fsdp_version': 2}), served by terngrad.fsdp), or plain DDP"
            )
    # fp16=True whether or not this device's accelerator made its GradScaler (the CPU's
    # does not): a run that is refused on a GPU is refused here too, as the docs say
    if trainer.args.fp16 or getattr(trainer.accelerator, "scaler", None) is not None:
        raise loss_scaling_refused("TrainingArguments(fp16=True)", "bf16=True or fp32")


def _go_first(trainer: Trainer, callback: TrainerCallback) -> None:
    """Put ``callback`` first among the Trainer's callbacks, so that the ``report_to``
    integrations (added before the user's callbacks) log what its ``on_log`` adds. The list
    is replaced, not changed in place: the event running now iterates over the old one."""
    handler = trainer.callback_handler
    if handler.callbacks and handler.callbacks[0] is not callback:
        handler.callbacks = [callback, *(c for c in handler.callbacks if c is not callback)]
