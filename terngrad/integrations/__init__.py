"""terngrad in the training frameworks, where a plain ``DDPStrategy(ddp_comm_hook=...)`` or
``DistributedDataParallelKwargs(comm_hook=...)`` would be dropped silently:

* :mod:`terngrad.integrations.lightning` — ``TernGradCallback`` for PyTorch Lightning 2.x;
* :mod:`terngrad.integrations.accelerate` — ``register(accelerator, model)`` after ``prepare``;
* :mod:`terngrad.integrations.transformers` — ``TernGradCallback`` for the Hugging Face Trainer.

:mod:`terngrad.integrations.common` holds what they share, and
:mod:`terngrad.integrations.checkpoints` each rank's terngrad state in the frameworks'
checkpoints.

Each module imports its framework only when used; docs/integrations.md has a complete script
for each.
"""
