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

import importlib
from types import ModuleType

#: reached as ``terngrad.integrations.transformers`` after ``import terngrad``; each imported
#: (with its framework) at first use
LAZY = ("accelerate", "checkpoints", "common", "lightning", "transformers")


def __getattr__(name: str) -> ModuleType:
    if name in LAZY:
        return importlib.import_module(f"terngrad.integrations.{name}")
    raise AttributeError(f"module 'terngrad.integrations' has no attribute {name!r}")
